"""Published runs read into simulations (:mod:`fxcost.sim.runs`) and the memory they need by hand."""

from __future__ import annotations

from typing import Any

import pytest

import fxcost
from fxcost import zoo
from fxcost.estimator import Captured, default_estimator
from fxcost.gpus import get_device
from fxcost.sim import Strategy, simulate
from fxcost.sim.cluster import Cluster
from fxcost.sim.engine import Task
from fxcost.sim.plan import compile_plan
from fxcost.sim.runs import (
    BREAKDOWN_PARTS,
    SYSTEMS,
    attention_of,
    breakdown,
    cluster_for,
    read_gpu,
    sequence_parallel_of,
)
from fxcost.sim.simulator import OPTIMIZER_STEP, SimResult

LAYERS, DIM, SEQ, VOCAB, BATCH, FFN = 2, 64, 16, 256, 8, 256


@pytest.fixture(scope="module")
def gpt() -> tuple[Any, Captured]:
    model, inputs = zoo.build("gpt2", BATCH, seq=SEQ, dim=DIM, heads=4, layers=LAYERS, vocab=VOCAB)
    return model, default_estimator().capture(model, inputs, batch_size=BATCH)


def test_tensor_parallel_ranks_hold_a_part_of_the_embedding_and_head(gpt: tuple[Any, Captured]) -> None:
    # Megatron's vocabulary-parallel embedding and head: every tensor-parallel rank holds 1/tp of them,
    # as of the layers (their linears split over tp; counted with their biases and norms).
    model, captured = gpt
    params = fxcost.sim.simulator._params_by_module(model)
    total = sum(p.numel() for p in model.parameters())
    plan = compile_plan(captured, params, Strategy(tp=2), get_device("A100-SXM4-80GB"), BATCH)
    assert plan.stages[0].params == pytest.approx(total / 2, abs=2)


def test_a_gpu_string_names_its_system_and_power_cap() -> None:
    device, system, flags = read_gpu("V100-SXM3-32GB (DGX-2H)")
    assert device.name == "V100-SXM3-32GB-H" and system is SYSTEMS["DGX-2H"] and not flags
    device, system, flags = read_gpu("H100-SXM-96GB-HBM2e (500W)")
    assert device.name == "H100-SXM-96GB-HBM2e" and system is None and not flags  # its TDP is 500 W
    device, _, flags = read_gpu("H100-SXM (500W)")
    assert device.name == "H100-SXM" and flags and "power cap 500W" in flags[0]
    with pytest.raises(ValueError, match="unknown device 'Z9'"):
        read_gpu("Z9 (DGX-2H)")


def test_the_cluster_is_the_system_s_or_the_stated_network_s() -> None:
    v100, system, _ = read_gpu("V100-SXM3-32GB (DGX-2H)")
    cluster, flags = cluster_for(v100, 512, system)
    # Shoeybi et al. 2019: 16 GPUs per DGX-2H, 100 GB/s between servers over 8 InfiniBand adapters.
    assert (cluster.nodes, cluster.gpus_per_node, cluster.nics_per_node) == (32, 16, 8)
    assert cluster.inter.bandwidth_gbps * cluster.nics_per_node == pytest.approx(100) and flags
    a100 = get_device("A100-SXM4-80GB")
    cluster, flags = cluster_for(a100, 64, None, "MPT benchmarks (A100 80GB (1600 Gbps RoCE) table)")
    assert cluster.gpus_per_node == 8 and cluster.inter.bandwidth_gbps * 8 == pytest.approx(1600 / 8)
    assert "1600 Gbps RoCE" in flags[0]
    alone, flags = cluster_for(a100, 4)
    assert (alone.nodes, alone.gpus_per_node) == (1, 4) and not flags


def test_the_attention_kernel_is_read_from_the_report() -> None:
    assert attention_of("MosaicML llm-foundry ... FlashAttention triton")[0] == "sdpa"
    assert attention_of("torchtitan benchmarks llama3_h100")[0] == "sdpa"
    kind, why = attention_of("Narayanan et al. SC21 Table 1")
    assert kind == "eager" and "unfused" in why
    assert sequence_parallel_of("torchtitan benchmarks asyncTP")[0]
    assert sequence_parallel_of("Narayanan et al. SC21") == (False, "")


def test_the_breakdown_adds_up_to_the_iteration(gpt: tuple[Any, Captured]) -> None:
    model, _ = gpt
    _, inputs = zoo.build("gpt2", BATCH, seq=SEQ, dim=DIM, heads=4, layers=LAYERS, vocab=VOCAB)
    result = simulate(model, "dp=2,tp=2,pp=2,mb=4", "8xA100-SXM4-80GB", example_inputs=inputs)
    for stage in (0, 1):
        parts = breakdown(result, stage)
        assert parts["iteration"] == result.iteration_ms
        assert parts["compute"] > 0 and parts["tp"] > 0 and parts["p2p"] > 0 and parts["dp"] > 0
        assert parts["optimizer"] > 0
        assert sum(parts[k] for k in BREAKDOWN_PARTS) == pytest.approx(result.iteration_ms)
    assert breakdown(result, 0)["idle"] > 0  # the 1F1B bubble: stage 0 waits for stage 1's backward
    # ZeRO 2: the step sits between the reduce-scatters and the gather; it counts once, not as dp too.
    sharded = simulate(model, "dp=2,zero=2", "2xA100-SXM4-80GB", example_inputs=inputs)
    parts = breakdown(sharded)
    tasks = {t.name: t for t in sharded.tasks}
    step = tasks["optimizer step"]
    after = [t for t in sharded.tasks if t.args.get("group") == "dp" and t.start_ms >= step.end_ms]
    last_backward = max(t.end_ms for t in sharded.tasks if t.stream == "compute" and t is not step)
    assert after and parts["optimizer"] == pytest.approx(step.duration_ms)
    exposed = (step.start_ms - last_backward) + (after[-1].end_ms - step.end_ms)  # around the step
    assert parts["dp_exposed"] == pytest.approx(exposed)
    assert parts["idle"] >= 0


def test_the_breakdown_counts_each_instant_once() -> None:
    # A pipeline send beside a kernel, a tp all-reduce after it, a gradient all-reduce partly hidden
    # under the next kernel, and gaps: their durations add up to 14 ms of a 12 ms iteration.
    tasks = [Task("fw", 0, "compute", 4.0, start_ms=0.0, end_ms=4.0),
             Task("send", 0, "feature", 3.0, args={"group": "pp"}, start_ms=2.0, end_ms=5.0),
             Task("ar", 0, "feature", 2.0, args={"group": "tp"}, start_ms=4.0, end_ms=6.0),
             Task("bw", 0, "compute", 2.0, start_ms=7.0, end_ms=9.0),
             Task("grads", 0, "gradient", 2.0, args={"group": "dp"}, start_ms=8.0, end_ms=10.0),
             Task(OPTIMIZER_STEP, 0, "compute", 1.0, start_ms=10.0, end_ms=11.0),
             Task("other stage", 1, "compute", 12.0, start_ms=0.0, end_ms=12.0)]  # fmt: skip
    result = SimResult(12.0, 1, Strategy(), Cluster.parse("2xA100-SXM4-80GB"), tasks, [])
    parts = breakdown(result, 0)
    assert {k: parts[k] for k in BREAKDOWN_PARTS} == pytest.approx(
        {"compute": 6.0, "tp": 2.0, "p2p": 0.0, "dp_exposed": 1.0, "optimizer": 1.0, "idle": 2.0}
    )
    assert (parts["tp_total"], parts["p2p_total"], parts["dp"]) == (2.0, 3.0, 2.0)
