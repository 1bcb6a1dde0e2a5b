"""The measurement pass, the timing helper and kernel attribution from profiler traces."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxcost
from fxcost.bench.profiling import RANGE_PREFIX, kernels_by_range
from fxcost.bench.timing import bench_ms


def test_every_node_is_measured_and_views_cost_little() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    report = fxcost.profile(model, (torch.randn(32, 64),), devices=["T4"], budget_ms=0.5)
    assert all(n.origin_ms is not None and n.origin_ms >= 0 for n in report.nodes)
    getitems = [n for n in report.nodes if n.op == "operator.getitem"]
    assert all(n.origin_ms == 0 for n in getitems)
    assert report.graphs[0].measured_ms > 0


def test_measurement_does_not_touch_rng_or_inputs() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.BatchNorm1d(8))
    x = torch.randn(4, 8, requires_grad=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    fxcost.profile(model, (x,), devices=["T4"], budget_ms=0.2)
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))  # the RNG state was restored
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k  # running statistics restored
    assert x.grad is None and all(p.grad is None for p in model.parameters())


def test_bench_ms_counts_repetitions_within_budget() -> None:
    calls = []
    ms = bench_ms(lambda: calls.append(1), torch.device("cpu"), budget_ms=1.0, warmup=2, min_reps=5)
    assert ms >= 0
    assert 2 + 5 <= len(calls) <= 2 + 101
    with pytest.raises(ValueError, match="min_reps"):
        bench_ms(lambda: None, torch.device("cpu"), min_reps=0)


def _event(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_kernels_are_assigned_to_the_range_that_launched_them() -> None:
    trace = {
        "traceEvents": [
            _event("user_annotation", RANGE_PREFIX + "mm", 100, 50),
            _event("user_annotation", RANGE_PREFIX + "relu", 200, 30),
            _event("user_annotation", "unrelated", 0, 1000),
            _event("cuda_runtime", "cudaLaunchKernel", 110, 5, correlation=1),
            _event("cuda_runtime", "cudaLaunchKernel", 130, 5, correlation=2),
            _event("cuda_runtime", "cudaLaunchKernel", 210, 5, correlation=3),
            _event("cuda_runtime", "cudaLaunchKernel", 400, 5, correlation=4),  # outside every range
            _event("kernel", "ampere_sgemm_128x64_nn", 300, 40.0, correlation=1, grid=[10, 2, 1],
                   block=[256, 1, 1], **{"registers per thread": 122, "shared memory": 16384}),
            _event("kernel", "splitKreduce", 345, 3.0, correlation=2, grid=[4, 1, 1], block=[128, 1, 1]),
            _event("kernel", "vectorized_elementwise_kernel", 350, 2.5, correlation=3),
            _event("kernel", "stray", 500, 1.0, correlation=4),
        ]
    }  # fmt: skip
    kernels = kernels_by_range(trace)
    assert set(kernels) == {"mm", "relu"}
    gemm, reduce = kernels["mm"]
    assert gemm.name == "ampere_sgemm_128x64_nn" and reduce.name == "splitKreduce"
    assert gemm.grid == (10, 2, 1) and gemm.block == (256, 1, 1)
    assert gemm.registers_per_thread == 122 and gemm.shared_memory_bytes == 16384
    assert gemm.duration_ms == pytest.approx(0.040)
    (relu,) = kernels["relu"]
    assert relu.grid is None and relu.registers_per_thread is None


@pytest.mark.cuda
def test_cuda_measurement_records_kernels() -> None:
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU()).cuda()
    report = fxcost.profile(model, (torch.randn(64, 256, device="cuda"),), devices=["T4"])
    assert report.origin != "cpu"
    addmm = next(n for n in report.nodes if n.op == "aten.addmm.default")
    assert addmm.kernels and addmm.kernels[0].grid is not None
    assert 0.2 < report.capture_fidelity < 5
