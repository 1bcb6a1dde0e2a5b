"""A step as ``torch.compile`` runs it: Inductor's fused kernels, and CUDA graphs' launches.

Execution modes (``execution=`` across the API):

- ``"eager"``: every ATen op a kernel, issued by the host one by one (:mod:`fxcost.propagate.eager`).
- ``"compiled"``: Inductor's kernels (:func:`fxcost.lowering.fusion.fuse`). Attention written out op
  by op that Inductor rewrites to one fused attention kernel is priced as that kernel (its GEMMs'
  work, :mod:`fxcost.lowering.fusion_attention`). A generated kernel is
  priced by what it moves and computes, never by its members' eager times: the cost model's time
  for one memory pass of its DRAM bytes (a ``relu``-like pass through the heads,
  :func:`~fxcost.lowering.nodes.memory_pass`), no less than its FLOPs at the GPU's fp32 peak, and,
  for a kernel holding a reduction, no less than the reduction's own kernel (a row reduction is not
  faster for having a prologue). Extern kernels (GEMMs, convolutions, attention, ops run alone)
  keep their eager kernel time. The host issues each kernel as eager issues an op: its time is per
  kernel, so a compiled step has far fewer launches.
- ``"cudagraphs"``: the eager kernels replayed from a CUDA graph, with no host time between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models import ModelSpec, NodeBatch, model_chain, predict_batch
from fxcost.cost_models.eager import hidden_overhead_ms, kernel_ms, kernel_times
from fxcost.cost_models.roofline import Roofline
from fxcost.execution import EXECUTIONS, Execution, check_execution
from fxcost.gpus import Device
from fxcost.lowering.fusion import FusedKernel, reduces
from fxcost.lowering.nodes import memory_pass
from fxcost.precision import itemsize
from fxcost.propagate.eager import Pipeline
from fxcost.records import NodeCost, Phase

__all__ = [
    "EXECUTIONS",
    "Execution",
    "KernelSpan",
    "check_execution",
    "compiled_timeline",
    "fused_kernel_ms",
    "node_kernel_ms",
]


@dataclass(frozen=True, slots=True)
class KernelSpan:
    """One kernel of the compiled step on its timeline (ms from the start of the step)."""

    kernel: FusedKernel
    phase: Phase
    issued_ms: float
    start_ms: float
    end_ms: float


def node_kernel_ms(nodes: Sequence[NodeCost], device: Device, on_origin: bool = False) -> np.ndarray:
    """Each node's kernel time in an eager step on ``device`` (NaN: no prediction there); ``on_origin``:
    the nodes' recorded kernel times are ``device``'s own."""
    hidden = hidden_overhead_ms(device)
    return np.array([_eager_kernel_ms(n, device, hidden, on_origin) for n in nodes], dtype=np.float64)


def fused_kernel_ms(
    nodes: Sequence[NodeCost],
    kernels: Sequence[FusedKernel],
    eager_ms: np.ndarray,
    device: Device,
    model: ModelSpec = "auto",
    origin: Device | None = None,
) -> np.ndarray:
    """The GPU time of each kernel of ``kernels`` (fused from ``nodes``) on ``device``, in ms; NaN
    where an extern kernel's node has no prediction there. ``eager_ms``: each node's eager kernel time
    (:func:`node_kernel_ms`). ``model`` prices the generated kernels' memory passes (the roofline
    where it has no answer)."""
    out = np.full(len(kernels), np.nan)
    generated: list[int] = []
    passes: list[NodeCost] = []
    for k, kernel in enumerate(kernels):
        if kernel.kind == "extern":
            out[k] = eager_ms[kernel.members[0]]
            continue
        if kernel.kind == "attention":  # the fused attention kernel, priced as such
            node = kernel.stands_for(nodes)
        else:
            dtype = _widest_output(kernel.nodes(nodes))
            moved = kernel.bytes_read(nodes) + kernel.bytes_written(nodes)
            node = memory_pass(max(moved, itemsize(dtype)), dtype)
            node.flops = max(kernel.flops(nodes), node.flops or 0)
        generated.append(k)
        passes.append(node)
    if not passes:
        return out
    batch = NodeBatch.of(passes, origin)
    ms, sources = predict_batch(batch, model_chain(model, origin), device)
    roofline = Roofline()
    bound = roofline.predict(batch, device)
    ms = np.where(np.isfinite(ms), ms, bound)
    sources = np.where(np.isfinite(ms), sources, "roofline")
    times = kernel_times(ms, sources, device)
    # Not faster than its work at the fp32 peak (a roofline bound without the launch floor).
    compute = batch.flops / (roofline.peak_tflops(batch, device) * 1e9)
    times = np.fmax(times, compute)
    for k, t in zip(generated, times.tolist(), strict=True):
        kernel = kernels[k]
        if kernel.kind == "reduction":  # no faster than its reductions' own kernels
            own = [eager_ms[i] for i in kernel.members if reduces(nodes[i])]
            t = max([t, *(x for x in own if np.isfinite(x))])
        out[k] = t
    return out


def compiled_timeline(
    nodes: Sequence[NodeCost], kernels: Sequence[FusedKernel], times_ms: np.ndarray, pipeline: Pipeline,
    *, host_ms: float | None = None,
) -> list[KernelSpan]:  # fmt: skip
    """The kernels with a time on the compiled step's timeline, in order: the host spends its time
    per op (``host_ms``, else the pipeline's) once per kernel; the GPU runs them back to back."""
    host_per_kernel = pipeline.host_ms if host_ms is None else host_ms
    if host_per_kernel < 0:
        raise ValueError(f"host_ms must be >= 0, got {host_per_kernel}")
    host = gpu = 0.0
    spans = []
    for kernel, ms in zip(kernels, times_ms.tolist(), strict=True):
        if not np.isfinite(ms):
            continue
        host += host_per_kernel
        start = max(gpu, host)
        gpu = start + ms * pipeline.kernel_scale
        spans.append(KernelSpan(kernel, nodes[kernel.members[0]].phase, host, start, gpu))
    return spans


def _eager_kernel_ms(node: NodeCost, device: Device, hidden: float, on_origin: bool) -> float:
    if on_origin and node.kernel_ms is not None:
        return node.kernel_ms
    predicted = node.pred_ms.get(device.name)
    if predicted is None:
        return float("nan")
    return kernel_ms(predicted, node.pred_source.get(device.name), device, hidden)


def _widest_output(members: Sequence[NodeCost]) -> str:
    """The dtype of the members' largest output (float32 where none has one)."""
    best, dtype = -1, "float32"
    for n in members:
        for shape, d in zip(n.out_shapes, n.out_dtypes, strict=False):
            size = int(np.prod(shape)) if shape else 1
            if size > best:
                best, dtype = size, d
    return dtype
