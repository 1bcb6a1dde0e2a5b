"""Recomputation policies (``fxcost.sim.strategy.RECOMPUTE``): what a layer keeps and runs again under
Megatron-LM's selective recomputation and torchtitan's per-op policy, against hand counts on a small
GPT whose tensors are few and known."""

from __future__ import annotations

import pytest

import fxcost
from fxcost import zoo
from fxcost.estimator import default_estimator
from fxcost.gpus import get_device
from fxcost.sim import Strategy, simulate
from fxcost.sim.analytic import Pieces, estimate
from fxcost.sim.cluster import Cluster
from fxcost.sim.plan import Comm, Plan, compile_plan
from fxcost.sim.recompute import core_attention, rerun_collectives

B, T, D, H, LAYERS, VOCAB = 4, 32, 64, 4, 2, 256
FP32 = 4
SCORES = B * H * T * T * FP32  # QK^T, its scaling, the causal mask and the softmax each write these
CONTEXT = B * H * T * (D // H) * FP32  # the product with V
MASK = 2 * T * T  # the causal mask built (ones, triu: bool)
QKV, FC1 = B * T * 3 * D * FP32, B * T * 4 * D * FP32  # the first and third linear of a block
INPUT = B * T * D * FP32  # a block's input


@pytest.fixture(scope="module")
def gpt() -> tuple[object, tuple[object, ...]]:
    return zoo.build("gpt2", B, seq=T, dim=D, heads=H, layers=LAYERS, vocab=VOCAB)


def _plan(gpt: tuple[object, tuple[object, ...]], strategy: str) -> Plan:
    model, inputs = gpt
    captured = default_estimator().capture(model, inputs, batch_size=B)
    params = fxcost.sim.simulator._params_by_module(model)
    return compile_plan(captured, params, Strategy.parse(strategy), get_device("A100-SXM4-40GB"), B)


def _layer_bytes(plan: Plan) -> float:
    """The bytes one block's forward writes (the blocks are alike)."""
    return sum(seg.saved_bytes for seg in plan.stages[0].forward if seg.layer == "blocks.0")


def test_selective_reruns_the_core_attention_and_keeps_the_rest(
    gpt: tuple[object, tuple[object, ...]],
) -> None:
    plain, selective = (_plan(gpt, s).stages[0] for s in ("dp=1", "recompute=selective"))
    core = 4 * SCORES + CONTEXT + MASK
    assert selective.recompute_bytes == core
    assert plain.activation_bytes - selective.activation_bytes == LAYERS * core
    layers = [seg for seg in selective.forward if seg.layer]
    assert len(layers) == LAYERS and all(0 < seg.rerun_ms["selective"] < seg.compute_ms for seg in layers)


def test_the_core_attention_is_found_where_the_sequence_is_as_long_as_the_width() -> None:
    model, inputs = zoo.build("gpt2", B, seq=D, dim=D, heads=H, layers=1, vocab=VOCAB)
    captured = default_estimator().capture(model, inputs, batch_size=B)
    core = [n for n in captured.report.nodes if (n.graph, n.name) in core_attention(captured.report.nodes)]
    scores, context = B * H * D * D * FP32, B * H * D * (D // H) * FP32
    assert sum(n.bytes_written or 0 for n in core) == 4 * scores + context + 2 * D * D
    assert {n.module for n in core} == {"blocks.0.attn"}  # no norm, residual or MLP tensor of [B, T, D]


def test_ops_keeps_every_other_linear_and_the_input(gpt: tuple[object, tuple[object, ...]]) -> None:
    plan = _plan(gpt, "recompute=ops")
    plain, ops = _plan(gpt, "dp=1").stages[0], plan.stages[0]
    outside = plain.activation_bytes - LAYERS * _layer_bytes(plan)
    # qkv and fc1 (the first and third of qkv, proj, fc1, fc2) kept, and the block's input
    assert ops.activation_bytes == outside + LAYERS * (QKV + FC1 + INPUT)
    assert ops.recompute_bytes == _layer_bytes(plan) - QKV - FC1


def test_each_policy_trades_memory_for_time(gpt: tuple[object, tuple[object, ...]]) -> None:
    model, inputs = gpt
    policies = ("none", "selective", "ops", "full")
    results = {p: simulate(model, f"mb=2,recompute={p}", "A100-SXM4-40GB", example_inputs=inputs, batch=2 * B)
               for p in policies}  # fmt: skip
    times = [results[p].iteration_ms for p in policies]
    kept = [results[p].memory[0].activations for p in policies]
    assert times == sorted(times) and len(set(times)) == 4
    assert kept == sorted(kept, reverse=True) and len(set(kept)) == 4
    # One stage, no collectives: each micro-batch's backward runs the rerun forward ops once more.
    forward = _plan(gpt, "recompute=selective").stages[0].forward
    rerun = sum(seg.rerun_ms.get("selective", 0.0) for seg in forward)
    assert times[1] - times[0] == pytest.approx(2 * rerun, rel=1e-9)


def test_the_analytic_pass_prices_partial_recompute_as_the_simulator(
    gpt: tuple[object, tuple[object, ...]],
) -> None:
    model, inputs = gpt
    pieces = Pieces.of(_plan(gpt, "dp=1"), fxcost.sim.simulator._params_by_module(model))
    cluster = Cluster.parse("A100-SXM4-40GB")
    for policy in ("none", "selective", "ops", "full"):
        s = Strategy(recompute=policy)
        fast = estimate(pieces, s, LAYERS, cluster)
        exact = simulate(model, s, cluster, example_inputs=inputs, batch=B)
        assert fast.memory_gib * 2**30 == pytest.approx(exact.memory[0].total, rel=1e-9), policy
        assert fast.iteration_ms == pytest.approx(exact.iteration_ms, rel=0.02), policy


def test_recompute_spellings() -> None:
    assert Strategy(recompute=True).recompute == "full" and Strategy().recompute == "none"
    for spec, policy in (("recompute=1", "full"), ("rc=selective", "selective"), ("recompute=ops", "ops")):
        s = Strategy.parse(spec)
        assert s.recompute == policy and Strategy.parse(str(s)) == s
    s = Strategy.from_dict({"modules": {"blocks.0": {"recompute": "selective"}}})
    assert (s.recompute_of("blocks.0.attn"), s.recompute_of("blocks.1"), s.recompute_of("")) == (
        "selective", "none", "none",
    )  # fmt: skip
    assert Strategy(modules={"blocks.0": {"recompute": True}}) == Strategy(
        modules={"blocks.0": {"recompute": "full"}}
    )
    with pytest.raises(ValueError, match="recompute must be one of"):
        Strategy(recompute=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="recompute must be one of none, selective, ops, full"):
        Strategy.parse("recompute=attention")
    with pytest.raises(ValueError, match=r"module 'blocks\.0': recompute must be one of"):
        Strategy(modules={"blocks.0": {"recompute": "some"}})


def _count(result: fxcost.sim.SimResult, kind: str) -> int:
    return sum(t.name == f"{kind} tp" for t in result.tasks)


@pytest.mark.parametrize("sp", [1, 0])
def test_ops_reruns_the_tensor_parallel_collectives_it_does_not_save(
    gpt: tuple[object, tuple[object, ...]], sp: int
) -> None:
    """torchtitan's per-op policy saves the reduce-scatters' outputs, not the all-gathers' or all-reduces'.
    With sequence parallelism each linear a gather feeds (qkv, fc1) needs the whole sequence again for
    its weight's gradient: the gathers run again. Without, the attention's all-reduce feeds the MLP's
    norm, which runs again: it runs again too; the MLP's, the layer's last, is not needed. Megatron's
    selective recomputation reruns none (its core attention runs between them); full reruns all."""
    model, inputs = gpt
    cluster = Cluster.parse("2xA100-SXM4-40GB")
    pieces = Pieces.of(_plan(gpt, f"tp=2,sp={sp}"), fxcost.sim.simulator._params_by_module(model))
    counts = {}
    for policy in ("none", "selective", "ops", "full"):
        s = Strategy.parse(f"tp=2,sp={sp},recompute={policy}")
        result = simulate(model, s, cluster, example_inputs=inputs, batch=B)
        fast = estimate(pieces, s, LAYERS, cluster)
        assert fast.iteration_ms == pytest.approx(result.iteration_ms, rel=1e-9), policy
        counts[policy] = {k: _count(result, k) for k in ("all_gather", "reduce_scatter", "all_reduce")}
    assert counts["selective"] == counts["none"]
    rerun = {k: counts["ops"][k] - counts["none"][k] for k in counts["none"]}
    whole = {k: counts["full"][k] - counts["none"][k] for k in counts["none"]}
    if sp:  # one gather before qkv, one before fc1; the scatters' outputs kept
        assert rerun == {"all_gather": 2 * LAYERS, "reduce_scatter": 0, "all_reduce": 0}
        assert whole == {"all_gather": 2 * LAYERS, "reduce_scatter": 2 * LAYERS, "all_reduce": 0}
    else:  # the attention's all-reduce; full reruns the MLP's too
        assert rerun == {"all_gather": 0, "reduce_scatter": 0, "all_reduce": LAYERS}
        assert whole == {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 2 * LAYERS}


def test_rerun_collectives_by_policy() -> None:
    gather, scatter, reduce = (
        Comm(kind, 1024, "tp", "feature") for kind in ("all_gather", "reduce_scatter", "all_reduce")
    )
    experts, ring = Comm("all_to_all", 1024, "ep", "feature"), Comm("send_recv", 1024, "cp", "feature")
    sequence_parallel = [gather, scatter, experts, gather, scatter, ring]
    plain = [reduce, experts, reduce]
    assert rerun_collectives("full", sequence_parallel) == sequence_parallel
    assert rerun_collectives("ops", sequence_parallel) == [gather, gather]
    assert rerun_collectives("ops", plain) == [reduce]  # not the layer's last reduction
    assert rerun_collectives("selective", plain) == rerun_collectives("none", plain) == []
