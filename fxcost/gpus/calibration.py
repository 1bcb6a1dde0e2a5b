"""GPUs as fxcost sees them before anyone measured them: the device of a leave-one-out evaluation.

A training GPU's calibration columns (``achieved_bandwidth_gbps``, ``kernel_overhead_ms`` and
``launch_floor_ms``, fit on its own elementwise rows by ``benchmarks/calibrate_devices.py``) reach
every prediction for it: the DRAM time of its tiled GEMMs, the per-op overhead an eager step hides,
the floors. A GPU nobody measured gets fallbacks instead (:mod:`fxcost.gpus.fallbacks`): the mean
achieved share of spec bandwidth of the calibrated GPUs of its memory technology, their median
overhead and floor.

:func:`uncalibrated` puts GPUs in that state for the duration, with the fallbacks taken from the
*other* calibrated GPUs, so that a left-out GPU's own measurements reach its predictions through
nothing, as they reach none of a GPU a user names that nobody measured.

Example:
    >>> with uncalibrated(["V100-PCIE-32GB"]) as (v100,):
    ...     v100.bandwidth_gbps < get_device("V100-PCIE-32GB").achieved_bandwidth_gbps
    True
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from fxcost.gpus import Device, _database, _lock, get_device, memory_family

__all__ = ["uncalibrated"]


@contextmanager
def uncalibrated(names: Iterable[str]) -> Iterator[list[Device]]:
    """The GPUs ``names`` without their calibration while the block runs, each with the fallbacks the
    other calibrated GPUs of the database give (the bandwidth share those of its memory technology
    achieve, else all of them); yields them, in the order named. Every lookup by name
    (``get_device``, a report's predictions) sees them so. Not for use while other threads predict."""
    devices, _ = _database()
    canonical = list(dict.fromkeys(get_device(name).name for name in names))
    with _lock:
        saved = {name: devices[name] for name in canonical}
        others = [d for d in devices.values() if d.name not in saved]
        for name, device in saved.items():
            alike = [d for d in others if memory_family(d.memory_type) == memory_family(device.memory_type)]
            fallback = _fallbacks(others)
            fraction = _fallbacks(alike)["fraction"] or fallback["fraction"]
            spec = device.mem_bandwidth_gbps
            devices[name] = dataclasses.replace(
                device,
                achieved_bandwidth_gbps=spec * fraction if spec and fraction else None,
                kernel_overhead_ms=fallback["overhead"],
                launch_floor_ms=fallback["floor"],
                dot_bf16_tflops=None,
                dot_fp16_tflops=None,
                calibration_source=f"uncalibrated: fallbacks of the calibrated GPUs but {', '.join(saved)}",
            )
        swapped = [devices[name] for name in canonical]
    try:
        yield swapped
    finally:
        with _lock:
            devices.update(saved)


def _fallbacks(devices: list[Device]) -> dict[str, float | None]:
    """The mean achieved share of spec bandwidth, the median kernel overhead and launch floor, of the
    ``devices`` calibrated (None where none is: the database's own defaults then apply)."""
    shares = [d.achieved_bandwidth_gbps / d.mem_bandwidth_gbps for d in devices
              if d.achieved_bandwidth_gbps and d.mem_bandwidth_gbps]  # fmt: skip
    overheads = [d.kernel_overhead_ms for d in devices if d.kernel_overhead_ms is not None]
    floors = [d.launch_floor_ms for d in devices if d.launch_floor_ms is not None]
    return {
        "fraction": statistics.fmean(shares) if shares else None,
        "overhead": statistics.median(overheads) if overheads else None,
        "floor": statistics.median(floors) if floors else None,
    }
