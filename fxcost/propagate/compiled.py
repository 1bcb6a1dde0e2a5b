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
  faster for having a prologue); a split batch norm's kernel
  (:meth:`~fxcost.lowering.fusion.FusedKernel.splits`) moves its input twice and adds its final
  reductions' kernels and their launches. Extern kernels (GEMMs, convolutions, attention, ops run
  alone) keep their eager kernel time, but for a GEMM with a dimension not a multiple of 16 bytes, which
  Inductor pads where that is faster (:mod:`fxcost.lowering.fusion_padding`): the aligned GEMM and
  its operands' copies, as predicted on the device, where more than 1.1 times faster.
- Layout: where Inductor runs a conv net channels-last (:func:`~fxcost.lowering.fusion_layout.channels_last`),
  a convolution measured on the GPU predicted keeps its recorded kernels but cuDNN's NCHW/NHWC
  transposes, and a batch norm's kernel is not held to ATen's NCHW batch-norm kernel (Inductor
  decomposes it into its own reductions over channels-last data). Predicted on another GPU, a
  convolution's time scaled from its recording keeps the recording's share without transposes, and
  the tensor-core model's (origin-free) is priced on channels-last tensors instead
  (:meth:`~fxcost.cost_models.heads.tensor_core.TiledGemms.layout_savings_ms`: nothing transposed, a
  1x1 convolution as the implicit GEMM, not a GEMM per image).
- Host: Inductor's generated wrapper calls each kernel directly (a Triton launcher, or an ATen op
  for a library call), without the model's Python and the per-op work of eager mode, which the host
  time fitted on a measured eager step holds. Each kernel costs the host one launch,
  :data:`~fxcost.cost_models.eager.HOST_MS` (a Python call into a C++ op), or the fitted eager time
  per op where that is smaller (the eager host issued every op faster).

What the captured graphs decide is what Inductor compiles: both see the same ATen graphs. Where
Dynamo decomposed ``scaled_dot_product_attention`` to its math form (BERT-large's H100 capture:
``bmm``, ``_safe_softmax``, ``bmm``, in fp32 because the math path upcasts bf16 unless
``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp``), the compiled step ran that math too
(fp32 ``sm80_xmma_gemm_f32f32`` GEMMs and ``triton_per_fused__safe_softmax`` kernels), slower than
the eager step that ran the fused kernel. The compiled prediction follows the capture. The kernel
scale fitted on the eager step (:class:`~fxcost.propagate.eager.Pipeline`) scales the compiled
kernels only where inputs found in L2 explain it (``l2_explained``): BERT's 0.44 (the recorded math
kernels add up to far more than the step that ran the fused one) says the capture is not the step
that was timed, and is not applied.
- ``"cudagraphs"``: the eager kernels replayed from a CUDA graph, with no host time between them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models import ModelSpec, NodeBatch, model_chain, predict_batch
from fxcost.cost_models.eager import HOST_MS, MIN_KERNEL_MS, hidden_overhead_ms, kernel_times
from fxcost.cost_models.heads import default_heads
from fxcost.cost_models.heads.tensor_work import CONVOLUTIONS, LayoutWorks, layout_works
from fxcost.cost_models.roofline import Roofline
from fxcost.execution import EXECUTIONS, Execution, check_execution
from fxcost.gpus import Device
from fxcost.lowering.fusion import FusedKernel, reduces
from fxcost.lowering.fusion_layout import layout_transpose_ms
from fxcost.lowering.fusion_padding import PAD_SPEEDUP, PaddedGemm, compute_bound, padded_gemm
from fxcost.lowering.fusion_rules import CHANNEL_REDUCTIONS, launches_of
from fxcost.lowering.nodes import memory_pass
from fxcost.lowering.row_ops import reduction_part
from fxcost.precision import itemsize
from fxcost.propagate.eager import Pipeline, checked_host_ms, eager_kernel_ms, replay_ends
from fxcost.records import NodeCost, Phase

__all__ = [
    "EXECUTIONS",
    "Execution",
    "KernelSpan",
    "KernelWork",
    "check_execution",
    "compiled_host_ms",
    "compiled_timeline",
    "fused_kernel_ms",
    "kernel_work",
    "node_kernel_ms",
    "without_layout_transposes",
]


