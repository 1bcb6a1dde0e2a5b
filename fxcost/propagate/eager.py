"""What eager execution makes of the per-node times: the host issuing kernels, the GPU running them.

A node's predicted time is that of the op timed alone (see :mod:`fxcost.cost_models.eager`); run back
to back in an eager iteration, the GPU queue hides its per-op overhead, as long as the host issues
kernels fast enough. The host spends ``host_ms`` per op (Python, dispatcher, launch); when kernels
are shorter, the GPU waits and the host time bounds the iteration.

:func:`timeline` simulates that two-stage pipeline node by node in program order: the host issues
node ``i`` at ``t_host += host_ms``; the GPU runs it from ``max(gpu_free, t_host)`` for its kernel time.
Its end is the iteration time an eager run measures with events around the whole step.
:func:`critical_path_ms` runs the same kernels, issued at the same times, on as many streams as the
step's data dependencies allow; each node starts no earlier than on the one-stream timeline, so the
critical path never exceeds the eager step.

The host's time per op depends on the model's Python and the machine's CPU far more than on the GPU:
on the lent H100 and H200 the steps of Hugging Face models spent 33-80 us per launched op, not 10.
A trace measured on a GPU carries the answer: :func:`origin_pipeline` finds the host time per op with
which the origin's own recorded kernels, replayed through the pipeline, take the measured step, and
predictions from that trace use it (the runtime-based premise: the same host drives the other GPU).
Where the step is GPU bound instead, its kernels ran back to back 10-24% faster than each alone
(the lent GPUs' ResNet-50 and LSTM steps), and all kernel times are scaled by that ratio. Without a
measured step the host costs :data:`~fxcost.cost_models.eager.HOST_MS` per op. A ratio beyond what
inputs found in L2 can explain marks a capture whose kernels are not those the step ran
(``Pipeline.l2_explained``): BERT-large's H100 capture, whose attention was decomposed into math
kernels 2.3 times the step that ran the fused one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.eager import HOST_MS, MIN_KERNEL_MS, hidden_overhead_ms, kernel_ms, node_dram_floor_ms
from fxcost.gpus import Device
from fxcost.records import NodeCost

__all__ = [
    "Pipeline",
    "Span",
    "checked_host_ms",
    "critical_path_ms",
    "eager_kernel_ms",
    "issue_bound_ms",
    "l2_scale_floor",
    "origin_pipeline",
    "replay_ends",
    "replay_ms",
    "timeline",
]


@dataclass(frozen=True, slots=True)
class Span:
    """One kernel node on the predicted eager timeline (ms from the start of the step)."""

    node: NodeCost
    issued_ms: float  # when the host finished issuing it
    start_ms: float  # when the GPU starts it
    end_ms: float


@dataclass(frozen=True, slots=True)
class Pipeline:
    """What a measured step says about eager execution beyond the kernels' own times.

    Attributes:
        host_ms: host time per launched op.
        kernel_scale: in-step kernel time over the recorded (isolated) kernel time: under 1 where
            the kernels of a GPU-bound step ran back to back faster than each alone (their inputs
            still in L2), else 1.
        fitted: whether a measured step determined them (else the defaults).
        l2_explained: whether inputs found in L2 can explain ``kernel_scale``: at most, each kernel
            reading from L2 as much of its input as L2 holds, instead of from DRAM
            (:func:`l2_scale_floor`). Where they cannot, the recorded kernels are not the kernels
            the step ran (a capture that decomposed what ran fused), and the scale describes no
            in-step speed-up that other kernels of the step would share.
    """

    host_ms: float = HOST_MS
    kernel_scale: float = 1.0
    fitted: bool = False
    l2_explained: bool = True


def origin_pipeline(nodes: Sequence[NodeCost], origin: Device | None, step_ms: float | None) -> Pipeline:
    """The :class:`Pipeline` that makes the ``origin``'s recorded kernels of ``nodes``, replayed, last
    its measured step ``step_ms``.

    Host bound (the kernels alone take less than the step): the host time per op that stretches the
    replay to the step, by bisection (the replay grows with it). GPU bound: the step only bounds the
    host, which issued every op within it (``min(HOST_MS, step / ops)``, or where that alone fills
    the step, the host time that keeps pace with the kernels), and the kernels are scaled to fill
    exactly the step. The defaults without a GPU
    origin, a measured step or kernel times.
    """
    if origin is None or not step_ms:
        return Pipeline()
    timed = [(n, t) for n in nodes if n.has_kernel and (t := _origin_kernel_ms(n, origin)) is not None]
    kernels = np.array([t for _, t in timed])
    if not len(kernels):
        return Pipeline()
    if replay_ms(kernels, 0.0) >= step_ms:
        host = min(HOST_MS, step_ms / len(kernels))  # the host alone takes at most the step
        if host * len(kernels) < step_ms:
            scale = _solve(lambda scale: replay_ms(scale * kernels, host), step_ms, 1.0)
        else:
            # The host alone would fill the step, leaving the kernels no time: it kept pace with
            # them instead, issuing each op while the previous kernel ran. The largest host time
            # per op that, with the kernels filling the rest of the step, delays none of them.
            total = float(kernels.sum())

            def paced(h: float) -> float:
                return replay_ms((step_ms - h) / total * kernels, h)

            host = _solve(paced, step_ms * (1 + 1e-9), step_ms / len(kernels))
            scale = (step_ms - host) / total
        floor = l2_scale_floor([n for n, _ in timed], kernels, origin)
        return Pipeline(host, scale, True, l2_explained=scale >= floor)
    return Pipeline(_solve(lambda host: replay_ms(kernels, host), step_ms, step_ms / len(kernels)), 1.0, True)


def l2_scale_floor(nodes: Sequence[NodeCost], kernels_ms: np.ndarray, device: Device) -> float:
    """The smallest in-step kernel scale inputs found in L2 can explain for ``nodes`` (their recorded
    kernel times ``kernels_ms``) on ``device``: each kernel saving at most the DRAM time of as much
    of what it reads as L2 holds. 0 (anything explained) without the device's L2 size or bandwidth."""
    total = float(np.sum(kernels_ms))
    bandwidth, l2_bytes = device.bandwidth_gbps, device.l2_bytes
    if not l2_bytes or not bandwidth or total <= 0:
        return 0.0
    read = np.array([min(float(n.bytes_read or 0), l2_bytes) for n in nodes])
    saved = np.minimum(read / (bandwidth * 1e6), kernels_ms)
    return 1.0 - float(saved.sum()) / total


