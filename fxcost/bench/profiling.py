"""Kernel metadata from torch.profiler: which kernels each graph node launched, with launch configs.

Nodes are bracketed by ``record_function("fxcost::<node>")`` ranges. In the profiler's Chrome trace a
kernel event and the runtime call that launched it share a ``correlation`` id; the launch happens on
the host inside the node's range, so each kernel is assigned to the range that contains its launch.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fxcost.records import KernelRecord

__all__ = ["RANGE_PREFIX", "kernel_range", "kernels_by_range", "kernels_from_profiler", "recording_kernels"]

RANGE_PREFIX = "fxcost::"

# Kernels are launched through the runtime (cudaLaunchKernel) or, by cuBLASLt and Triton, the driver.
_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})


@contextmanager
def recording_kernels(device: Any = None) -> Iterator[dict[str, list[KernelRecord]]]:
    """Profile the CUDA work inside the block; on exit, once ``device`` (default: the current one) is
    synchronized, the yielded dict holds the kernels of each :func:`kernel_range` opened inside it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    kernels: dict[str, list[KernelRecord]] = {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield kernels
        torch.cuda.synchronize(device)
    kernels.update(kernels_from_profiler(prof))


def kernel_range(name: str) -> Any:
    """The range whose kernels :func:`recording_kernels` reports under ``name``."""
    from torch.profiler import record_function

    return record_function(RANGE_PREFIX + name)


def kernels_from_profiler(prof: Any) -> dict[str, list[KernelRecord]]:
    """Kernels per ``fxcost::`` range of a finished ``torch.profiler.profile``."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return kernels_by_range(trace)


def kernels_by_range(trace: dict[str, Any]) -> dict[str, list[KernelRecord]]:
    """Assign the kernels of a Chrome trace (``{"traceEvents": [...]}``) to ``fxcost::`` ranges.

    Returns a map from range name (without the prefix) to its kernels in launch order.
    """
    events = trace.get("traceEvents", [])
    ranges = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"][len(RANGE_PREFIX) :])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and str(e.get("name", "")).startswith(RANGE_PREFIX)
    )
    launches = {
        e["args"]["correlation"]: float(e["ts"])
        for e in events
        if e.get("cat") in _LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    starts = [r[0] for r in ranges]
    found: dict[str, list[tuple[float, KernelRecord]]] = defaultdict(list)
    for e in events:
        if e.get("cat") != "kernel":
            continue
        args = e.get("args", {})
        launched = launches.get(args.get("correlation"))
        if launched is None:
            continue
        i = bisect.bisect_right(starts, launched) - 1
        if i < 0 or launched > ranges[i][1]:
            continue
        found[ranges[i][2]].append((launched, _kernel(e)))
    return {name: [k for _, k in sorted(ks, key=lambda x: x[0])] for name, ks in found.items()}


def _kernel(event: dict[str, Any]) -> KernelRecord:
    args = event.get("args", {})
    grid, block = args.get("grid"), args.get("block")
    return KernelRecord(
        name=str(event["name"]),
        duration_ms=float(event.get("dur", 0.0)) / 1e3,
        grid=tuple(int(v) for v in grid) if grid else None,  # type: ignore[arg-type]
        block=tuple(int(v) for v in block) if block else None,  # type: ignore[arg-type]
        registers_per_thread=_int_or_none(args.get("registers per thread")),
        shared_memory_bytes=_int_or_none(args.get("shared memory")),
    )


def _int_or_none(x: Any) -> int | None:
    return None if x is None else int(x)