@dataclass(frozen=True, slots=True)
class KernelSpan:
    """One kernel of the compiled step on its timeline (ms from the start of the step)."""

    kernel: FusedKernel
    phase: Phase
    issued_ms: float
    start_ms: float
    end_ms: float
    launches: int = 1  # more for split reductions (FusedKernel.launches)


def node_kernel_ms(
    nodes: Sequence[NodeCost], device: Device, on_origin: bool = False, channels_last: bool = False
) -> np.ndarray:
    """Each node's kernel time in an eager step on ``device`` (NaN: no prediction there); ``on_origin``:
    the nodes' recorded kernel times are ``device``'s own. ``channels_last``: the step runs its
    convolutions channels-last, so a recorded convolution's layout transposes do not run."""
    hidden = hidden_overhead_ms(device)
    ms = np.array(
        [eager_kernel_ms(n, device, hidden, on_origin) for n in nodes], dtype=np.float64
    )  # None: NaN
    return without_layout_transposes(nodes, ms, device, on_origin) if channels_last else ms


def without_layout_transposes(
    nodes: Sequence[NodeCost], ms: np.ndarray, device: Device, on_origin: bool = False,
    sources: Sequence[str | None] | None = None, works: LayoutWorks | None = None,
) -> np.ndarray:  # fmt: skip
    """``ms`` (each node's eager kernel time on ``device``) with the layout transposes a channels-last
    step does not run taken off its convolutions; ``sources``: the models that priced each node (its
    ``pred_source`` on ``device`` where not given); ``works``: :func:`layout_works` of ``nodes``, where
    the caller keeps them across GPUs."""
    out = np.array(ms, dtype=np.float64)
    convs = [i for i, n in enumerate(nodes) if n.op in CONVOLUTIONS and np.isfinite(out[i])]
    if not convs:
        return out
    source = {i: nodes[i].pred_source.get(device.name) if sources is None else sources[i] for i in convs}
    modelled = {i for i in convs if source[i] == "mlp"}  # the tensor-core model's, origin-free
    found = [w for w in (layout_works(nodes) if works is None else works) if w[0] in modelled]
    saved = default_heads().tiled.layout_savings_ms(nodes, device, found)
    for i in convs:
        n = nodes[i]
        if on_origin and n.kernel_ms is not None:  # the recorded kernels but the transposes
            kept = n.kernel_ms - layout_transpose_ms(n)
        elif source[i] in _SCALED_FROM_ORIGIN and n.kernel_ms:  # the recording's share of the rest
            kept = out[i] * (1 - layout_transpose_ms(n) / n.kernel_ms)
        else:  # the time channels-last tensors save in the tensor-core model (none elsewhere)
            kept = out[i] - saved[i]
        out[i] = max(kept, MIN_KERNEL_MS)
    return out


def compiled_host_ms(pipeline: Pipeline) -> float:
    """The host's time per kernel of a compiled step: one launch (``HOST_MS``), or the eager host time
    per op ``pipeline`` holds where smaller (see the module docstring)."""
    return min(pipeline.host_ms, HOST_MS)


@dataclass(frozen=True)
class KernelWork:
    """What a step's kernels run, the same on every GPU: each generated kernel's stand-in (a memory
    pass of the bytes it moves, or the fused attention kernel), priced once per distinct stand-in,
    and the extern GEMMs Inductor may pad."""

    generated: list[int]  # the kernels priced from a stand-in
    distinct: list[NodeCost]  # the distinct stand-ins
    slot: np.ndarray  # each generated kernel's stand-in in ``distinct``
    padded: list[tuple[int, PaddedGemm]]  # (extern kernel, its padded GEMM)
    splits: np.ndarray  # each kernel's split reductions (FusedKernel.splits), each a final kernel more
    row_kernels: dict[int, NodeCost]  # node -> its row kernel's own node, for ops eager runs in more

    @property
    def launches(self) -> np.ndarray:
        """Each kernel's launches (:meth:`FusedKernel.launches`)."""
        return launches_of(self.splits).astype(np.float64)