def timeline(
    nodes: Sequence[NodeCost], device: Device, pipeline: Pipeline, *, host_ms: float | None = None,
    on_origin: bool = False,
) -> list[Span]:  # fmt: skip
    """The kernel nodes of ``nodes`` with a prediction on ``device`` on its eager timeline, in order.

    ``pipeline`` scales every kernel time and gives the host time per op unless ``host_ms`` does.
    ``on_origin``: ``device`` is the GPU the nodes were measured on, where they run for their
    recorded kernel times.
    """
    host_per_op = checked_host_ms(host_ms, pipeline.host_ms)
    host = gpu = 0.0
    spans = []
    for node, kernel in _kernels(nodes, device, pipeline, on_origin):
        host += host_per_op
        start = max(gpu, host)
        gpu = start + kernel
        spans.append(Span(node, host, start, gpu))
    return spans


def critical_path_ms(
    nodes: Sequence[NodeCost], device: Device, pipeline: Pipeline, *, host_ms: float | None = None,
    on_origin: bool = False,
) -> float:  # fmt: skip
    """The step's end if every kernel of :func:`timeline` ran as soon as the host issued it and its
    inputs were done, on as many streams as it takes; graph after graph (a graph starts when the
    previous one has finished). A node starts no earlier on the timeline's one stream, so this never
    exceeds the eager step. Kernel-free nodes (views) pass their inputs' end on; nodes without
    recorded inputs wait only for their issue."""
    kernels = dict((id(node), kernel) for node, kernel in _kernels(nodes, device, pipeline, on_origin))
    host_per_op = checked_host_ms(host_ms, pipeline.host_ms)
    host = barrier = end = 0.0
    graph = None
    finish: dict[str, float] = {}  # node name -> when its result is ready, in the current graph
    for node in nodes:
        if node.graph != graph:
            graph, barrier, finish = node.graph, end, {}
        ready = max((finish.get(i, barrier) for i in node.inputs), default=barrier)
        kernel = kernels.get(id(node))
        if kernel is not None:
            host += host_per_op
            ready = max(ready, host) + kernel
        finish[node.name] = ready
        end = max(end, ready)
    return end


