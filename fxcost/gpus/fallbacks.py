"""What fxcost takes for a GPU nobody calibrated: the fallbacks of the calibration columns.

The calibrated values come from ``python benchmarks/calibrate_devices.py --data ../shared/data
--write`` (training GPUs only). Overhead and floor are the calibrated GPUs' medians; the bandwidth
fractions their mean achieved over spec DRAM bandwidth, by memory controller (:func:`memory_family`):

- ``"HBM"``: stacked HBM behind NVIDIA's memory controller of Volta and later.
  NVIDIA's Volta whitepaper (WP-08608-001, "HBM2 Memory Architecture") credits Volta's new controller
  with over 95% of the spec bandwidth delivered on many workloads, against Pascal GP100's 76%:
  V100 0.95, A100 0.92.
- ``"HBM-Pascal"``: Pascal's first HBM2 controller (the P100: 0.76, as the whitepaper says).
- ``"GDDR"``: board-level GDDR channels (P4 and T4: 0.75).

``tests/gpus/test_gpus_fallbacks.py`` checks them against the table. A GPU of another technology, or
another vendor's HBM (whose controllers no calibrated GPU speaks for: the AMD parts), takes all five's
mean.

The training GPUs alone decided it: a memory-bound op's time on each, from the share of the other four
of its class (all four's mean where none is), is off by 3.5% on average by controller, 8.0% by
memory technology alone (HBM, GDDR), 12.9% from one mean. Checked since on the lent GPUs' own
measurements (held out, not fit: ``benchmarks/fixtures/gpu/*/calibration.yaml``): an H100 SXM achieved
0.89 of its spec and an H200 0.85, so the HBM fallback (0.93) is 4.4% and 9.2% above them, where the
technology's (0.87) was 2.2% below and 2.3% above: Hopper's HBM3 reaches less of its spec than the
HBM2 GPUs the fallback is fit on.
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

BANDWIDTH_FRACTIONS = {"HBM": 0.932, "HBM-Pascal": 0.757, "GDDR": 0.754}
DEFAULT_BANDWIDTH_FRACTION = 0.826
DEFAULT_OVERHEAD_MS = 0.018
DEFAULT_FLOOR_MS = 0.030


def memory_family(memory_type: str | None, compute_capability: str | None = None) -> str | None:
    """The memory controller class of a GPU with memory ``memory_type`` (``HBM2e``, ``GDDR6X``...) and
    NVIDIA ``compute_capability`` (``"8.0"``; None or unreadable for another vendor's GPU): ``"HBM"``
    (NVIDIA's, Volta and later), ``"HBM-Pascal"`` (compute capability 6) or ``"GDDR"``; None for
    another technology or another vendor's HBM."""
    memory = (memory_type or "").upper()
    if memory.startswith("GDDR"):
        return "GDDR"
    major = _major(compute_capability)
    if not memory.startswith("HBM") or major is None:
        return None
    return "HBM-Pascal" if major < 7 else "HBM"


def _major(compute_capability: str | None) -> int | None:
    """The major version of an NVIDIA compute capability (``"9.0a"`` -> 9); None if it reads as none."""
    digits = str(compute_capability or "").split(".")[0]
    return int(digits) if digits.isdigit() else None


@functools.cache  # read by Device.bandwidth_gbps, on every price of a GPU nobody calibrated
def bandwidth_fraction(memory_type: str | None, compute_capability: str | None = None) -> float:
    """The share of its spec DRAM bandwidth a GPU nobody calibrated is taken to achieve."""
    family = memory_family(memory_type, compute_capability)
    return BANDWIDTH_FRACTIONS.get(family or "", DEFAULT_BANDWIDTH_FRACTION)


def bandwidth_source(memory_type: str | None, compute_capability: str | None = None) -> str:
    """Where the bandwidth of a GPU nobody calibrated comes from."""
    family = memory_family(memory_type, compute_capability)
    whose = f"calibrated {family} GPUs" if family else "calibrated GPUs"
    fraction = bandwidth_fraction(memory_type, compute_capability)
    return f"default: {fraction:.3f} x spec bandwidth (mean achieved/spec of the {whose})"


FALLBACK_SOURCES = {
    "kernel_overhead_ms": f"default: {DEFAULT_OVERHEAD_MS} ms (median of the calibrated GPUs)",
    "launch_floor_ms": f"default: {DEFAULT_FLOOR_MS} ms (median of the calibrated GPUs)",
    "dot_bf16_tflops": "not calibrated: the bf16 peak times the share of its peaks the GPU sustains",
    "dot_fp16_tflops": "not calibrated: the fp16 peak times the share of its peaks the GPU sustains",
}
