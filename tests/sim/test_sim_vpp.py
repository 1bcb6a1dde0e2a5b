"""Interleaved 1F1B (Narayanan et al. SC21 §2.2.2): placement, Megatron's order, bubble, messages, memory."""

from __future__ import annotations

from typing import Any

import pytest

import fxcost
from fxcost import zoo
from fxcost.estimator import Captured, default_estimator
from fxcost.gpus import get_device
from fxcost.sim import Cluster, Strategy, simulate
from fxcost.sim.analytic import _beyond_backward
from fxcost.sim.comm import Comm
from fxcost.sim.engine import simulate_tasks
from fxcost.sim.memory import rank_memory
from fxcost.sim.nccl import collective_ms
from fxcost.sim.plan import Plan, Segment, StagePlan, compile_plan
from fxcost.sim.schedule import run_order, virtual_stages
from fxcost.sim.simulator import OPTIMIZER_STEP, _tasks

LAYERS, DIM, SEQ, VOCAB, BATCH = 4, 64, 16, 256, 8


@pytest.fixture(scope="module")
def gpt() -> tuple[Any, Captured, dict[str, int]]:
    model, inputs = zoo.build("gpt2", BATCH, seq=SEQ, dim=DIM, heads=4, layers=LAYERS, vocab=VOCAB)
    captured = default_estimator().capture(model, inputs, batch_size=BATCH // 4)  # mb=4
    return model, captured, fxcost.sim.simulator._params_by_module(model)


def test_the_strategy_takes_vpp_with_a_pipeline_whose_stages_divide_the_micro_batches() -> None:
    s = Strategy.parse("pp=2,mb=4,vpp=2")
    assert s.vpp == 2 and str(s) == "dp=1,tp=1,pp=2,mb=4,schedule=1f1b,vpp=2" and Strategy.parse(str(s)) == s
    assert Strategy.from_dict({"pp": 4, "mb": 8, "vpp": "3"}).vpp == 3 and Strategy().vpp == 1
    for spec in ("pp=1,vpp=2", "pp=2,mb=3,vpp=2", "pp=2,mb=4,vpp=2,schedule=gpipe"):
        with pytest.raises(ValueError, match=r"interleaved 1F1B \(vpp=2\) needs the 1f1b schedule, pp > 1"):
            Strategy.parse(spec)
    with pytest.raises(ValueError, match="strategy vpp must be a whole number >= 1, got 0"):
        Strategy.parse("pp=2,vpp=0")
    with pytest.raises(ValueError, match="pp=2 x vpp=3 virtual stages but the model has 4 layers"):
        virtual_stages(4, 2, 3)


def test_chunk_c_of_stage_p_holds_virtual_stage_c_pp_plus_p() -> None:
    assert virtual_stages(8, 2, 2) == [(0, 0), (0, 0), (1, 0), (1, 0), (0, 1), (0, 1), (1, 1), (1, 1)]
    assert virtual_stages(4, 2) == [(0, 0), (0, 0), (1, 0), (1, 0)]  # plain 1F1B: contiguous halves


def test_megatrons_interleaved_order_for_two_stages_two_chunks_four_micro_batches() -> None:
    # Written out by hand from Megatron-LM's rules: stage 0 warms up with 2 (pp - 1) + (vpp - 1) pp = 4
    # forwards, stage 1 with 2; the k-th forward runs chunk k % 4 // 2 on micro-batch k // 4 * 2 + k % 2,
    # the k-th backward the chunks in reverse.
    s = Strategy(pp=2, micro_batches=4, vpp=2)
    f = [("F", c, m) for c, m in ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3))]
    b = [("B", c, m) for c, m in ((1, 0), (1, 1), (0, 0), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3))]
    assert run_order(s, 0) == [*f[:4], f[4], b[0], f[5], b[1], f[6], b[2], f[7], b[3], *b[4:]]
    assert run_order(s, 1) == [*f[:2], f[2], b[0], f[3], b[1], f[4], b[2], f[5], b[3], f[6], b[4], f[7], b[5],
                               *b[6:]]  # fmt: skip
    # Micro-batches equal to the stages: every forward first (Megatron-LM's all-warm-up case).
    four = Strategy(pp=2, micro_batches=2, vpp=2)
    assert [d for d, _, _ in run_order(four, 1)] == ["F"] * 4 + ["B"] * 4


