"""Calibration microbenchmarks: kernels checked against torch, compiled on a GPU or under Triton's
CPU interpreter (conftest sets ``TRITON_INTERPRET=1`` where there is no GPU)."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest
import torch

from fxcost.cli.parser import parser
from fxcost.gpus import get_device
from fxcost.kernels_triton import kernels
from fxcost.kernels_triton.calibrate import Calibration, SizeTiming, calibrate, torch_copy_bandwidth_gbps
from fxcost.kernels_triton.device_profile import to_yaml

N = 3 * kernels.BLOCK + 5  # a partial last block exercises the masks
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _on_the_kernels_device():
    """Tensors made without a device go where the kernels run: the GPU, or the CPU interpreter."""
    with torch.device(DEVICE):
        yield


def test_kernels_are_interpreted_exactly_without_a_gpu() -> None:
    assert kernels.interpreted() == (DEVICE == "cpu")


def test_copy_matches_torch() -> None:
    x = torch.randn(N)
    torch.testing.assert_close(kernels.copy(x, torch.empty_like(x)), x, rtol=0, atol=0)


def test_triad_matches_torch() -> None:
    b, c = torch.randn(N), torch.randn(N)
    torch.testing.assert_close(kernels.triad(b, c, 3.0, torch.empty_like(b)), b + 3.0 * c)


def test_fma_matches_torch() -> None:
    x, iters, mul, add = torch.randn(N), 7, 0.999, 0.001
    expected = torch.zeros_like(x)
    for start in range(kernels.FMA_CHAINS):
        acc = x + start
        for _ in range(iters):
            acc = acc * mul + add
        expected += acc
    torch.testing.assert_close(kernels.fma(x, torch.empty_like(x), iters, mul, add), expected)
    assert kernels.fma_flops(N, iters) == 2 * 4 * iters * N


def test_fma_refuses_other_dtypes() -> None:
    x = torch.randn(8, dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32"):
        kernels.fma(x, torch.empty_like(x), 1)


def test_empty_kernel_runs() -> None:
    kernels.empty(torch.empty(1))


def test_l2_read_matches_torch() -> None:
    x_blocks, programs, reps = 3, 5, 4
    x = torch.randn(x_blocks * kernels.BLOCK)
    out = kernels.l2_read(x, torch.empty(programs * kernels.BLOCK), reps)
    xb = x.view(x_blocks, kernels.BLOCK)
    expected = torch.stack([sum(xb[(p + i) % x_blocks] for i in range(reps)) for p in range(programs)])
    torch.testing.assert_close(out.view(programs, kernels.BLOCK), expected)
    assert kernels.l2_read_bytes(x, out, reps) == programs * kernels.BLOCK * 4 * (reps + 1)


def test_mismatched_tensors_are_refused() -> None:
    with pytest.raises(ValueError, match="one shape"):
        kernels.copy(torch.empty(8), torch.empty(9))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dot_matches_torch(dtype: torch.dtype) -> None:
    # bf16 is left to the GPU test: the interpreter multiplies bf16 tl.dot operands wrongly.
    a = torch.randn(128, 64).to(dtype)
    b = torch.randn(64, 256).to(dtype)
    out = kernels.dot(a, b, torch.empty(128, 256))
    tol = 2e-2 if DEVICE == "cuda" and dtype == torch.float32 else 1e-3  # a GPU multiplies fp32 as tf32
    torch.testing.assert_close(out, a.float() @ b.float(), atol=tol, rtol=tol)
    assert kernels.dot_flops(128, 256, 64) == 2 * 128 * 256 * 64


def test_dot_refuses_shapes_off_the_tile() -> None:
    with pytest.raises(ValueError, match="M % 128"):
        kernels.dot(torch.empty(100, 64), torch.empty(64, 128), torch.empty(100, 128))
    with pytest.raises(ValueError, match="fp32 out"):
        kernels.dot(torch.empty(128, 64), torch.empty(64, 128), torch.empty(128, 128, dtype=torch.float16))


@pytest.mark.cuda
def test_bf16_dot_on_the_gpu_matches_torch_and_beats_fp32_fma() -> None:
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    out = kernels.dot(a, b, torch.empty(1024, 1024, device="cuda"))
    torch.testing.assert_close(out, a.float() @ b.float(), atol=0.5, rtol=1e-2)
    cal = calibrate("cuda", sizes=[1 << 24], repeats=3, l2=False)
    assert cal.dot_tflops["bfloat16"] > cal.fma_tflops


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter runs only where there is no GPU")
def test_calibrate_runs_simulated_on_cpu() -> None:
    cal = calibrate("cpu", sizes=[kernels.BLOCK, 2 * kernels.BLOCK], repeats=1, budget_ms=0.0,
                    fma_elements=kernels.BLOCK, fma_iters=2, dot_size=128)  # fmt: skip
    assert set(cal.dot_tflops) == {"float16", "bfloat16"} and all(v > 0 for v in cal.dot_tflops.values())
    assert not cal.on_gpu and cal.dtype == "float32" and "cpu" in cal.device_name
    values = [cal.achieved_bandwidth_gbps, cal.triad_bandwidth_gbps, cal.fma_tflops, cal.launch_overhead_ms]
    assert all(math.isfinite(v) and v > 0 for v in values)
    assert cal.l2_bandwidth_gbps is None  # no L2 size on the CPU
    assert [(t.kernel, t.elements) for t in cal.timings] == [
        ("copy", kernels.BLOCK), ("triad", kernels.BLOCK),
        ("copy", 2 * kernels.BLOCK), ("triad", 2 * kernels.BLOCK),
    ]  # fmt: skip
    assert all(t.time_ms > 0 and t.bytes_moved == (2 if t.kernel == "copy" else 3) * 4 * t.elements
               for t in cal.timings)  # fmt: skip
    # Without an L2 to exceed, every size counts as large: the bandwidth is the median over all.
    copies = [t.bandwidth_gbps for t in cal.timings if t.kernel == "copy"]
    assert cal.achieved_bandwidth_gbps == pytest.approx(sum(copies) / 2)


def test_torch_copy_bandwidth_on_cpu() -> None:
    gbps = torch_copy_bandwidth_gbps("cpu", sizes=[1 << 10, 1 << 12], repeats=2, budget_ms=0.0)
    assert math.isfinite(gbps) and gbps > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"sizes": []}, "sizes"), ({"repeats": 0}, "repeats"), ({"dot_size": 100}, "dot_size")],
)
def test_bad_arguments_are_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        calibrate(DEVICE, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_calibrate_on_missing_cuda_says_so() -> None:
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        calibrate("cuda")


def _gpu_calibration(**changes) -> Calibration:
    cal = Calibration(
        device_name="NVIDIA H100 80GB HBM3", on_gpu=True, dtype="float32",
        achieved_bandwidth_gbps=2987.654321, triad_bandwidth_gbps=3010.0, fma_tflops=51.2,
        dot_tflops={"float16": 610.0, "bfloat16": 605.0},
        launch_overhead_ms=0.0031234, kernel_overhead_ms=0.0042, op_overhead_ms=0.0151,
        op_floor_ms=0.0161234, l2_bandwidth_gbps=9000.0,
        timings=(SizeTiming("copy", 1 << 26, 2 << 28, 0.18),),
    )  # fmt: skip
    return dataclasses.replace(cal, **changes)


def test_to_yaml_overrides_a_known_device(tmp_path, fresh_database) -> None:
    path = to_yaml(_gpu_calibration(), tmp_path / "device.yaml")
    assert "fp32 FMA 51.2 TFLOPS" in path.read_text()
    assert "tl.dot float16 610, bfloat16 605 TFLOPS" in path.read_text()
    assert fresh_database.load_devices(path) == ["H100-SXM"]
    h100 = get_device("H100-SXM")
    # the table's overhead and floor are a PyTorch op's, not an empty Triton kernel's
    assert h100.bandwidth_gbps == 2988.0 and h100.overhead_ms == 0.0151 and h100.floor_ms == 0.01612
    assert "empty kernel 3.12 us, copy intercept 4.2 us" in path.read_text()
    assert str(path) in h100.source_of("bandwidth_gbps")


def test_to_yaml_adds_a_new_device_from_a_base(tmp_path, fresh_database) -> None:
    cal = _gpu_calibration(device_name="NVIDIA Mystery GPU", op_overhead_ms=None)
    with pytest.raises(ValueError, match="base"):
        to_yaml(cal, tmp_path / "device.yaml")
    path = to_yaml(cal, tmp_path / "device.yaml", base="A100-SXM4-80GB")
    assert fresh_database.load_devices(path) == ["NVIDIA Mystery GPU"]
    mine = get_device("NVIDIA Mystery GPU")
    assert mine.num_sms == get_device("A100-SXM4-80GB").num_sms and mine.bandwidth_gbps == 2988.0
    assert mine.kernel_overhead_ms is None  # not measured: the database's fallback applies


def test_to_yaml_refuses_a_simulated_calibration(tmp_path) -> None:
    with pytest.raises(ValueError, match="simulated"):
        to_yaml(_gpu_calibration(on_gpu=False), tmp_path / "device.yaml")
    assert not (tmp_path / "device.yaml").exists()


def _parse(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def test_cli_parser() -> None:
    args = _parse(["calibrate", "--out", "d.yaml", "--sizes", "1024", "4096", "--repeats", "3"])
    assert args.out == "d.yaml" and args.sizes == [1024, 4096] and args.repeats == 3 and callable(args.run)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cli_without_gpu_raises_a_clear_error(tmp_path) -> None:
    args = _parse(["calibrate", "--out", str(tmp_path / "d.yaml")])
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        args.run(args)
    assert not (tmp_path / "d.yaml").exists()


@pytest.mark.cuda
def test_calibrated_bandwidth_matches_torch_copy() -> None:
    sizes = [1 << 26, 1 << 28]
    cal = calibrate("cuda", sizes=sizes, repeats=10)
    reference = torch_copy_bandwidth_gbps("cuda", sizes=sizes, repeats=10)
    assert cal.on_gpu and cal.l2_bandwidth_gbps is not None
    assert cal.achieved_bandwidth_gbps == pytest.approx(reference, rel=0.05)
