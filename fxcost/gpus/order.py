"""Which GPUs of the database another one beats on every spec that sets speed.

A GPU at least as strong as another in each of :data:`STRENGTH_SPECS` and in the peak of every
precision can run anything the other runs at least as fast: the origin-free model never predicts it
slower (see :mod:`fxcost.cost_models.heads.envelope` and, for tensor-core work,
:mod:`fxcost.cost_models.heads.tensor_core`), and ``benchmarks/gpu_order.py`` checks that over a
grid of shapes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from fxcost.gpus import Device, all_devices

__all__ = [
    "STRENGTH_SPECS",
    "comparable",
    "per_database",
    "same_gpus",
    "strength",
    "stronger_than",
    "weaker_than",
]

T = TypeVar("T")
_KEPT = 4096  # GPUs per_database keeps a value for

STRENGTH_SPECS = ("fp32_tflops", "bandwidth_gbps", "num_sms", "l2_cache_mb", "boost_clock_mhz", "tdp_w")
"""Peak fp32 rate, DRAM bandwidth, SMs, L2, boost clock and power. The bandwidth is the one the GPU
achieves (calibrated, else its memory controller class's share of the spec), the one the models'
bounds use: a GPU beaten on it never prices memory traffic faster than the GPU that beats it."""


def strength(device: Device) -> tuple[float, ...] | None:
    """The :data:`STRENGTH_SPECS` of ``device`` and its TF32, fp16 and bf16 peaks (a GPU without
    tensor cores for one runs it at its fp32 peak, as the roofline does); None if a spec is unknown."""
    specs = [getattr(device, s) for s in STRENGTH_SPECS]
    if any(v is None for v in specs):
        return None
    fp32 = float(device.fp32_tflops)  # type: ignore[arg-type]
    peaks = [device.tf32_tflops or fp32, device.fp16_tflops or fp32, device.bf16_tflops or fp32]
    return (*map(float, specs), *peaks)


def weaker_than(device: Device) -> list[Device]:
    """The database's GPUs ``device`` matches or beats on every :func:`strength` value, not equal on
    all of them (GPUs with an unknown spec are comparable with none). Kept per database state: the
    eager step asks it for every price."""
    return list(_related(device)[0])


def stronger_than(device: Device) -> list[Device]:
    """The database's GPUs that match or beat ``device`` on every :func:`strength` value, not equal on
    all of them: those that count ``device`` among their :func:`weaker_than` (for a GPU of the
    database). If one GPU beats another, its own stronger GPUs beat the other too."""
    return list(_related(device)[1])


def per_database(fn: Callable[[Device], T]) -> Callable[[Device], T]:
    """``fn`` of a GPU, kept per database state: computed again once GPUs are added or changed
    (``load_devices``, :func:`fxcost.gpus.holdout.uncalibrated`). For what reads other GPUs than the
    one asked about; every eager price asks some of them for every node."""
    found: dict[Device, T] = {}
    state: list[list[Device]] = [[]]  # the database the values were found in (same_gpus)
    lock = threading.Lock()

    @functools.wraps(fn)
    def cached(device: Device) -> T:
        database = all_devices()
        with lock:
            if not same_gpus(database, state[0]):
                found.clear()
                state[0] = database
            if device in found:
                return found[device]
        value = fn(device)
        with lock:
            if same_gpus(database, state[0]):
                if len(found) >= _KEPT:  # GPUs made on the fly (dataclasses.replace), in a long sweep
                    found.clear()
                found[device] = value
        return value

    return cached


def same_gpus(a: Sequence[Device], b: Sequence[Device]) -> bool:
    """Whether two readings of :func:`~fxcost.gpus.all_devices` hold the same GPU objects: what is kept
    per database state holds the GPUs it was found in, so that no freed one's address passes for one."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


@per_database
def _related(device: Device) -> tuple[list[Device], list[Device]]:
    """(weaker, stronger) GPUs of the database."""
    mine = strength(device)
    if mine is None:
        return [], []
    weaker, stronger = [], []
    for other in all_devices():
        theirs = strength(other)
        if other.name == device.name or theirs is None or mine == theirs:
            continue
        if all(a >= b for a, b in zip(mine, theirs, strict=True)):
            weaker.append(other)
        elif all(a <= b for a, b in zip(mine, theirs, strict=True)):
            stronger.append(other)
    return weaker, stronger


def comparable() -> list[Device]:
    """The database's GPUs that know every strength spec (the ones :func:`weaker_than` compares)."""
    return [d for d in all_devices() if strength(d) is not None]
