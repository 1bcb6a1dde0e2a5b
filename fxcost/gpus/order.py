"""Which GPUs of the database another one beats on every spec that sets speed.

A GPU at least as strong as another in each of :data:`STRENGTH_SPECS` can run anything the other
runs at least as fast: the origin-free model never predicts it slower (see
:mod:`fxcost.cost_models.heads.axis`), and ``benchmarks/gpu_order.py`` checks that over a grid of
shapes.
"""

from __future__ import annotations

from fxcost.gpus import Device, all_devices

__all__ = ["STRENGTH_SPECS", "comparable", "weaker_than"]

STRENGTH_SPECS = ("fp32_tflops", "mem_bandwidth_gbps", "num_sms", "l2_cache_mb", "boost_clock_mhz", "tdp_w")
"""Peak fp32 rate, DRAM bandwidth, SMs, L2, boost clock and power: what the origin-free model reads."""


def weaker_than(device: Device) -> list[Device]:
    """The database's GPUs ``device`` matches or beats on every strength spec, not equal on all of them
    (GPUs with an unknown spec are comparable with none)."""
    mine = [getattr(device, s) for s in STRENGTH_SPECS]
    if any(v is None for v in mine):
        return []
    weaker = []
    for other in all_devices():
        theirs = [getattr(other, s) for s in STRENGTH_SPECS]
        if other.name == device.name or any(v is None for v in theirs):
            continue
        if all(a >= b for a, b in zip(mine, theirs, strict=True)) and mine != theirs:
            weaker.append(other)
    return weaker


def comparable() -> list[Device]:
    """The database's GPUs that know every strength spec (the ones :func:`weaker_than` compares)."""
    return [d for d in all_devices() if all(getattr(d, s) is not None for s in STRENGTH_SPECS)]
