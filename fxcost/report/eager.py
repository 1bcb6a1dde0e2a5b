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

The host's time per op depends on the model's Python and the machine's CPU far more than on the GPU:
on the lent H100 and H200 the steps of Hugging Face models spent 33-80 us per launched op, not 10.
A trace measured on a GPU carries the answer: :func:`origin_pipeline` finds the host time per op with
which the origin's own recorded kernels, replayed through the pipeline, take the measured step, and
predictions from that trace use it (the runtime-based premise: the same host drives the other GPU).
Where the step is GPU bound instead, its kernels ran back to back 10-24% faster than each alone
(the lent GPUs' ResNet-50 and LSTM steps), and all kernel times are scaled by that ratio. Without a
measured step the host costs :data:`HOST_MS` per op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fxcost.devices import Device, UnknownDeviceError, get_device
from fxcost.records import NodeCost, Phase
from fxcost.report import Report

__all__ = [
    "HOST_MS",
    "ISOLATED_MODELS",
    "MIN_KERNEL_MS",
    "Pipeline",
    "Span",
    "chrome_trace",
    "eager_ms",
    "kernel_ms",
    "origin_pipeline",
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


def _origin(report: Report) -> Device | None:
    try:
        return get_device(report.origin)
    except UnknownDeviceError:
        return None


def _origin_kernel_ms(node: NodeCost, origin: Device) -> float | None:
    """A node's kernel time on the origin: its recorded kernels, else its event time less overhead."""
    if node.kernel_ms is not None:
        return node.kernel_ms
    if node.origin_ms is None:
        return None
    return max(node.origin_ms - origin.overhead_ms, MIN_KERNEL_MS)


def _replay_ms(kernels: np.ndarray, host_ms: float) -> float:
    """The pipeline's end for kernel times in issue order: op ``j`` (1-based) is issued at
    ``j * host_ms``, so the last kernel ends at ``max_j (j * host_ms + sum(kernels[j-1:]))``."""
    suffix = np.cumsum(kernels[::-1])[::-1]
    return float(np.max(np.arange(1, len(kernels) + 1) * host_ms + suffix))


@dataclass(frozen=True, slots=True)
class Pipeline:
    """What a measured step says about eager execution beyond the kernels' own times.

    Attributes:
        host_ms: host time per launched op.
        kernel_scale: in-step kernel time over the recorded (isolated) kernel time: under 1 where
            the kernels of a GPU-bound step ran back to back faster than each alone (their inputs
            still in L2), else 1.
        fitted: whether a measured step determined them (else the defaults).
    """

    host_ms: float = HOST_MS
    kernel_scale: float = 1.0
    fitted: bool = False


def origin_pipeline(report: Report) -> Pipeline:
    """The :class:`Pipeline` that makes the origin's recorded kernels, replayed, last its measured step.

    Host bound (the kernels alone take less than the step): the host time per op that stretches the
    replay to the step, by bisection (the replay grows with it). GPU bound: the step only bounds the
    host, which issued every op within it (``min(HOST_MS, step / ops)``), and the kernels are scaled
    to fill exactly the step. The defaults without a GPU origin, a measured step or kernel times.
    """
    origin = _origin(report)
    if origin is None or not report.step_ms:
        return Pipeline()
    times = [_origin_kernel_ms(n, origin) for n in report.nodes if n.has_kernel]
    kernels = np.array([t for t in times if t is not None])
    if not len(kernels):
        return Pipeline()
    step = report.step_ms
    if _replay_ms(kernels, 0.0) >= step:
        host = min(HOST_MS, step / len(kernels))  # the host alone takes at most the step
        return Pipeline(host, _solve(lambda scale: _replay_ms(scale * kernels, host), step, 1.0), True)
    return Pipeline(_solve(lambda host: _replay_ms(kernels, host), step, step / len(kernels)), 1.0, True)


def _solve(replay: Callable[[float], float], step: float, high: float) -> float:
    """The ``x`` in ``[0, high]`` where the increasing ``replay(x)`` reaches ``step`` (bisection)."""
    low = 0.0
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if replay(middle) < step else (low, middle)
    return (low + high) / 2


def timeline(
    report: Report, device: str | Device, phase: Phase | None = None, host_ms: float | None = None
) -> list[Span]:
    """The kernel nodes of ``report`` (or of one phase) on ``device``'s eager timeline, in order.

    The :func:`origin_pipeline` of ``report`` scales every kernel time and gives the host time per
    op unless ``host_ms`` does. On the origin itself, nodes run for their recorded kernel times.
    """
    pipeline = origin_pipeline(report)
    if host_ms is None:
        host_ms = pipeline.host_ms
    if host_ms < 0:
        raise ValueError(f"host_ms must be >= 0, got {host_ms}")
    target = get_device(device)
    name = target.name
    on_origin = _origin(report) == target
    host = gpu = 0.0
    spans = []
    nodes = report.nodes if phase is None else [n for n in report.nodes if n.phase == phase]
    for node in nodes:
        predicted = node.pred_ms.get(name)
        if not node.has_kernel or predicted is None:
            continue
        kernel = kernel_ms(predicted, node.pred_source.get(name), target)
        if on_origin and node.kernel_ms is not None:
            kernel = node.kernel_ms
        kernel *= pipeline.kernel_scale
        host += host_ms
        start = max(gpu, host)
        gpu = start + kernel
        spans.append(Span(node, host, start, gpu))
    return spans


def eager_ms(
    report: Report, device: str | Device, phase: Phase | None = None, host_ms: float | None = None
) -> float:
    """Predicted eager iteration ms on ``device`` (or of one phase) from ``report``'s node predictions."""
    spans = timeline(report, device, phase, host_ms)
    return spans[-1].end_ms if spans else 0.0


def chrome_trace(report: Report, device: str | Device, host_ms: float | None = None) -> dict[str, Any]:
    """The predicted eager step on ``device`` as a Chrome trace (open in Perfetto or chrome://tracing):
    one track for the host issuing ops, one for the GPU stream running them, microseconds."""
    name = get_device(device).name
    spans = timeline(report, name, host_ms=host_ms)
    issue_ms = spans[0].issued_ms if spans else 0.0  # every op takes the host as long as the first
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"fxcost prediction: {name}"}},
        {"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "host (issue)"}},
        {"ph": "M", "pid": 0, "tid": 1, "name": "thread_name", "args": {"name": "GPU stream"}},
    ]
    for span in spans:
        n = span.node
        label = n.op.removeprefix("aten.").removesuffix(".default")
        args = {"node": n.name, "module": n.module, "phase": n.phase, "model": n.pred_source.get(name),
                "flops": n.flops, "bytes": n.bytes, "shapes": str(n.in_shapes)}  # fmt: skip
        events.append({"ph": "X", "pid": 0, "tid": 0, "name": label, "cat": n.phase,
                       "ts": (span.issued_ms - issue_ms) * 1e3, "dur": issue_ms * 1e3})  # fmt: skip
        events.append({"ph": "X", "pid": 0, "tid": 1, "name": label, "cat": n.phase, "args": args,
                       "ts": span.start_ms * 1e3, "dur": (span.end_ms - span.start_ms) * 1e3})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}
