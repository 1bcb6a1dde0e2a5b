"""GPUs as fxcost sees them before anyone measured them: the device of a leave-one-out evaluation.

A training GPU's calibration columns (``achieved_bandwidth_gbps``, ``kernel_overhead_ms`` and
``launch_floor_ms``, fit on its own elementwise rows by ``benchmarks/calibrate_devices.py``) reach
every prediction for it: the DRAM time of its tiled GEMMs, the per-op overhead an eager step hides,
the floors. A GPU nobody measured gets fallbacks instead (:mod:`fxcost.gpus.fallbacks`): the mean
achieved share of spec bandwidth of the calibrated GPUs of its memory controller class, their median
overhead and floor.

:func:`uncalibrated_device` is a GPU in that state, its fallbacks taken from the GPUs fxcost ships
calibrated (``gpus.csv``; never a device file's, nor a held-out GPU's) but the left-out ones, so that
a left-out GPU's own measurements reach its predictions through nothing. :func:`uncalibrated` puts
such GPUs in the database for code that looks GPUs up by name (a report's predictions).

What stays fit on all five GPUs: the fallback constants themselves (for GPUs outside any fold) and the
wave-scaling L2 ramp; the heads and the GEMM fit are refit per fold.

Example:
    >>> calibrated = get_device("V100-PCIE-32GB").bandwidth_gbps  # fit on its own rows: 853 GB/s
    >>> uncalibrated_device(get_device("V100-PCIE-32GB")).bandwidth_gbps < calibrated
    True
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from fxcost.gpus import _CALIBRATION, HELD_OUT_DEVICES, Device, _database, _lock, get_device, shipped_devices
from fxcost.gpus.fallbacks import memory_family

__all__ = ["uncalibrated", "uncalibrated_device"]


class _Fallbacks(NamedTuple):
    fraction: float | None  # achieved over spec bandwidth; None: the package's default applies
    overhead_ms: float | None
    floor_ms: float | None


def uncalibrated_device(device: Device, without: Iterable[str] = ()) -> Device:
    """``device`` without its calibration, with the fallbacks of the GPUs shipped calibrated but
    ``device`` and ``without`` (canonical names): the bandwidth share those of its memory controller class
    achieve (else all of them), their median overhead and floor."""
    out = {device.name, *without}
    donors = [d for d in shipped_devices() if d.name not in out and d.name not in HELD_OUT_DEVICES]
    family = memory_family(device.memory_type, device.compute_capability)
    alike = _fallbacks([d for d in donors if memory_family(d.memory_type, d.compute_capability) == family])
    fallback = _fallbacks(donors)
    fraction = alike.fraction or fallback.fraction
    spec = device.mem_bandwidth_gbps
    values: dict[str, object] = dict.fromkeys(_CALIBRATION) | {  # every calibration column dropped
        "achieved_bandwidth_gbps": spec * fraction if spec and fraction else None,
        "kernel_overhead_ms": fallback.overhead_ms,
        "launch_floor_ms": fallback.floor_ms,
        "calibration_source": f"uncalibrated: fallbacks of the calibrated GPUs but {', '.join(sorted(out))}",
    }
    return dataclasses.replace(device, **values)  # type: ignore[arg-type]


@contextmanager
def uncalibrated(names: Iterable[str]) -> Iterator[list[Device]]:
    """The GPUs ``names`` as :func:`uncalibrated_device` makes them (each without the others too),
    in the database while the block runs; yields them, in the order named. Lookups by name
    (``get_device``, a report's predictions) see them, and caches keyed by the Device price them anew.
    For evaluation code run alone: other threads see the table change."""
    devices, _ = _database()
    canonical = list(dict.fromkeys(get_device(name).name for name in names))
    with _lock:
        saved = {name: devices[name] for name in canonical}
        swapped = {name: uncalibrated_device(device, canonical) for name, device in saved.items()}
        devices.update(swapped)
    try:
        yield list(swapped.values())
    finally:
        with _lock:
            for name, device in saved.items():
                if devices[name] is swapped[name]:  # not replaced again meanwhile (load_devices)
                    devices[name] = device


def _fallbacks(devices: list[Device]) -> _Fallbacks:
    """The mean achieved share of spec bandwidth, the median kernel overhead and launch floor, of the
    ``devices`` calibrated (None where none is)."""
    shares = [d.achieved_bandwidth_gbps / d.mem_bandwidth_gbps for d in devices
              if d.achieved_bandwidth_gbps and d.mem_bandwidth_gbps]  # fmt: skip
    overheads = [d.kernel_overhead_ms for d in devices if d.kernel_overhead_ms is not None]
    floors = [d.launch_floor_ms for d in devices if d.launch_floor_ms is not None]
    return _Fallbacks(
        statistics.fmean(shares) if shares else None,
        statistics.median(overheads) if overheads else None,
        statistics.median(floors) if floors else None,
    )