def kernel_work(nodes: Sequence[NodeCost], kernels: Sequence[FusedKernel]) -> KernelWork:
    """The :class:`KernelWork` of ``kernels`` (fused from ``nodes``)."""
    generated: list[int] = []
    passes: list[NodeCost] = []
    padded: list[tuple[int, PaddedGemm]] = []
    for k, kernel in enumerate(kernels):
        if kernel.kind == "extern":
            gemm = padded_gemm(nodes[kernel.members[0]])
            if gemm is not None:
                padded.append((k, gemm))
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
    # A step's layers repeat their kernels: each distinct stand-in is priced once.
    index: dict[tuple[object, ...], int] = {}
    slot = np.array([index.setdefault(_pass_key(node), len(index)) for node in passes], dtype=np.intp)
    firsts = {j: i for i, j in reversed(list(enumerate(slot.tolist())))}
    splits = np.array([len(k.splits(nodes)) for k in kernels], dtype=np.intp)
    row_kernels = {i: part for i, n in enumerate(nodes) if (part := reduction_part(n)) is not None}
    return KernelWork(generated, [passes[firsts[j]] for j in range(len(index))], slot, padded, splits,
                      row_kernels)  # fmt: skip


def fused_kernel_ms(
    nodes: Sequence[NodeCost],
    kernels: Sequence[FusedKernel],
    eager_ms: np.ndarray,
    device: Device,
    model: ModelSpec = "auto",
    origin: Device | None = None,
    channels_last: bool = False,
    work: KernelWork | None = None,
) -> np.ndarray:
    """The GPU time of each kernel of ``kernels`` (fused from ``nodes``) on ``device``, in ms; NaN
    where an extern kernel's node has no prediction there. ``eager_ms``: each node's eager kernel time
    (:func:`node_kernel_ms`). ``model`` prices the generated kernels' memory passes (the roofline
    where it has no answer). ``channels_last``: the step's conv activations are channels-last, so a
    batch norm's eager (NCHW) kernel does not bound the kernel that reduces it. ``work``: the
    kernels' :func:`kernel_work`, where a caller prices the same kernels on many GPUs."""
    work = kernel_work(nodes, kernels) if work is None else work
    out = np.full(len(kernels), np.nan)
    for k, kernel in enumerate(kernels):
        if kernel.kind == "extern":
            out[k] = eager_ms[kernel.members[0]]
    pads = [(k, p) for k, p in work.padded if compute_bound(nodes[kernels[k].members[0]], device)]
    padded_ms = _padded_ms([p for _, p in pads], device, model, origin)
    for (k, _), padded_k in zip(pads, padded_ms, strict=True):
        if out[k] > PAD_SPEEDUP * padded_k:  # pad_mm's choice: padding only where it pays
            out[k] = padded_k
    if not work.distinct:
        return out
    batch = NodeBatch.of(work.distinct, origin)
    ms, sources = predict_batch(batch, model_chain(model, origin), device)
    roofline = Roofline()
    unknown = ~np.isfinite(ms)
    ms = np.where(unknown, roofline.predict(batch, device), ms)
    sources = np.where(unknown, "roofline", sources)
    times = kernel_times(batch, ms, sources, device)
    # Not faster than its work at the fp32 peak (a roofline bound without the launch floor).
    compute = batch.flops / (roofline.peak_tflops(batch, device) * 1e9)
    times = np.fmax(times, compute)[work.slot]
    floors = None
    for k, t in zip(work.generated, times.tolist(), strict=True):
        kernel = kernels[k]
        if kernel.kind == "reduction":  # no faster than its reductions' own kernels
            floors = _reduction_floors(work, eager_ms, device, model, origin) if floors is None else floors
            own = [floors[i] for i in kernel.members if reduces(nodes[i])
                   and not (channels_last and nodes[i].op in CHANNEL_REDUCTIONS)]  # fmt: skip
            t = max([t, *(x for x in own if np.isfinite(x))])
        t += work.splits[k] * MIN_KERNEL_MS  # each split's final reduction: a tiny kernel
        out[k] = t
    return out


