"""A calibration as a device file (:func:`to_yaml`) and as text (:func:`describe`, :func:`bandwidth_check`).

The file holds the calibration columns of the device database (``achieved_bandwidth_gbps``,
``kernel_overhead_ms``, ``launch_floor_ms``, the ``tl.dot`` rates ``dot_bf16_tflops`` and
``dot_fp16_tflops``) in the format :func:`fxcost.gpus.load_devices` reads; FMA throughput, triad and
L2 bandwidth have no database column and are written as comments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fxcost._io import atomic_write
from fxcost.gpus import UnknownDeviceError, get_device
from fxcost.kernels_triton.calibrate import Calibration

__all__ = ["bandwidth_check", "describe", "to_yaml"]


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def to_yaml(
    calibration: Calibration, path: str | Path, *, name: str | None = None, base: str | None = None
) -> Path:
    """Write ``calibration`` as a device file for :func:`fxcost.gpus.load_devices` (atomically).

    The entry is named ``name`` (default: the calibration's ``device_name``). A name the database knows
    overrides that device's calibration columns; a new name needs ``base``, the known device it starts
    from. FMA throughput, triad and L2 bandwidth have no database column and are written as comments.

    Raises:
        ValueError: the calibration is simulated (not from a GPU), or a new name comes without ``base``.
    """
    import yaml

    if not calibration.on_gpu:
        raise ValueError("refusing to write a simulated calibration (on_gpu=False) as a device profile")
    name = name or calibration.device_name
    entry: dict[str, Any] = {}
    try:
        name = get_device(name).name
    except UnknownDeviceError:
        if base is None:
            raise ValueError(
                f"{name!r} is not in the device database; give the known device it starts from (base)"
            ) from None
        entry["base"] = get_device(base).name
    entry["achieved_bandwidth_gbps"] = _sig(calibration.achieved_bandwidth_gbps)
    if calibration.op_overhead_ms is not None:
        entry["kernel_overhead_ms"] = _sig(calibration.op_overhead_ms)
    entry["launch_floor_ms"] = _sig(calibration.op_floor_ms)
    # The tensor rate half-precision GEMMs sustain on this GPU (cost_models.heads.tensor_core).
    for dtype, column in (("bfloat16", "dot_bf16_tflops"), ("float16", "dot_fp16_tflops")):
        if calibration.dot_tflops.get(dtype):
            entry[column] = _sig(calibration.dot_tflops[dtype])
    l2 = (
        "not measured"
        if calibration.l2_bandwidth_gbps is None
        else f"{calibration.l2_bandwidth_gbps:.4g} GB/s"
    )
    copy_intercept = (
        "negative"
        if calibration.kernel_overhead_ms is None
        else f"{calibration.kernel_overhead_ms * 1e3:.3g} us"
    )
    dots = ", ".join(f"{dtype} {tflops:.4g}" for dtype, tflops in calibration.dot_tflops.items())
    header = (
        f"# fxcost calibrate on {calibration.device_name} ({calibration.dtype})\n"
        f"# triad {calibration.triad_bandwidth_gbps:.4g} GB/s, fp32 FMA {calibration.fma_tflops:.4g} TFLOPS, "
        f"L2 {l2}\n"
        f"# tl.dot {dots} TFLOPS\n"
        f"# Triton: empty kernel {calibration.launch_overhead_ms * 1e3:.3g} us, "
        f"copy intercept {copy_intercept}\n"
    )
    body = yaml.safe_dump({name: entry}, sort_keys=False)
    return atomic_write(path, (header + body).encode())


def describe(calibration: Calibration) -> str:
    """Every timing of a calibration and its summary, as lines of text."""
    lines = [
        f"{calibration.device_name}" + ("" if calibration.on_gpu else " (simulated: numbers mean nothing)")
    ]
    lines.append(f"{'kernel':<8} {'elements':>12} {'MB moved':>10} {'ms':>10} {'GB/s':>10}")
    for t in calibration.timings:
        mb = t.bytes_moved / 1e6
        lines.append(
            f"{t.kernel:<8} {t.elements:>12} {mb:>10.1f} {t.time_ms:>10.4f} {t.bandwidth_gbps:>10.1f}"
        )
    summary = {
        "achieved_bandwidth_gbps": calibration.achieved_bandwidth_gbps,
        "triad_bandwidth_gbps": calibration.triad_bandwidth_gbps,
        "fma_tflops": calibration.fma_tflops,
        **{f"dot_tflops_{dtype}": v for dtype, v in calibration.dot_tflops.items()},
        "launch_overhead_ms": calibration.launch_overhead_ms,
        "kernel_overhead_ms": calibration.kernel_overhead_ms,
        "op_overhead_ms (torch)": calibration.op_overhead_ms,
        "op_floor_ms (torch)": calibration.op_floor_ms,
        "l2_bandwidth_gbps": calibration.l2_bandwidth_gbps,
    }
    lines += [f"{key:<24} {'-' if v is None else f'{v:.4g}'}" for key, v in summary.items()]
    return "\n".join(lines)


def bandwidth_check(calibration: Calibration, torch_copy_gbps: float) -> str:
    """How the calibrated bandwidth compares with PyTorch's own copy and with the spec sheet."""
    ratio = calibration.achieved_bandwidth_gbps / torch_copy_gbps
    lines = [f"{'torch_copy_gbps':<24} {torch_copy_gbps:.4g}  (calibrated / torch copy = {ratio:.3f})"]
    try:
        spec = get_device(calibration.device_name).mem_bandwidth_gbps
    except UnknownDeviceError:
        spec = None
    if spec:
        lines.append(f"{'spec_bandwidth_gbps':<24} {spec:.4g}  (calibrated / spec = "
                     f"{calibration.achieved_bandwidth_gbps / spec:.3f})")  # fmt: skip
    return "\n".join(lines)
