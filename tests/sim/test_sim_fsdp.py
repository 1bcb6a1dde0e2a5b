"""ZeRO 2 and 3, FSDP and HSDP: the collectives of each layer (kinds, groups, bytes), prefetching, memory."""

from __future__ import annotations

from typing import Any

import pytest

from fxcost import zoo
from fxcost.estimator import Captured, default_estimator
from fxcost.sim import Cluster, Strategy, simulate
from fxcost.sim.analytic import Pieces, estimate
from fxcost.sim.engine import GAMMA, simulate_tasks
from fxcost.sim.nccl import collective_ms
from fxcost.sim.plan import Comm, Plan, Segment, StagePlan, compile_plan
from fxcost.sim.simulator import _params_by_module, _tasks

LAYERS, DIM, SEQ, VOCAB, BATCH = 2, 64, 16, 256, 8
FP32 = 4


@pytest.fixture(scope="module")
def gpt() -> tuple[Any, Captured, dict[str, int]]:
    model, inputs = zoo.build("gpt2", BATCH, seq=SEQ, dim=DIM, heads=4, layers=LAYERS, vocab=VOCAB)
    captured = default_estimator().capture(model, inputs, batch_size=2)  # one rank's micro-batch below
    return model, captured, _params_by_module(model)


def _sizes(model: Any) -> tuple[int, int]:
    """Parameters of one block (qkv, projection, two MLP linears with biases, two norms) and of the rest
    (token and position tables, the final norm; the head is tied to the token table)."""
    layer = 3 * DIM * DIM + 3 * DIM + DIM * DIM + DIM + 2 * 4 * DIM * DIM + 4 * DIM + DIM + 2 * 2 * DIM
    outer = VOCAB * DIM + model.pos.num_embeddings * DIM + 2 * DIM
    return layer, outer


def test_the_strategy_takes_hsdp_shard_groups_with_zero_3_only() -> None:
    s = Strategy.parse("dp=8,zero=3,shard=4")
    assert s.shard == 4 and str(s) == "dp=8,tp=1,pp=1,mb=1,zero=3,shard=4" and Strategy.parse(str(s)) == s
    for spec in ("dp=8,zero=2,shard=4", "dp=8,zero=3,shard=3"):
        with pytest.raises(ValueError, match=r"shard=\d \(HSDP\) needs zero=3 and a divisor of dp=8"):
            Strategy.parse(spec)


def test_zero_3_gathers_each_layer_before_every_forward_and_backward_and_reduce_scatters_each_backward(
    gpt: tuple[Any, Captured, dict[str, int]],
) -> None:
    model, captured, params = gpt
    layer, outer = _sizes(model)
    assert sum(params.values()) == LAYERS * layer + outer
    mb = 2
    result = simulate(captured, f"dp=2,mb={mb},zero=3", "2xA100-SXM4-80GB", params=params, batch=BATCH)
    assert dict(result.collectives) == {
        ("all_gather", "dp", layer * FP32): 2 * mb * LAYERS,  # forward and backward, every micro-batch
        ("all_gather", "dp", outer * FP32): 2 * mb,
        ("reduce_scatter", "dp", layer * FP32): mb * LAYERS,  # sharded gradients: every micro-batch
        ("reduce_scatter", "dp", outer * FP32): mb,
    }
    memory = result.memory[0]
    states = LAYERS * layer + outer
    assert memory.params == pytest.approx(states * FP32 / 2 + 2 * outer * FP32)  # + gathered and prefetched
    assert memory.grads == pytest.approx(states * FP32 / 2 + outer * FP32)  # + one unit before its reduction
    assert memory.optimizer == pytest.approx(states * 8 / 2)
    # ZeRO 2 reduce-scatters every micro-batch too; plain data parallelism all-reduces once.
    zero2 = simulate(captured, f"dp=2,mb={mb},zero=2", "2xA100-SXM4-80GB", params=params, batch=BATCH)
    ddp = simulate(captured, f"dp=2,mb={mb}", "2xA100-SXM4-80GB", params=params, batch=BATCH)
    assert zero2.collectives[("reduce_scatter", "dp", layer * FP32)] == mb * LAYERS
    assert dict(ddp.collectives) == {
        ("all_reduce", "dp", layer * FP32): LAYERS,
        ("all_reduce", "dp", outer * FP32): 1,
    }


