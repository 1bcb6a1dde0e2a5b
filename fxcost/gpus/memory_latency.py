"""DRAM latency per GPU architecture, from published microbenchmarks (``memory_latency.csv``).

The time a load waits for DRAM when it misses the caches: a kernel whose threads each keep one load in
flight and wait for it (batch norm's per-channel kernels, ``lowering.batch_norm``) moves its data at
``threads x bytes / latency`` however much bandwidth the GPU has (Little's law). Keyed by compute
capability, since the memory system is the architecture's; a value with a trailing ``?`` is
unconfirmed (as in ``gpus.csv``). An architecture without a row has no latency: unknown, not zero.
"""

from __future__ import annotations

import functools

from fxcost.gpus import Device
from fxcost.gpus.sourced import read_sourced

__all__ = ["dram_latency_ns", "latency_source"]


def dram_latency_ns(device: Device) -> float | None:
    """The DRAM latency of ``device``'s architecture in nanoseconds, None where no source gives one."""
    row = _table().get(device.compute_capability or "")
    return None if row is None else row[0]


def latency_source(device: Device) -> str:
    """Where :func:`dram_latency_ns` of ``device`` comes from ("unknown" where it has none)."""
    row = _table().get(device.compute_capability or "")
    return "unknown" if row is None else row[1]


@functools.cache
def _table() -> dict[str, tuple[float, str]]:
    return read_sourced("memory_latency.csv", "compute_capability", "dram_latency_ns",
                        lambda row: row["sources"].strip())  # fmt: skip
