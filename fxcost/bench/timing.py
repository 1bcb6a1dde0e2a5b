"""The one timing helper fxcost measures with, in the manner of ``triton.testing.do_bench``.

Repetitions are sized to a time budget; on CUDA each repetition is bracketed by its own pair of events
and the L2 cache is flushed outside the timed window; on the CPU a monotonic wall clock is used. The
result is the median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

__all__ = ["bench_ms"]


def bench_ms(
    fn: Callable[[], Any],
    device: torch.device,
    *,
    budget_ms: float = 25.0,
    warmup: int = 1,
    min_reps: int = 3,
    max_reps: int = 100,
) -> float:
    """Median milliseconds of ``fn()`` on ``device``.

    Args:
        fn: the work to time; called ``warmup`` times untimed, then at least ``min_reps`` times.
        device: where ``fn`` runs (CUDA events on ``cuda``, wall clock otherwise).
        budget_ms: time to spend on the timed repetitions, which sizes their count.
        warmup: untimed calls first (allocator, caches, lazy initialisation).
        min_reps, max_reps: bounds on the number of timed repetitions.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {min_reps}, {max_reps}")
    if device.type == "cuda":
        with torch.cuda.device(device):  # events and the flush on the stream of fn's device
            return _bench(fn, _CudaTimer(device), budget_ms, warmup, min_reps, max_reps)
    return _bench(fn, _WallTimer(), budget_ms, warmup, min_reps, max_reps)


def _bench(
    fn: Callable[[], Any], timer: _Timer, budget_ms: float, warmup: int, min_reps: int, max_reps: int
) -> float:
    for _ in range(warmup):
        fn()
    first = timer.time(fn)
    reps = int(min(max_reps, max(min_reps - 1, budget_ms / max(first, 1e-6))))
    times = [first] + [timer.time(fn) for _ in range(reps)]
    return statistics.median(times)


class _Timer(Protocol):
    def time(self, fn: Callable[[], Any]) -> float: ...


class _WallTimer:
    def time(self, fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3


class _CudaTimer:
    """Events per repetition; the L2 flush runs before the start event, outside the timed window."""

    def __init__(self, device: torch.device) -> None:
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        self._flush = torch.empty(max(2 * l2_bytes, 1 << 20), dtype=torch.int8, device=device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def time(self, fn: Callable[[], Any]) -> float:
        self._flush.zero_()
        self._start.record()
        fn()
        self._end.record()
        self._end.synchronize()
        return float(self._start.elapsed_time(self._end))