def _kernels(
    nodes: Sequence[NodeCost], device: Device, pipeline: Pipeline, on_origin: bool
) -> Iterator[tuple[NodeCost, float]]:
    """The kernel nodes with a prediction on ``device``, in order, with the time their kernel runs
    in an eager step (see :func:`timeline`)."""
    hidden = hidden_overhead_ms(device)
    for node in nodes:
        kernel = eager_kernel_ms(node, device, hidden, on_origin) if node.has_kernel else None
        if kernel is not None and node.pred_ms.get(device.name) is not None:
            yield node, kernel * pipeline.kernel_scale


def eager_kernel_ms(
    node: NodeCost, device: Device, hidden_ms: float, on_origin: bool = False
) -> float | None:
    """A node's kernel time in an eager step on ``device``: its recorded kernels where ``device`` is
    the origin that timed them, else its prediction less the per-op overhead ``hidden_ms`` an eager
    step hides (:func:`~fxcost.cost_models.eager.kernel_ms`, never below the node's DRAM floor); None
    without a prediction there."""
    if on_origin and node.kernel_ms is not None:
        return node.kernel_ms
    predicted = node.pred_ms.get(device.name)
    if predicted is None:
        return None
    return kernel_ms(
        predicted, node.pred_source.get(device.name), device, hidden_ms, node_dram_floor_ms(node, device)
    )


def checked_host_ms(host_ms: float | None, default: float) -> float:
    """The host time per op: ``host_ms`` where given (never negative), else ``default``."""
    if host_ms is None:
        return default
    if host_ms < 0:
        raise ValueError(f"host_ms must be >= 0, got {host_ms}")
    return host_ms


def issue_bound_ms(gpu_ms: float, ops: int, host_ms: float = HOST_MS) -> float:
    """A run of ``ops`` kernels taking ``gpu_ms`` on the GPU lasts at least as long as the host takes
    to issue them."""
    return max(gpu_ms, ops * host_ms)


def _origin_kernel_ms(node: NodeCost, origin: Device) -> float | None:
    """A node's kernel time on the origin: its recorded kernels, else its event time less overhead."""
    if node.kernel_ms is not None:
        return node.kernel_ms
    if node.origin_ms is None:
        return None
    return max(node.origin_ms - origin.overhead_ms, MIN_KERNEL_MS)


def replay_ms(kernels: np.ndarray, host_ms: float) -> float:
    """The eager pipeline's end for kernel times in issue order (0 for none)."""
    return float(replay_ends(kernels, host_ms)[-1]) if len(kernels) else 0.0


def replay_ends(kernels: np.ndarray, host_ms: float | np.ndarray) -> np.ndarray:
    """When each kernel ends in the eager pipeline, kernel times in issue order: op ``j`` (1-based) is
    issued at ``j * host_ms`` and kernel ``i`` ends at ``max_{j <= i} (j * host_ms + sum(kernels[j-1:i]))``,
    a prefix sum plus a running maximum. ``host_ms`` per kernel where an array (a kernel that is
    several launches costs the host each): op ``j`` is issued once the host spent the first ``j``."""
    prefix = np.cumsum(kernels)
    issued = np.cumsum(np.broadcast_to(host_ms, np.shape(kernels)))
    return prefix + np.maximum.accumulate(issued - (prefix - kernels))


def _solve(replay: Callable[[float], float], step: float, high: float) -> float:
    """The ``x`` in ``[0, high]`` where the increasing ``replay(x)`` reaches ``step`` (bisection)."""
    low = 0.0
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if replay(middle) < step else (low, middle)
    return (low + high) / 2
