"""Habitat's wave scaling (Eq. 1-3) and fxcost's extensions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fxcost.cost_models import NodeBatch, predict
from fxcost.cost_models.wave_scaling import ScalingInputs, WaveScaling, equation_1, equation_2, gamma
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import get_device
from fxcost.records import NodeCost
from fxcost.report import Report

V100, T4, A100 = (get_device(n) for n in ("V100-PCIE-32GB", "T4", "A100-PCIE-40GB"))


def test_gamma_follows_equation_3() -> None:
    ridge = V100.fp32_tflops * 1e12 / (V100.bandwidth_gbps * 1e9)
    assert gamma(0.0, V100) == 1.0
    assert gamma(ridge / 2, V100) == pytest.approx(0.75)
    assert gamma(ridge, V100) == pytest.approx(0.5)
    assert gamma(2 * ridge, V100) == pytest.approx(0.25)
    assert gamma(math.nan, V100) == 1.0  # unknown intensity: memory bound, as Habitat


def test_equation_1_approaches_equation_2_with_many_waves() -> None:
    inputs = ScalingInputs(
        origin_ms=1.0, blocks=10**7, wave_o=1280, wave_d=640, origin=V100, dest=T4, gamma=0.7
    )
    assert equation_1(inputs) == pytest.approx(equation_2(inputs), rel=1e-3)
    few = ScalingInputs(origin_ms=1.0, blocks=1000, wave_o=1280, wave_d=900, origin=V100, dest=T4, gamma=0.7)
    assert equation_1(few) != pytest.approx(equation_2(few), rel=1e-2)  # the ceilings matter


def test_memory_bound_kernel_scales_with_achieved_bandwidth() -> None:
    inputs = ScalingInputs(
        origin_ms=2.0, blocks=10**6, wave_o=1280, wave_d=640, origin=V100, dest=T4, gamma=1.0
    )
    assert equation_2(inputs) == pytest.approx(2.0 * V100.bandwidth_gbps / T4.bandwidth_gbps)


def _measured(op: str, b: int, h: int, ms: float) -> NodeCost:
    node = kernel_alike_node(op, b, h)
    node.origin_ms = ms
    return node


@pytest.mark.parametrize("model", [WaveScaling(), WaveScaling("eq2", extended=False)])
def test_origin_equal_to_destination_is_the_identity(model: WaveScaling) -> None:
    nodes = [
        _measured("add", 8192, 1024, 0.5),
        _measured("softmax", 4096, 4096, 0.01),
        _measured("ln", 64, 64, 0.03),
    ]
    out = model.predict(NodeBatch.of(nodes, origin=V100), V100)
    np.testing.assert_array_equal(out, [0.5, 0.01, 0.03])


def test_extended_model_keeps_overhead_and_floor() -> None:
    tiny = _measured("relu", 4, 4, 0.030)
    (ms,) = WaveScaling().predict(NodeBatch.of([tiny], origin=V100), A100)
    assert ms == pytest.approx(max(A100.floor_ms, A100.overhead_ms))
    (pure,) = WaveScaling(extended=False).predict(NodeBatch.of([tiny], origin=V100), A100)
    assert pure < 0.9 * A100.floor_ms  # Habitat scales the fixed launch cost like the work


def test_nodes_without_origin_or_kernel_varying_are_not_predicted() -> None:
    mm = NodeCost(
        name="mm", op="aten.mm.default", phase="fw", origin_ms=1.0, flops=10, bytes_read=10, bytes_written=0
    )
    unmeasured = kernel_alike_node("add", 10, 10)
    out = WaveScaling().predict(NodeBatch.of([mm, unmeasured], origin=V100), T4)
    assert np.isnan(out).all()
    assert np.isnan(
        WaveScaling().predict(NodeBatch.of([_measured("add", 10, 10, 1.0)]), T4)
    ).all()  # no origin


def _gpu_report() -> Report:
    nodes = [
        _measured("add", 32768, 1600, 0.8),
        _measured("softmax", 32768, 1600, 0.7),
        NodeCost(
            name="mm",
            op="aten.mm.default",
            phase="bw",
            origin_ms=2.0,
            flops=2 * 1024**3,
            bytes_read=8 * 1024**2,
            bytes_written=4 * 1024**2,
            out_dtypes=["float32"],
        ),
        NodeCost(
            name="view",
            op="aten.view.default",
            phase="fw",
            has_kernel=False,
            origin_ms=0.0,
            flops=0,
            bytes_read=0,
            bytes_written=0,
        ),
    ]
    return Report(nodes=nodes, origin="Tesla V100-PCIE-32GB", devices=[], model="roofline")


def test_report_to_device_wave_scales_kernel_alike_nodes() -> None:
    report = _gpu_report().to_device("T4")
    sources = [n.pred_source["T4"] for n in report.nodes]
    assert sources == ["wave_scaling", "wave_scaling", "roofline", "wave_scaling"]
    assert report.nodes[0].pred_ms["T4"] > 0.8  # T4 has a third of V100's bandwidth
    assert report.total_ms("T4") == pytest.approx(sum(n.pred_ms["T4"] for n in report.nodes))
    same = _gpu_report().to_device("V100-PCIE-32GB")
    assert [n.pred_ms["V100-PCIE-32GB"] for n in same.nodes][:2] == [0.8, 0.7]


def test_to_device_needs_a_gpu_origin() -> None:
    report = _gpu_report()
    report.origin = "cpu"
    with pytest.raises(ValueError, match="measured on 'cpu'"):
        report.to_device("T4")


def test_fallback_chain_records_the_model_per_node() -> None:
    nodes = _gpu_report().nodes
    predict(nodes, ["L4"], "wave_scaling,roofline", origin="Tesla_V100-PCIE-32GB")
    assert [n.pred_source["L4"] for n in nodes] == [
        "wave_scaling",
        "wave_scaling",
        "roofline",
        "wave_scaling",
    ]


@pytest.mark.slow
def test_benchmark_figures_hold(data_dir) -> None:
    """Regression guard on the wave-scaling benchmark (ops_test rows of the five training GPUs)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "wave_scaling.py"
    out = subprocess.run([sys.executable, str(script), "--data", str(data_dir)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    figures = dict(item.split("=") for item in out.strip().splitlines()[-1].split())
    assert float(figures["mape_ew"]) < 4
    assert float(figures["mape_kernel_alike"]) < 5
    assert float(figures["mape_kernel_alike"]) < float(figures["mape_bw_ratio"])
    assert int(figures["pairs"]) == 20


def test_profiler_kernels_override_the_lowering() -> None:
    from fxcost.cost_models.wave_scaling import kernels_of
    from fxcost.records import KernelRecord

    node = _measured("add", 8192, 1024, 0.5)
    (lowered,) = kernels_of(node)
    assert lowered.launch.grid == (16384, 1, 1)
    node.kernels = [
        KernelRecord("k1", 0.3, grid=(8, 1, 1), block=(256, 1, 1), registers_per_thread=40),
        KernelRecord("k2", 0.1, grid=(4096, 1, 1), block=(128, 1, 1)),
    ]
    recorded = kernels_of(node)
    assert [k.launch.grid for k in recorded] == [(8, 1, 1), (4096, 1, 1)]
    assert [k.weight for k in recorded] == [0.3, 0.1]
    assert recorded[0].launch.registers_per_thread == 40
    (few_blocks,) = WaveScaling().predict(NodeBatch.of([node], origin=V100), T4)
    node.kernels = []
    (from_lowering,) = WaveScaling().predict(NodeBatch.of([node], origin=V100), T4)
    assert few_blocks != pytest.approx(from_lowering)


def _profiled(op: str, b: int, h: int, event_ms: float, kernel_ms: float) -> NodeCost:
    """A node as fxcost records it on a GPU: event-timed, and its kernel timed by the profiler."""
    from fxcost.records import KernelRecord

    node = _measured(op, b, h, event_ms)
    node.kernels = [KernelRecord("k", kernel_ms, (b * h // 1024 + 1, 1, 1), (256, 1, 1))]
    return node


def test_recorded_kernel_time_is_scaled_without_the_origins_overhead_or_a_floor() -> None:
    tiny = _profiled("relu", 64, 64, event_ms=0.017, kernel_ms=0.002)
    (ms,) = WaveScaling().predict(NodeBatch.of([tiny], origin=V100), A100)
    # the launch overhead in the event time is the origin machine's, not part of the GPU's speed
    assert A100.overhead_ms < ms < A100.overhead_ms + 0.003
    assert ms < A100.floor_ms  # the floor stands in only for an unknown kernel time
    (event_only,) = WaveScaling().predict(NodeBatch.of([_measured("relu", 64, 64, 0.017)], origin=V100), A100)
    assert event_only == pytest.approx(A100.floor_ms)


def test_only_the_bandwidth_share_of_a_kernel_follows_a_change_of_bandwidth() -> None:
    from fxcost.cost_models.wave_scaling import bandwidth_share

    b, h = 8192, 4096
    roof_ms = kernel_alike_node("add", b, h).bytes / (V100.bandwidth_gbps * 1e6)
    assert bandwidth_share(kernel_alike_node("add", b, h).bytes, roof_ms, V100) == pytest.approx(1.0)
    assert bandwidth_share(kernel_alike_node("add", b, h).bytes, 4 * roof_ms, V100) == pytest.approx(0.25)
    at_roof = _profiled("add", b, h, roof_ms + 0.02, roof_ms)
    slow = _profiled("add", b, h, 4 * roof_ms + 0.02, 4 * roof_ms)  # a quarter of the bandwidth
    fast, slowed = WaveScaling().predict(NodeBatch.of([at_roof, slow], origin=V100), A100)
    speedup_at_roof = roof_ms / (fast - A100.overhead_ms)
    speedup_slow = 4 * roof_ms / (slowed - A100.overhead_ms)
    assert speedup_at_roof > speedup_slow > 1.0


def test_a_chunked_launch_is_one_kernel_repeated() -> None:
    """A softmax over 2^24 rows launches in chunks for 32-bit indexing: one kernel, built once and
    repeated, equal to the kernel of a single chunk's launch."""
    import dataclasses

    from fxcost.cost_models.wave_scaling import kernels_of
    from fxcost.lowering import lower

    node = kernel_alike_node("softmax", 2**24, 128)
    specs, kernels = lower(node) or [], kernels_of(node)
    assert len(kernels) == len(specs) > 1
    assert len({id(k) for k in kernels}) == 1
    one = kernels_of(dataclasses.replace(node, kernels=[]))[0]
    assert kernels[0] == one and kernels[0].launch == specs[0].launch
