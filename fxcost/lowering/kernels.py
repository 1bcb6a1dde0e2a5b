"""Lowering to kernel launches: the CUDA kernels PyTorch launches for a kernel-alike ATen op.

Follows the launch heuristics of PyTorch's CUDA sources (2.1, the version of the measured data):

- elementwise (``Loops.cuh``): 128 threads a block, 4 elements a thread, so a block covers 512
  elements; an operand whose largest byte offset exceeds 2^31 - 1 makes TensorIterator split the
  work in halves until each piece fits 32-bit indexing, one launch per piece.
- layer norm forward (``layer_norm_kernel.cu``): ``vectorized_layer_norm_kernel`` with one (32, 4)
  block a row when the row length is a multiple of 4, else a moments kernel (512 threads) and a
  normalization kernel (256 threads), one block a row each.
- softmax and log-softmax (``SoftMax.cu``): rows of at most 1024 elements (and 4 KB) use the
  persistent warp softmax, 128 threads a block holding 128 / warp rows, launched in chunks of
  2^30 / row-length rows; longer rows use one block a row with ``SoftMax_getBlockSize``: the next
  power of two of row/4/2, at least a warp, at most 512.

Memory-bound ops that are neither (reductions, concatenation, gathers, pooling, the
zero-then-write gradients of slicing and indexing) are lowered to the passes their kernels make over
memory and the bytes each moves (:data:`MEMORY_BOUND`), their launches approximated as elementwise
ones (``exact=False``); batch norm's and max pooling's kernels and launches are modelled
(``lowering.batch_norm``, ``lowering.max_pool``). Any other kernel-alike op gets one
elementwise-like pass over its largest tensor, also flagged ``exact=False``. Matmul-class ops are
kernel-varying (cuBLAS/cuDNN pick kernels per GPU) and are not lowered here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fxcost.gpus.occupancy import Launch
from fxcost.lowering.flops import is_matmul_class
from fxcost.precision import itemsize
from fxcost.records import NodeCost

__all__ = ["MEMORY_BOUND", "KernelSpec", "is_pointwise", "lower", "memory_bound", "resolve_op", "tensor_in",
           "tensor_out"]  # fmt: skip

aten = torch.ops.aten

EW_THREADS, EW_BLOCK_WORK = 128, 512
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One kernel a node launches, with its share of the node's FLOPs and bytes.

    ``bytes`` is the traffic when every tensor is read once. Row kernels (softmax, layer norm) read
    their row again in later passes; those ``reread_bytes`` come from L2 while the rows of one wave
    (``block_bytes`` each) fit there, and from DRAM when they do not. A kernel bound by memory
    latency rather than bandwidth declares the dependent ``round_trips`` to memory each of its
    threads makes (0: not modelled; see ``lowering.batch_norm``).
    """

    name: str
    launch: Launch
    flops: float
    bytes: float
    exact: bool = True
    reread_bytes: float = 0.0
    block_bytes: int = 0
    round_trips: int = 0


Lowering = Callable[[NodeCost], list[KernelSpec]]
_LOWERINGS: dict[str, Lowering] = {}


def _lowers(*ops: torch._ops.OpOverload) -> Callable[[Lowering], Lowering]:
    def decorator(fn: Lowering) -> Lowering:
        for op in ops:
            name = str(op)
            if name in _LOWERINGS:
                raise ValueError(f"a lowering for {name} is already registered")
            _LOWERINGS[name] = fn
        return fn

    return decorator


def resolve_op(name: str) -> torch._ops.OpOverload | None:
    """The ATen overload for a canonical name like ``"aten.add.Tensor"``, None if there is none."""
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (AttributeError, RuntimeError):
        return None


@functools.cache
def is_pointwise(op_name: str) -> bool:
    """Whether PyTorch tags the ATen op ``op_name`` pointwise (looked up once per op: it is asked for
    every node each time a step is priced)."""
    op = resolve_op(op_name)
    return op is not None and torch.Tag.pointwise in op.tags


def lower(node: NodeCost) -> list[KernelSpec] | None:
    """The kernels ``node`` launches on a CUDA GPU; None for kernel-varying or unknown ops.

    Nodes that launch nothing (views, or ops on empty tensors, which PyTorch returns from without a
    launch) return an empty list.
    """
    if not node.has_kernel:
        return []
    if is_matmul_class(node.op) or (not node.out_shapes and not node.in_shapes):
        return None
    lowering = _LOWERINGS.get(node.op)
    if lowering is None:
        op = resolve_op(node.op)
        if op is None:
            return None
        lowering = _elementwise if torch.Tag.pointwise in op.tags else _approximate
    try:
        specs = lowering(node)
    except (IndexError, KeyError, ValueError, ZeroDivisionError):
        return None
    return [s for s in specs if s.launch.blocks > 0]