def _uniform(
    pp: int,
    vpp: int,
    m: int,
    boundary_bytes: float = 0.0,
    activation: float = 0.0,
    per_chunk: int = 1,
    reduced_bytes: float = 0.0,
) -> Plan:
    """Each stage: vpp chunks of ``per_chunk`` layers, a chunk's forward 1/vpp ms and backward 2/vpp ms;
    with ``reduced_bytes``, two data-parallel replicas all-reduce each layer's gradients once its last
    backward is done."""
    s = Strategy(dp=2 if reduced_bytes else 1, pp=pp, micro_batches=m, vpp=vpp)
    reduce = [Comm("all_reduce", reduced_bytes, "dp", "gradient")] if reduced_bytes else []

    def stage(p: int) -> StagePlan:
        chunks = [[f"l{(c * pp + p) * per_chunk + i}" for i in range(per_chunk)] for c in range(vpp)]
        forward = [Segment(x, 1.0 / vpp / per_chunk, 0, chunk=c) for c, xs in enumerate(chunks) for x in xs]
        backward = [Segment(x, 2.0 / vpp / per_chunk, 0, chunk=c, after=list(reduce))
                    for c, xs in reversed(list(enumerate(chunks))) for x in reversed(xs)]  # fmt: skip
        return StagePlan(p, [x for xs in chunks for x in xs], forward, backward, 0, activation, 0.0)

    return Plan(s, [stage(p) for p in range(pp)], boundary_bytes, hidden=1, tokens=1, itemsize=2)


@pytest.mark.parametrize(
    ("pp", "vpp", "m", "per_chunk"), [(2, 2, 4, 4), (4, 2, 8, 3), (2, 3, 6, 2), (4, 4, 8, 2), (2, 1, 4, 4)]
)
@pytest.mark.parametrize("nbytes", [1e8, 3e8])
def test_the_analytic_pass_has_the_reductions_an_interleaved_pipeline_leaves_after_its_backward(
    pp: int, vpp: int, m: int, per_chunk: int, nbytes: float
) -> None:
    """Chunk c's last backward ends c pp chunk backwards before the stage's: its reductions hide behind
    the later chunks' backwards, and only what they leave shows (not all the reductions but one
    micro-batch's backward, as without interleaving), at least the last layer's."""
    cluster = Cluster.parse(f"{2 * pp}xA100-SXM4-40GB", intra_latency_us=0.0)
    plan, bare = (_uniform(pp, vpp, m, per_chunk=per_chunk, reduced_bytes=b) for b in (nbytes, 0.0))
    tasks, _ = _tasks(plan, cluster)
    tail = simulate_tasks(tasks) - simulate_tasks(_tasks(bare, cluster)[0])
    each = collective_ms("all_reduce", nbytes, [0, pp], cluster)  # replicas pp ranks apart
    assert {t.duration_ms for t in tasks if t.stream == "gradient"} == {each}
    beyond = _beyond_backward(each * vpp * per_chunk, 2.0, vpp * per_chunk, plan.strategy)
    assert tail == pytest.approx(max(each, beyond), rel=1e-9)  # at least the last layer's reduction


@pytest.mark.parametrize(
    ("pp", "vpp", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 8), (4, 2, 4), (2, 4, 6), (4, 1, 8)]
)
def test_the_bubble_of_a_uniform_pipeline_is_pp_minus_1_over_vpp_m(pp: int, vpp: int, m: int) -> None:
    cluster = Cluster.parse(f"{pp}xA100-SXM4-40GB", intra_latency_us=0.0)
    tasks, _ = _tasks(_uniform(pp, vpp, m), cluster)
    ideal = m * 3.0  # forward 1 ms, backward 2 ms per micro-batch on each stage
    assert simulate_tasks(tasks) == pytest.approx(ideal * (1 + (pp - 1) / (vpp * m)), rel=1e-9)