def test_hsdp_shards_within_groups_and_all_reduces_the_shard_across_them(
    gpt: tuple[Any, Captured, dict[str, int]],
) -> None:
    """dp=4, shard=2 on two nodes of two: shard groups {0, 1} and {2, 3} inside the nodes; replicas
    {0, 2} and {1, 3} across them, both through each node's one NIC."""
    model, captured, params = gpt
    layer, outer = _sizes(model)
    cluster = Cluster.parse("2x2xA100-SXM4-80GB", nics_per_node=1)
    result = simulate(captured, "dp=4,zero=3,shard=2", cluster, params=params, batch=BATCH)
    assert dict(result.collectives) == {
        ("all_gather", "shard", layer * FP32): 2 * LAYERS,
        ("all_gather", "shard", outer * FP32): 2,
        ("reduce_scatter", "shard", layer * FP32): LAYERS,
        ("reduce_scatter", "shard", outer * FP32): 1,
        ("all_reduce", "replicate", layer * FP32 / 2): LAYERS,
        ("all_reduce", "replicate", outer * FP32 / 2): 1,
    }
    priced = {(t.args["kind"], t.args["bytes"]): t.duration_ms for t in result.tasks if "kind" in t.args}
    assert priced[("all_gather", layer * FP32)] == collective_ms("all_gather", layer * FP32, [0, 1], cluster)
    assert priced[("all_reduce", layer * FP32 / 2)] == collective_ms(
        "all_reduce", layer * FP32 / 2, [0, 2], cluster, sharing=2
    )
    states = LAYERS * layer + outer
    assert result.memory[0].optimizer == pytest.approx(states * 8 / 2)  # over the 2 ranks of a shard group


def test_a_layers_gather_is_prefetched_while_the_layer_before_it_computes() -> None:
    cluster = Cluster.parse("2xA100-SXM4-80GB")
    nbytes = 2e8
    gather = collective_ms("all_gather", nbytes, [0, 1], cluster)
    assert 0.1 < gather < 1.0  # shorter than a layer's 1 ms forward

    def segment(layer: str, ms: float) -> Segment:
        return Segment(layer, ms, 0, before=[Comm("all_gather", nbytes, "dp", "param")])

    layers = ["l0", "l1", "l2"]
    forward, backward = [segment(x, 1.0) for x in layers], [segment(x, 2.0) for x in reversed(layers)]
    stage = StagePlan(0, layers, forward, backward, 0, 0.0, 0.0)
    plan = Plan(Strategy(dp=2, zero=3), [stage], 0.0, hidden=1, tokens=1, itemsize=4)
    tasks, collectives = _tasks(plan, cluster)
    assert collectives[("all_gather", "dp", nbytes)] == 6
    # Only the first gather waits; the others run under the compute before them (3 ms forward, 6 backward).
    assert simulate_tasks(tasks) == pytest.approx(gather + 3.0 + 6.0)
    assert all(t.stream == "param" for t in tasks if t.args.get("kind") == "all_gather")


@pytest.mark.parametrize(
    ("spec", "gpus", "link"),
    [("dp=4,zero=3", 4, None), ("dp=2,zero=2,mb=2", 2, None), ("dp=4", 4, None), ("dp=4", 4, 1.0)],
)
def test_the_analytic_pass_slows_compute_beside_gathers_and_reductions_as_the_simulator(
    spec: str, gpus: int, link: float | None
) -> None:
    # The overlap factor: kernels beside ZeRO-3's gathers, ZeRO-2's reductions and the data-parallel
    # all-reduce take gamma longer for the overlap, in the analytic pass about as much as in the event
    # simulation; where the reductions outlast the backward (a 1 GB/s link), the slowdown hides in them.
    model, inputs = zoo.build("gpt2", BATCH, seq=SEQ, dim=512, heads=4, layers=LAYERS, vocab=VOCAB)
    captured, params = default_estimator().capture(model, inputs, batch_size=2), _params_by_module(model)
    over = {} if link is None else {"intra_gbps": link}
    cluster, s = Cluster.parse(f"{gpus}xA100-SXM4-80GB", **over), Strategy.parse(spec)
    pieces = Pieces.of(
        compile_plan(captured, params, Strategy(), cluster.device, s.micro_batch(BATCH)), params
    )
    exact, plain = (simulate(captured, s, cluster, params=params, batch=BATCH, gamma=g).iteration_ms
                    for g in (GAMMA, 0.0))  # fmt: skip
    fast, fast_plain = (estimate(pieces, s, LAYERS, cluster, gamma=g).iteration_ms for g in (GAMMA, 0.0))
    assert (exact - plain > 0.01) == (link is None)  # ms: the overlap is there to see, or hidden
    assert fast - fast_plain == pytest.approx(exact - plain, rel=0.25, abs=1e-3)
