"""What an eager step hides of an isolated-op prediction, and what it adds: per-op overhead and host time.

A node's predicted time is that of the op timed alone with CUDA events (how the training data and
origin traces were measured): its kernel plus a per-op overhead of launch and event latency (the
device's ``overhead_ms``, 15-27 us on the calibrated GPUs), never less than a floor. Run back to back
in an eager iteration, the GPU queue hides that overhead (:func:`kernel_ms`), and the host spends
:data:`HOST_MS` per op issuing them. :mod:`fxcost.propagate.eager` runs the two as a pipeline.
"""

from __future__ import annotations

import numpy as np

from fxcost.gpus import Device
from fxcost.gpus.order import weaker_than

__all__ = ["HOST_MS", "ISOLATED_MODELS", "MIN_KERNEL_MS", "hidden_overhead_ms", "kernel_ms", "kernel_times"]

# Host time per launched op in eager PyTorch on a server CPU: the median CUDA-event time of the
# kernel-free nodes (size, view, getitem) in the shared per-node traces, 9-12 us.
HOST_MS = 0.010

# Cost models whose predictions are isolated-op latencies (they include the per-op overhead).
ISOLATED_MODELS = frozenset({"mlp", "mlp_ratio", "wave_scaling"})

# The shortest time a kernel occupies the GPU between its neighbours.
MIN_KERNEL_MS = 0.002


def hidden_overhead_ms(device: Device) -> float:
    """The per-op overhead an eager step hides from the heads' origin-free predictions on ``device``:
    its calibrated overhead, raised to the largest of the GPUs it beats on every spec.

    The overhead is that of the harness that timed each op alone (launch, event latency), and the
    calibrated GPUs' differ by their hosts (P100 27 us, V100 18-21 us). The heads' times on a GPU are
    never above those of the GPUs it beats (the envelope), which carry those GPUs' overheads; taking
    off only the device's own, a V100's kernels came out longer than a P100's from isolated
    predictions that were shorter, and a step of small ops ran slower on the stronger GPU. Hiding at
    least what a weaker GPU hides keeps each kernel time, and so the step, in GPU order."""
    return max([device.overhead_ms, *(d.overhead_ms for d in weaker_than(device))])


def kernel_ms(
    predicted_ms: float, source: str | None, device: Device, hidden_ms: float | None = None
) -> float:
    """A node's kernel time from its predicted time by cost model ``source``: an isolated-op
    prediction less the per-op overhead eager execution hides, never below :data:`MIN_KERNEL_MS`
    (the heads' own predictions: :func:`hidden_overhead_ms`, pass it as ``hidden_ms`` in a loop;
    runtime-based ones add ``device``'s overhead to a kernel time and lose it again); other
    predictions are kernel times already."""
    if source not in ISOLATED_MODELS:
        return predicted_ms
    if source == "mlp":
        overhead = hidden_overhead_ms(device) if hidden_ms is None else hidden_ms
    else:
        overhead = device.overhead_ms
    return max(predicted_ms - overhead, MIN_KERNEL_MS)


def kernel_times(predicted_ms: np.ndarray, sources: np.ndarray, device: Device) -> np.ndarray:
    """:func:`kernel_ms` of many nodes at once (NaN stays NaN: no prediction)."""
    sources = sources.astype(str)
    overhead = np.where(sources == "mlp", hidden_overhead_ms(device), device.overhead_ms)
    isolated = np.isin(sources, list(ISOLATED_MODELS))
    return np.where(isolated, np.maximum(predicted_ms - overhead, MIN_KERNEL_MS), predicted_ms)