def _reduction_floors(
    work: KernelWork, eager_ms: np.ndarray, device: Device, model: ModelSpec, origin: Device | None
) -> np.ndarray:
    """Each node's eager kernel time as a floor for the generated kernel that reduces it; a lowered
    softmax op's (SDPA's math-path ``_safe_softmax``, the softmax backward) is its softmax kernel's
    alone (``work.row_kernels``): eager runs the masking passes or the gradient's product as kernels
    of their own, which Inductor fuses into the softmax's."""
    floors = eager_ms.copy()
    if work.row_kernels:
        batch = NodeBatch.of(list(work.row_kernels.values()), origin)
        ms, sources = predict_batch(batch, model_chain(model, origin), device)
        floors[list(work.row_kernels)] = kernel_times(batch, ms, sources, device)
    return floors


def compiled_timeline(
    nodes: Sequence[NodeCost], kernels: Sequence[FusedKernel], times_ms: np.ndarray, pipeline: Pipeline,
    *, host_ms: float | None = None,
) -> list[KernelSpan]:  # fmt: skip
    """The kernels with a time on the compiled step's timeline, in order: the host spends its time
    per kernel (``host_ms``, else :func:`compiled_host_ms`) once per kernel; the GPU runs them back
    to back."""
    host_per_kernel = checked_host_ms(host_ms, compiled_host_ms(pipeline))
    # The eager step's in-step speed-up, where L2 explains it (else it measured another graph).
    scale = pipeline.kernel_scale if pipeline.l2_explained else 1.0
    known = np.isfinite(times_ms)
    run = times_ms[known] * scale
    ran = [k for k, ok in zip(kernels, known.tolist(), strict=True) if ok]
    launches = [k.launches(nodes) for k in ran]
    host = host_per_kernel * np.array(launches, dtype=np.float64)
    ends, issued = replay_ends(run, host).tolist(), np.cumsum(host).tolist()
    return [KernelSpan(k, nodes[k.members[0]].phase, at, end - ms, end, n)
            for k, ms, end, at, n in zip(ran, run.tolist(), ends, issued, launches, strict=True)]  # fmt: skip


_SCALED_FROM_ORIGIN = frozenset({"mlp_ratio", "wave_scaling"})  # models scaling a recorded time


def _padded_ms(
    padded: Sequence[PaddedGemm], device: Device, model: ModelSpec, origin: Device | None
) -> list[float]:
    """Each padded GEMM's time with its operands' copies on ``device`` (NaN where unknown)."""
    if not padded:
        return []
    nodes: list[NodeCost] = []
    owner: list[int] = []
    for i, p in enumerate(padded):
        nodes.append(p.gemm)
        nodes.extend(memory_pass(nbytes, p.dtype) for nbytes in p.copy_bytes)
        owner.extend([i] * (1 + len(p.copy_bytes)))
    batch = NodeBatch.of(nodes, origin)
    ms, sources = predict_batch(batch, model_chain(model, origin), device)
    times = kernel_times(batch, ms, sources, device)
    total = np.zeros(len(padded))
    np.add.at(total, owner, times)  # NaN anywhere makes its GEMM's total NaN
    return total.tolist()


def _pass_key(node: NodeCost) -> tuple[object, ...]:
    """What a generated kernel's price depends on: its stand-in node's op, shapes, dtypes, work,
    traffic and arguments (a step's layers repeat the same kernels)."""
    shapes = (tuple(map(tuple, node.in_shapes)), tuple(map(tuple, node.out_shapes)))
    dtypes = (tuple(node.in_dtypes), tuple(node.out_dtypes))
    return (node.op, shapes, dtypes, node.flops, node.bytes_read, node.bytes_written, repr(node.args))


def _widest_output(members: Sequence[NodeCost]) -> str:
    """The dtype of the members' largest output (float32 where none has one)."""
    best, dtype = -1, "float32"
    for n in members:
        for shape, d in zip(n.out_shapes, n.out_dtypes, strict=False):
            size = math.prod(shape)
            if size > best:
                best, dtype = size, d
    return dtype
