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

from dataclasses import dataclass
from typing import Any

from fxcost.devices import Device, get_device
from fxcost.records import NodeCost, Phase
from fxcost.report import Report

__all__ = [
    "HOST_MS",
    "ISOLATED_MODELS",
    "MIN_KERNEL_MS",
    "Span",
    "chrome_trace",
    "eager_ms",
    "kernel_ms",
    "timeline",
]

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


@dataclass(frozen=True, slots=True)
class Span:
    """One kernel node on the predicted eager timeline (ms from the start of the step)."""

    node: NodeCost
    issued_ms: float  # when the host finished issuing it
    start_ms: float  # when the GPU starts it
    end_ms: float


def timeline(
    report: Report, device: str | Device, phase: Phase | None = None, host_ms: float = HOST_MS
) -> list[Span]:
    """The kernel nodes of ``report`` (or of one phase) on ``device``'s eager timeline, in order."""
    if host_ms < 0:
        raise ValueError(f"host_ms must be >= 0, got {host_ms}")
    target = get_device(device)
    name = target.name
    host = gpu = 0.0
    spans = []
    nodes = report.nodes if phase is None else [n for n in report.nodes if n.phase == phase]
    for node in nodes:
        predicted = node.pred_ms.get(name)
        if not node.has_kernel or predicted is None:
            continue
        kernel = kernel_ms(predicted, node.pred_source.get(name), target)
        host += host_ms
        start = max(gpu, host)
        gpu = start + kernel
        spans.append(Span(node, host, start, gpu))
    return spans


def eager_ms(
    report: Report, device: str | Device, phase: Phase | None = None, host_ms: float = HOST_MS
) -> float:
    """Predicted eager iteration ms on ``device`` (or of one phase) from ``report``'s node predictions."""
    spans = timeline(report, device, phase, host_ms)
    return spans[-1].end_ms if spans else 0.0


def chrome_trace(report: Report, device: str | Device, host_ms: float = HOST_MS) -> dict[str, Any]:
    """The predicted eager step on ``device`` as a Chrome trace (open in Perfetto or chrome://tracing):
    one track for the host issuing ops, one for the GPU stream running them, microseconds."""
    name = get_device(device).name
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"fxcost prediction: {name}"}},
        {"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "host (issue)"}},
        {"ph": "M", "pid": 0, "tid": 1, "name": "thread_name", "args": {"name": "GPU stream"}},
    ]
    for span in timeline(report, name, host_ms=host_ms):
        n = span.node
        label = n.op.removeprefix("aten.").removesuffix(".default")
        args = {"node": n.name, "module": n.module, "phase": n.phase, "model": n.pred_source.get(name),
                "flops": n.flops, "bytes": n.bytes, "shapes": str(n.in_shapes)}  # fmt: skip
        events.append({"ph": "X", "pid": 0, "tid": 0, "name": label, "cat": n.phase,
                       "ts": (span.issued_ms - host_ms) * 1e3, "dur": host_ms * 1e3})  # fmt: skip
        events.append({"ph": "X", "pid": 0, "tid": 1, "name": label, "cat": n.phase, "args": args,
                       "ts": span.start_ms * 1e3, "dur": (span.end_ms - span.start_ms) * 1e3})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}
