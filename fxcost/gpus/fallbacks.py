"""What fxcost takes for a GPU nobody calibrated: the fallbacks of the calibration columns.

The calibrated values come from ``python benchmarks/calibrate_devices.py --data ../shared/data
--write`` (training GPUs only). Overhead and floor are the calibrated GPUs' medians; the bandwidth
fractions their mean achieved over spec DRAM bandwidth, by memory technology: stacked HBM beside the
die reaches more of its spec than GDDR's board-level channels (HBM: P100 0.76, V100 0.95, A100 0.92;
GDDR: P4 and T4 0.75; ``tests/gpus/test_gpus_fallbacks.py`` checks them against the table), and a GPU
of another technology takes all five's mean.

The training GPUs alone decided it: a memory-bound op's time on each, from the share of the other
four, is 8.0% off on average by technology, 12.9% from one mean. Checked since on the lent GPUs' own
measurements (held out, not fit: ``benchmarks/fixtures/gpu/*/calibration.yaml``), an H100 SXM
achieved 0.89 of its spec and an H200 0.85: the HBM fallback is 2.2% below the one and 2.3% above the
other, where one 0.83 for all was 7.0% and 2.7% below.
"""

from __future__ import annotations

import functools

__all__ = [
    "BANDWIDTH_FRACTIONS",
    "DEFAULT_BANDWIDTH_FRACTION",
    "DEFAULT_FLOOR_MS",
    "DEFAULT_OVERHEAD_MS",
    "FALLBACK_SOURCES",
    "bandwidth_fraction",
    "bandwidth_source",
    "memory_family",
]

BANDWIDTH_FRACTIONS = {"HBM": 0.873, "GDDR": 0.754}
DEFAULT_BANDWIDTH_FRACTION = 0.826
DEFAULT_OVERHEAD_MS = 0.018
DEFAULT_FLOOR_MS = 0.030


def memory_family(memory_type: str | None) -> str | None:
    """``"HBM"`` or ``"GDDR"`` for a memory type of the table (``HBM2e``, ``GDDR6X``...), else None."""
    return next((f for f in BANDWIDTH_FRACTIONS if (memory_type or "").upper().startswith(f)), None)


@functools.cache  # read by Device.bandwidth_gbps, on every price of a GPU nobody calibrated
def bandwidth_fraction(memory_type: str | None) -> float:
    """The share of its spec DRAM bandwidth a GPU nobody calibrated is taken to achieve."""
    return BANDWIDTH_FRACTIONS.get(memory_family(memory_type) or "", DEFAULT_BANDWIDTH_FRACTION)


def bandwidth_source(memory_type: str | None) -> str:
    """Where the bandwidth of a GPU nobody calibrated comes from."""
    family = memory_family(memory_type)
    whose = f"calibrated {family} GPUs" if family else "calibrated GPUs"
    return (
        f"default: {bandwidth_fraction(memory_type):.3f} x spec bandwidth (mean achieved/spec of the {whose})"
    )


FALLBACK_SOURCES = {
    "kernel_overhead_ms": f"default: {DEFAULT_OVERHEAD_MS} ms (median of the calibrated GPUs)",
    "launch_floor_ms": f"default: {DEFAULT_FLOOR_MS} ms (median of the calibrated GPUs)",
    "dot_bf16_tflops": "not calibrated: the bf16 peak times the share of its peaks the GPU sustains",
    "dot_fp16_tflops": "not calibrated: the fp16 peak times the share of its peaks the GPU sustains",
}
