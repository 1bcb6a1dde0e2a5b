"""Kernels bound by memory latency: a block's threads each wait for one load at a time.

By Little's law a block of ``T`` threads, each with one load of ``w`` bytes in flight, moves
``T·w / latency`` bytes a second, whatever bandwidth the GPU has. Batch norm's per-channel kernels
(``lowering.batch_norm``) are such kernels: 512 threads a channel, one dependent load an iteration,
so a channel takes its threads' round trips (``KernelSpec.round_trips``) times the DRAM latency
(``gpus.memory_latency``), and the kernel as many of those as it has waves of blocks:

    T_latency = ceil(blocks / (blocks per SM x SMs)) x round trips x DRAM latency

The heads take the larger of this, plus the per-op overhead their times carry, and their
bandwidth-bound time. A GPU without a published latency has no latency term of its own; like any
GPU, it is never priced faster than a GPU that beats it on every spec (``gpus.order``), so its floor
is the largest of those GPUs'. Each GPU's floor carries that GPU's own overhead, as fused attention's
time does (``heads.model``): the overhead an eager step hides grows with the GPUs a GPU beats, so the
kernel times stay in GPU order too.
"""

from __future__ import annotations

import functools
import math

from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.gpus import Device
from fxcost.gpus.memory_latency import dram_latency_ns
from fxcost.gpus.occupancy import Launch, wave_size
from fxcost.gpus.order import stronger_than
from fxcost.lowering import KernelSpec

__all__ = ["latency_floor_ms", "own_latency_ms"]


def own_latency_ms(spec: KernelSpec, device: Device) -> float:
    """``spec``'s latency-bound time on ``device`` in ms; NaN where it declares no round trips, the
    architecture has no DRAM latency, or the launch cannot be placed."""
    return _latency_ms(spec.round_trips, spec.launch, device) if spec.round_trips else math.nan


@functools.lru_cache(maxsize=1 << 14)  # a floor reads every GPU that beats the target, for every kernel
def _latency_ms(round_trips: int, launch: Launch, device: Device) -> float:
    latency_ns = dram_latency_ns(device)
    if latency_ns is None:
        return math.nan
    try:
        waves = math.ceil(launch.blocks / wave_size(device, launch))
    except ValueError:
        return math.nan
    return waves * round_trips * latency_ns * 1e-6


def latency_floor_ms(spec: KernelSpec, device: Device) -> float:
    """The shortest time ``spec`` is priced at on ``device`` as an op timed alone: the largest
    :func:`own_latency_ms` plus per-op overhead (:func:`~fxcost.cost_models.eager.hidden_overhead_ms`)
    of ``device`` and of every GPU that beats it; NaN where none knows a latency."""
    owns = ((own_latency_ms(spec, d), d) for d in (device, *stronger_than(device)))
    known = [own + hidden_overhead_ms(d) for own, d in owns if not math.isnan(own)]
    return max(known) if known else math.nan
