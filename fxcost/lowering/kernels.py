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

Other kernel-alike ops get an approximation flagged ``exact=False`` (reductions, batch norm, index
and embedding ops: one elementwise-like pass over their largest tensor). Matmul-class ops are
kernel-varying (cuBLAS/cuDNN pick kernels per GPU) and are not lowered here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fxcost.devices.occupancy import Launch
from fxcost.lowering.flops import is_matmul_class
from fxcost.lowering.traffic import itemsize
from fxcost.records import NodeCost

__all__ = ["KernelSpec", "lower", "resolve_op"]

aten = torch.ops.aten

EW_THREADS, EW_BLOCK_WORK = 128, 512
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One kernel a node launches, with its share of the node's FLOPs and bytes.

    ``bytes`` is the traffic when every tensor is read once. Row kernels (softmax, layer norm) read
    their row again in later passes; those ``reread_bytes`` come from L2 while the rows of one wave
    (``block_bytes`` each) fit there, and from DRAM when they do not.
    """

    name: str
    launch: Launch
    flops: float
    bytes: float
    exact: bool = True
    reread_bytes: float = 0.0
    block_bytes: int = 0


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
    per_piece = math.ceil(numel / pieces)
    launch = Launch(grid=(math.ceil(per_piece / EW_BLOCK_WORK), 1, 1), block=(EW_THREADS, 1, 1))
    return [KernelSpec(name, launch, _share(node.flops, pieces), _share(node.bytes, pieces), exact)] * pieces


@_lowers(aten.native_dropout.default, aten.native_dropout_backward.default, aten.clone.default,
         aten._to_copy.default, aten.copy_.default, aten.fill_.Scalar, aten.zeros_like.default,
         aten.ones_like.default, aten.full_like.default, aten.cat.default,
         aten.constant_pad_nd.default)  # fmt: skip
def _copy_like(node: NodeCost) -> list[KernelSpec]:
    return _pieces(node, "elementwise_kernel", _largest_numel(node), exact=False)


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
         aten._log_softmax_backward_data.default)  # fmt: skip
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
        # a reduction over grad * output, then the write pass reads both again.
        row_bytes = size * item * (2 if backward else 1)
        reread = outer * row_bytes * (1 if backward else 2)
        spec = KernelSpec(name, Launch((outer, 1, 1), (block, 1, 1)), _f(node.flops), _f(node.bytes),
                          reread_bytes=reread, block_bytes=row_bytes)  # fmt: skip
        return [spec]
    launch = Launch(grid=(min(outer, 1024), math.ceil(inner / 1024), 1), block=(1024, 1, 1))
    return [KernelSpec("cunn_SpatialSoftMax", launch, _f(node.flops), _f(node.bytes), exact=False)]


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


def _f(x: int | None) -> float:
    return math.nan if x is None else float(x)


def _share(x: int | None, parts: int) -> float:
    return _f(x) / parts
