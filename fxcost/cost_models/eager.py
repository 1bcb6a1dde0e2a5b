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

__all__ = ["HOST_MS", "ISOLATED_MODELS", "MIN_KERNEL_MS", "kernel_ms", "kernel_times"]

# Host time per launched op in eager PyTorch on a server CPU: the median CUDA-event time of the
# kernel-free nodes (size, view, getitem) in the shared per-node traces, 9-12 us.
HOST_MS = 0.010

# Cost models whose predictions are isolated-op latencies (they include the per-op overhead).
ISOLATED_MODELS = frozenset({"mlp", "mlp_ratio", "wave_scaling"})

# The shortest time a kernel occupies the GPU between its neighbours.
MIN_KERNEL_MS = 0.002


def kernel_ms(predicted_ms: float, source: str | None, device: Device) -> float:
    """A node's kernel time from its predicted time by cost model ``source``: an isolated-op
    prediction less ``device``'s per-op overhead, which eager execution hides (never below
    :data:`MIN_KERNEL_MS`); other predictions are kernel times already."""
    if source in ISOLATED_MODELS:
        return max(predicted_ms - device.overhead_ms, MIN_KERNEL_MS)
    return predicted_ms


def kernel_times(predicted_ms: np.ndarray, sources: np.ndarray, device: Device) -> np.ndarray:
    """:func:`kernel_ms` of many nodes at once (NaN stays NaN: no prediction)."""
    isolated = np.isin(sources.astype(str), list(ISOLATED_MODELS))
    return np.where(isolated, np.maximum(predicted_ms - device.overhead_ms, MIN_KERNEL_MS), predicted_ms)
