"""What eager execution makes of the per-node times: the host issuing kernels, the GPU running them.

A node's predicted time is that of the op timed alone with CUDA events (how the training data and
origin traces were measured): its kernel plus a per-op overhead of launch and event latency (the
device's ``overhead_ms``, 15-27 us on the calibrated GPUs), never less than a floor. Run back to back
in an eager iteration, the GPU queue hides that overhead: kernels start when the previous one ends,
as long as the host issues them fast enough. The host spends ``host_ms`` per op (Python, dispatcher,
launch); when kernels are shorter, the GPU waits and the host time bounds the iteration.

:func:`eager_ms` simulates that two-stage pipeline node by node in program order: the host issues
node ``i`` at ``t_host += host_ms``; the GPU runs it from ``max(gpu_free, t_host)`` for its kernel time.
Its result is the iteration time an eager run measures with events around the whole step.
"""

from __future__ import annotations

from fxcost.devices import Device, get_device
from fxcost.records import Phase
from fxcost.report import Report

__all__ = ["HOST_MS", "ISOLATED_MODELS", "eager_ms"]

# Host time per launched op in eager PyTorch on a server CPU: the median CUDA-event time of the
# kernel-free nodes (size, view, getitem) in the shared per-node traces, 9-12 us.
HOST_MS = 0.010

# Cost models whose predictions are isolated-op latencies (they include the per-op overhead).
ISOLATED_MODELS = frozenset({"mlp", "mlp_ratio", "wave_scaling"})

# The shortest time a kernel occupies the GPU between its neighbours.
MIN_KERNEL_MS = 0.002


def eager_ms(
    report: Report, device: str | Device, phase: Phase | None = None, host_ms: float = HOST_MS
) -> float:
    """Predicted eager iteration ms on ``device`` (or of one phase) from ``report``'s node predictions."""
    if host_ms < 0:
        raise ValueError(f"host_ms must be >= 0, got {host_ms}")
    target = get_device(device)
    name = target.name
    host = gpu = 0.0
    nodes = report.nodes if phase is None else [n for n in report.nodes if n.phase == phase]
    for node in nodes:
        predicted = node.pred_ms.get(name)
        if not node.has_kernel or predicted is None:
            continue
        isolated = node.pred_source.get(name) in ISOLATED_MODELS
        kernel = max(predicted - target.overhead_ms, MIN_KERNEL_MS) if isolated else predicted
        host += host_ms
        gpu = max(gpu, host) + kernel
    return gpu