# -- elementwise ------------------------------------------------------------------------------------


def _elementwise(node: NodeCost) -> list[KernelSpec]:
    return _pieces(node, "vectorized_elementwise_kernel", _largest_numel(node), exact=True)


def _pieces(node: NodeCost, name: str, numel: int, exact: bool) -> list[KernelSpec]:
    """An elementwise pass over ``numel`` elements, split for 32-bit indexing like TensorIterator."""
    # TensorIterator halves the work until every operand's largest byte offset fits in an int32.
    item, elements = max((itemsize(d), math.prod(s)) for s, d in _tensors(node))
    pieces = 1
    while (math.ceil(elements / pieces) - 1) * item + 1 > INT32_MAX:
        pieces *= 2
    launch = _elementwise_launch(math.ceil(numel / pieces))
    return [KernelSpec(name, launch, _share(node.flops, pieces), _share(node.bytes, pieces), exact)] * pieces


def _elementwise_launch(numel: int) -> Launch:
    return Launch(grid=(math.ceil(numel / EW_BLOCK_WORK), 1, 1), block=(EW_THREADS, 1, 1))


@_lowers(aten.native_dropout.default, aten.native_dropout_backward.default, aten.clone.default,
         aten._to_copy.default, aten.copy_.default, aten.fill_.Scalar, aten.zeros_like.default,
         aten.ones_like.default, aten.full_like.default)  # fmt: skip
def _copy_like(node: NodeCost) -> list[KernelSpec]:
    return _pieces(node, "elementwise_kernel", _largest_numel(node), exact=False)


# TensorIterator elementwise kernels that PyTorch does not tag pointwise.
_lowers(aten.hardswish.default, aten.hardswish_backward.default, aten.hardsigmoid_backward.default,
        aten.hardtanh_backward.default, aten.floor_divide.default)(_elementwise)  # fmt: skip


# -- layer norm -------------------------------------------------------------------------------------


@_lowers(aten.native_layer_norm.default)
def _layer_norm(node: NodeCost) -> list[KernelSpec]:
    x = node.in_shapes[0]
    row = math.prod(node.args["normalized_shape"])
    rows = math.prod(x) // row
    item = itemsize(node.in_dtypes[0])
    if row % 4 == 0:  # Welford pass over the row, then a second read to normalize it
        launch = Launch(grid=(rows, 1, 1), block=(32, 4, 1))
        spec = KernelSpec("vectorized_layer_norm_kernel", launch, _f(node.flops), _f(node.bytes),
                          reread_bytes=rows * row * item, block_bytes=row * item)  # fmt: skip
        return [spec]
    moments = Launch(grid=(rows, 1, 1), block=(512, 1, 1))
    forward = Launch(grid=(rows, 1, 1), block=(256, 1, 1))
    half_flops, half_bytes = _share(node.flops, 2), _share(node.bytes, 2)
    return [
        KernelSpec("RowwiseMomentsCUDAKernel", moments, half_flops, half_bytes),
        KernelSpec("LayerNormForwardCUDAKernel", forward, half_flops, half_bytes),
    ]


# -- softmax ----------------------------------------------------------------------------------------


@_lowers(aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
         aten._log_softmax_backward_data.default, aten._safe_softmax.default)  # fmt: skip
