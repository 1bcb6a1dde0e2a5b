"""The optimizer step ends every simulated iteration: a fused Adam's traffic over the parameters a rank
updates, at the GPU's memory bandwidth, after its gradients are reduced."""

from __future__ import annotations

import pytest

from fxcost import zoo
from fxcost.gpus import get_device
from fxcost.sim import Strategy, simulate
from fxcost.sim.memory import ADAM_STEP_BYTES, optimizer_step_bytes
from fxcost.sim.simulator import OPTIMIZER_STEP, _scaled

GPU = "A100-SXM4-40GB"


@pytest.fixture(scope="module")
def gpt() -> tuple[object, tuple[object, ...]]:
    return zoo.build("gpt2", 4, seq=32, dim=64, heads=4, layers=2, vocab=256)


def test_adam_moves_28_bytes_per_parameter_it_updates() -> None:
    # fp32: p, g, m, v read (16 B) and p, m, v written (12 B); mixed: fp32 p, m, v read and written
    # (24 B), the half gradient read and the half parameter written (4 B).
    assert ADAM_STEP_BYTES == 4 * 4 + 3 * 4 == 2 * 12 + 2 + 2
    assert optimizer_step_bytes(1000, 0, Strategy(dp=4)) == 28_000  # DDP: every replica steps all
    assert optimizer_step_bytes(1000, 0, Strategy(dp=4, zero=1)) == 7_000  # ZeRO 1: its quarter
    assert optimizer_step_bytes(1000, 0, Strategy(dp=4, zero=3, shard=2)) == 14_000  # HSDP: its shard's half
    experts = optimizer_step_bytes(1000, 800, Strategy(dp=4, ep=2, zero=1))
    assert experts == 28 * (200 / 4 + 800 / 2)  # experts' states over the dp / ep replicas holding them


def test_each_rank_steps_after_its_gradients_are_reduced(gpt: tuple[object, tuple[object, ...]]) -> None:
    model, inputs = gpt
    params = sum(p.numel() for p in model.parameters())
    bandwidth = get_device(GPU).mem_bandwidth_gbps * 1e6  # bytes per ms
    for spec, updated in (("dp=2", params), ("dp=2,zero=1", params / 2)):
        result = simulate(model, spec, f"2x{GPU}", example_inputs=inputs, batch=8)
        (step,) = [t for t in result.tasks if t.name == OPTIMIZER_STEP]
        assert step.duration_ms == pytest.approx(ADAM_STEP_BYTES * updated / bandwidth, rel=1e-9)
        reductions = [t for t in result.tasks if t.args.get("group") == "dp"]
        assert reductions and all(step.start_ms >= t.end_ms for t in reductions)
        assert step.end_ms == pytest.approx(result.iteration_ms)
        assert result.forward_backward_ms == pytest.approx(step.start_ms)  # what a timer of both sees
        assert f"{result.forward_backward_ms:.1f} ms before the optimizer step" in result.summary()


def test_zero_2_gathers_the_updated_shards_after_the_step(gpt: tuple[object, tuple[object, ...]]) -> None:
    model, inputs = gpt
    params = sum(p.numel() for p in model.parameters())
    runs = {z: simulate(model, f"dp=2,zero={z}", f"2x{GPU}", example_inputs=inputs, batch=8) for z in (1, 2)}
    whole = ("all_gather", "dp", params * 4)  # fp32 parameters, gathered whole
    assert runs[2].collectives[whole] == 1 and runs[1].collectives[whole] == 0
    (step,) = [t for t in runs[2].tasks if t.name == OPTIMIZER_STEP]
    (gather,) = [t for t in runs[2].tasks if t.args.get("kind") == "all_gather"]
    assert gather.start_ms >= step.end_ms and gather.end_ms == pytest.approx(runs[2].iteration_ms)
    assert runs[2].forward_backward_ms == pytest.approx(step.start_ms)


def test_a_compiled_or_interval_rescaling_leaves_the_step_alone(
    gpt: tuple[object, tuple[object, ...]],
) -> None:
    """The compiled/eager ratio and the interval's factors rescale predicted kernels; the step is a
    memory pass at the bandwidth, priced apart from them."""
    model, inputs = gpt
    result = simulate(model, "dp=1", GPU, example_inputs=inputs, batch=4)
    for before, after in zip(result.tasks, _scaled(result.tasks, 2.0), strict=True):
        kernels = before.stream == "compute" and before.name != OPTIMIZER_STEP
        assert after.duration_ms == before.duration_ms * (2.0 if kernels else 1.0)