def test_every_chunk_sends_to_the_next_virtual_stage_the_last_stage_back_to_the_first() -> None:
    """pp=4 on two nodes of two GPUs: stages 0-1 on node 0, 2-3 on node 1; stage 3 sends to stage 0."""
    pp, vpp, m, nbytes = 4, 2, 8, 25e6
    cluster = Cluster.parse("2x2xA100-SXM4-40GB")
    tasks, collectives = _tasks(_uniform(pp, vpp, m, nbytes), cluster)
    assert collectives == {("send_recv", "pp", nbytes): 2 * m * (pp * vpp - 1)}  # vs 2 m (pp - 1) in 1F1B
    inside, across = (collective_ms("send_recv", nbytes, pair, cluster) for pair in ([0, 1], [1, 2]))
    sends = {(t.stage, t.name, t.duration_ms) for t in tasks if t.name.startswith("send")}
    assert sends == {
        (0, "send activations", inside), (1, "send activations", across), (2, "send activations", inside),
        (3, "send activations", across), (3, "send gradients", inside), (2, "send gradients", across),
        (1, "send gradients", inside), (0, "send gradients", across),
    }  # fmt: skip
    # Stage 3's chunk 0 sends its activations to stage 0's chunk 1: 3 -> 0 crosses the nodes.
    wrap = [t for t in tasks if t.stage == 3 and t.name == "send activations"]
    assert len(wrap) == m and across > 5 * inside


def test_in_flight_activations_follow_megatrons_formula() -> None:
    # Korthikanti et al. 2022 §4.2.3: the first stage holds pp micro-batches' activations times
    # 1 + (pp - 1) / (pp vpp); stage p holds 2 (pp - p - 1) + (vpp - 1) pp + 1 chunks of 1/vpp of it.
    pp, vpp, m, activation = 4, 2, 8, 1e6
    plan = _uniform(pp, vpp, m, activation=activation)
    held = [rank_memory(plan, st, 80).activations for st in plan.stages]
    assert held[0] == pytest.approx(activation * pp * (1 + (pp - 1) / (pp * vpp)))
    assert held == pytest.approx(
        [activation * (2 * (pp - p - 1) + (vpp - 1) * pp + 1) / vpp for p in range(pp)]
    )
    one = _uniform(pp, 1, m, activation=activation)  # plain 1F1B: pp - p micro-batches
    assert [rank_memory(one, st, 80).activations for st in one.stages] == [
        activation * (pp - p) for p in range(pp)
    ]


def test_a_gpt_is_split_into_chunks_and_simulated_deep(gpt: tuple[Any, Captured, dict[str, int]]) -> None:
    _, captured, params = gpt
    device = get_device("A100-SXM4-80GB")
    plan = compile_plan(captured, params, Strategy(pp=2, micro_batches=4, vpp=2), device, BATCH)
    chunks = [[(seg.layer, seg.chunk) for seg in st.forward] for st in plan.stages]
    assert [sorted(set(c)) for c in chunks] == [
        [("", 0), ("blocks.0", 0), ("blocks.2", 1)],  # the embeddings before the first virtual stage
        [("", 1), ("blocks.1", 0), ("blocks.3", 1)],  # the head after the last
    ]
    assert [st.layers for st in plan.stages] == [["blocks.0", "blocks.2"], ["blocks.1", "blocks.3"]]
    deep = simulate(captured, "pp=2,mb=4,vpp=2", "2xA100-SXM4-80GB", params=params, batch=BATCH, layers=8)
    flat = simulate(captured, "pp=2,mb=4", "2xA100-SXM4-80GB", params=params, batch=BATCH, layers=8)
    sends = [sum(n for (kind, *_), n in r.collectives.items() if kind == "send_recv") for r in (deep, flat)]
    assert sends == [2 * 4 * (2 * 2 - 1), 2 * 4 * (2 - 1)]
    chunks = {t.args.get("chunk") for t in deep.tasks if t.stream == "compute" and t.name != OPTIMIZER_STEP}
    assert chunks == {0, 1}
    with pytest.raises(ValueError, match="pp=2 x vpp=4 virtual stages but the model has 4 layers"):
        compile_plan(captured, params, Strategy(pp=2, micro_batches=4, vpp=4), device, BATCH)