def _softmax(node: NodeCost) -> list[KernelSpec]:
    shape = node.in_shapes[0]
    dim = node.args["dim"] % len(shape) if shape else 0
    size = shape[dim] if shape else 1
    inner = math.prod(shape[dim + 1 :])
    outer = math.prod(shape[:dim])
    item = itemsize(node.in_dtypes[0])
    backward = node.op.endswith("backward_data.default")
    if inner == 1 and size <= 1024 and size * item <= 4096:
        pow2 = 1 << max(size - 1, 0).bit_length()
        warp = min(pow2, 32)
        rows_per_warp = 2 if pow2 <= 128 else 1
        warps_per_block = 128 // warp
        chunk = min(outer, (1 << 30) // size)
        chunks = math.ceil(outer / chunk)
        rows_per_block = warps_per_block * rows_per_warp
        launch = Launch(grid=(math.ceil(chunk / rows_per_block), 1, 1), block=(warp, warps_per_block, 1))
        name = "softmax_warp_backward" if backward else "softmax_warp_forward"
        return [KernelSpec(name, launch, _share(node.flops, chunks), _share(node.bytes, chunks))] * chunks
    if inner == 1:
        ilp = 16 // item  # one float4 load
        limit = min(size // ilp, 1024)
        if ilp > 1:
            limit //= 2  # keep at least half of each row loaded vectorized (SoftMax_getBlockSize)
        block = max(1 << max(limit - 1, 0).bit_length(), 32)
        name = "cunn_SoftMaxBackward" if backward else "cunn_SoftMaxForward"
        # Forward: max pass, sum pass, then the write pass: the row is read twice more. Backward:
        # a sum over the incoming gradient (log-softmax's, or softmax's already times the output:
        # ATen multiplies it first, ``fxcost.lowering.row_ops``), then the write pass reads it again
        # beside the output.
        row_bytes = size * item * (2 if backward else 1)
        reread = outer * size * item * (1 if backward else 2)
        spec = KernelSpec(name, Launch((outer, 1, 1), (block, 1, 1)), _f(node.flops), _f(node.bytes),
                          reread_bytes=reread, block_bytes=row_bytes)  # fmt: skip
        return [spec]
    launch = Launch(grid=(min(outer, 1024), math.ceil(inner / 1024), 1), block=(1024, 1, 1))
    return [KernelSpec("cunn_SpatialSoftMax", launch, _f(node.flops), _f(node.bytes), exact=False)]


# -- memory-bound ops -------------------------------------------------------------------------------
#
# Each recipe names the kernels PyTorch's CUDA sources launch for the op and the bytes each moves,
# from the node's tensors: ``_in(node, i)`` and ``_out(node, i)`` are the bytes of one input or output.

MEMORY_BOUND: set[str] = set()
"""ATen ops lowered to the memory passes of their kernels, which cost models without measurements of
the op itself price as elementwise passes moving as many bytes."""

_Passes = Callable[[NodeCost], list[tuple[str, float]]]


def _memory_bound(*ops: torch._ops.OpOverload) -> Callable[[_Passes], _Passes]:
    def decorator(passes: _Passes) -> _Passes:
        def lowering(node: NodeCost) -> list[KernelSpec]:
            kernels = passes(node)
            moved = sum(b for _, b in kernels) or 1.0
            launch = _elementwise_launch(_largest_numel(node))  # their launch logic is not modelled
            return [
                KernelSpec(name, launch, _f(node.flops) * b / moved, b, exact=False) for name, b in kernels
            ]

        _memory_kernels(*ops)(lowering)
        return passes

    return decorator


def _memory_kernels(*ops: torch._ops.OpOverload) -> Callable[[Lowering], Lowering]:
    """Registers a lowering of memory-bound ops (:data:`MEMORY_BOUND`) that models their launches."""

    def decorator(lowering: Lowering) -> Lowering:
        _lowers(*ops)(lowering)
        MEMORY_BOUND.update(str(op) for op in ops)
        return lowering

    return decorator


@_memory_bound(aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.amax.default,
               aten.amin.default, aten.max.default, aten.min.default, aten.max.dim, aten.min.dim,
               aten.argmax.default, aten.argmin.default, aten.prod.default, aten.prod.dim_int,
               aten.var.correction, aten.var_mean.correction, aten.std.correction, aten.any.default,
               aten.any.dim, aten.all.default, aten.all.dim, aten.linalg_vector_norm.default,
               aten.cumsum.default)  # fmt: skip
@_memory_bound(aten.cat.default, aten.stack.default, aten.triu.default, aten.tril.default,
               aten.avg_pool2d.default, aten._adaptive_avg_pool2d.default)  # fmt: skip
def _one_pass(node: NodeCost) -> list[tuple[str, float]]:
    """Reductions (``reduce_kernel``; a scan for cumsum), copies (``CatArrayBatchedCopy``) and pooling
    windows (average pooling): each input read once, each output written once. Kernels are
    named after their op."""
    return [(node.op.split(".")[1], _f(node.bytes))]


@_memory_bound(aten.avg_pool2d_backward.default, aten._adaptive_avg_pool2d_backward.default)
def _pool_backward(node: NodeCost) -> list[tuple[str, float]]:
    """Each input gradient gathers the output gradients of its windows; the forward input (the second
    argument) gives only the shape."""
    return [(node.op.split(".")[1], _in(node, 0) + _out(node, 0))]


@_memory_bound(aten.embedding.default, aten.index_select.default, aten.gather.default, aten.index.Tensor,
               aten._unsafe_index.Tensor)  # fmt: skip
def _gather(node: NodeCost) -> list[tuple[str, float]]:
    """A gather reads the indices and only the source rows it copies, not the whole source."""
    indices = sum(_in(node, i) for i in range(1, len(node.in_shapes)))
    return [("gather_kernel", 2 * _out(node, 0) + indices)]


@_memory_bound(aten.select_backward.default, aten.slice_backward.default, aten.constant_pad_nd.default)
def _zero_then_copy(node: NodeCost) -> list[tuple[str, float]]:
    """Fill the output, then copy the (gradient of the) slice into its place; a negative pad copies
    only what is kept."""
    return [("fill", _out(node, 0)), ("copy", 2 * min(_in(node, 0), _out(node, 0)))]


@_memory_bound(aten.slice_scatter.default, aten.select_scatter.default)
def _copy_then_scatter(node: NodeCost) -> list[tuple[str, float]]:
    """Copy ``self`` to the output, then the source into its slice."""
    return [("copy", 2 * _in(node, 0)), ("copy", 2 * _in(node, 1))]


@_memory_bound(aten.embedding_dense_backward.default)
def _embedding_backward(node: NodeCost) -> list[tuple[str, float]]:
    """Zero the weight's gradient, then add each gradient row into the row its index names."""
    return [("fill", _out(node, 0)), ("embedding_backward", 2 * _in(node, 0) + _in(node, 1))]


@_memory_bound(aten.max_pool2d_with_indices_backward.default)
def _max_pool_backward(node: NodeCost) -> list[tuple[str, float]]:
    """Zero the input's gradient, then route each output gradient to its argmax (the indices)."""
    return [("fill", _out(node, 0)), ("max_pool_backward", 2 * _in(node, 0) + _in(node, 2))]


@_memory_bound(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss(node: NodeCost) -> list[tuple[str, float]]:
    """Reads the targets and the one log-probability each picks, not the whole input."""
    picked = math.prod(node.in_shapes[1]) * itemsize(node.in_dtypes[0])
    return [
        ("nll_loss_forward", _in(node, 1) + picked + sum(_out(node, i) for i in range(len(node.out_shapes))))
    ]


@_memory_bound(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def _nll_loss_backward(node: NodeCost) -> list[tuple[str, float]]:
    """Zero the gradient of the log-probabilities, then write one element per target, reading the
    targets and the output's gradient (one per target without reduction)."""
    picked = math.prod(node.in_shapes[2]) * itemsize(node.out_dtypes[0])
    return [("fill", _out(node, 0)), ("nll_loss_backward", _in(node, 0) + _in(node, 2) + picked)]


# -- everything else kernel-alike -------------------------------------------------------------------


def _approximate(node: NodeCost) -> list[KernelSpec]:
    """One pass over the node's largest tensor; used where PyTorch's launch logic is not modelled."""
    return _pieces(node, "approximate_kernel", _largest_numel(node), exact=False)


# -- helpers ----------------------------------------------------------------------------------------


def _tensors(node: NodeCost) -> list[tuple[tuple[int, ...], str]]:
    return list(zip(node.in_shapes, node.in_dtypes, strict=True)) + list(
        zip(node.out_shapes, node.out_dtypes, strict=True)
    )


def _largest_numel(node: NodeCost) -> int:
    return max(math.prod(s) for s, _ in _tensors(node))


def _bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * itemsize(dtype)


def _in(node: NodeCost, i: int) -> int:
    return _bytes(node.in_shapes[i], node.in_dtypes[i])


def _out(node: NodeCost, i: int) -> int:
    return _bytes(node.out_shapes[i], node.out_dtypes[i])


def _f(x: int | None) -> float:
    return math.nan if x is None else float(x)


def _share(x: int | None, parts: int) -> float:
    return _f(x) / parts


# For the recipes of other modules (``lowering.memory_ops``, ``lowering.batch_norm``): register memory
# passes or memory-bound kernels, bytes of a node's i-th input and output.
memory_bound, memory_kernels, tensor_in, tensor_out = _memory_bound, _memory_kernels, _in, _out
