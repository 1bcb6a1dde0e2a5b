"""Which ATen ops Inductor fuses, and over what iteration ranges (the rules of
:mod:`fxcost.lowering.fusion`).

A fusable node has ranges ``(elements, reduced elements per element)``: ``(N, 1)`` for a pointwise op
over N elements, ``(rows, row length)`` for a reduction. Ops are classified by their torch tags
(``pointwise``, ``reduction``) and by the lists below of ops Inductor decomposes into those (norms,
softmax, dropout, copies, gathers).
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import torch

from fxcost.lowering.kernels import resolve_op
from fxcost.records import NodeCost

__all__ = ["CHANNEL_REDUCTIONS", "GATHERS", "launches_of", "merged_ranges", "node_ranges", "split_reduction"]

# Ops Inductor lowers to pointwise loops that no tag marks as pointwise.
_POINTWISE = frozenset({
    "aten._to_copy.default", "aten.native_dropout.default", "aten.full.default", "aten.full_like.default",
    "aten.zeros.default", "aten.zeros_like.default", "aten.ones.default", "aten.ones_like.default",
    "aten.scalar_tensor.default", "aten.arange.default", "aten.arange.start", "aten.arange.start_step",
    "aten.cat.default", "aten.copy_.default", "aten.fill_.Scalar", "aten.fill.Scalar",
    "aten.lift_fresh_copy.default", "aten.empty.memory_format", "aten.empty_like.default",
    "aten.constant_pad_nd.default", "aten.slice_scatter.default", "aten.select_scatter.default",
    "aten.new_zeros.default", "aten.new_ones.default", "aten.new_full.default", "aten.tril.default",
    "aten.triu.default", "aten.bernoulli.p", "aten.rand_like.default", "aten.rand.default",
})  # fmt: skip
# Gathers: pointwise loops with an indirect load of the rows they read (position: the table).
GATHERS = {"aten.embedding.default": 0, "aten.index.Tensor": 0, "aten.index_select.default": 0,
            "aten.gather.default": 0}  # fmt: skip
# Reductions no tag marks as such, with the position of the tensor whose element count is the number
# of reduced rows (None: the reduced dimension is the op's ``dim``, or the channels of a batch norm).
_ROW_REDUCTIONS = {
    "aten.native_layer_norm.default": ("out", 1), "aten.native_layer_norm_backward.default": ("in", 2),
    "aten.native_group_norm.default": ("out", 1), "aten.native_group_norm_backward.default": ("in", 2),
    "aten._fused_rms_norm.default": ("out", 1),
}  # fmt: skip
_DIM_REDUCTIONS = frozenset(
    {
        "aten._softmax.default",
        "aten._safe_softmax.default",
        "aten._log_softmax.default",
        "aten._softmax_backward_data.default",
        "aten._log_softmax_backward_data.default",
    }
)
CHANNEL_REDUCTIONS = frozenset({
    "aten.native_batch_norm.default", "aten._native_batch_norm_legit.default",
    "aten._native_batch_norm_legit_functional.default", "aten.native_batch_norm_backward.default",
})  # fmt: skip


def node_ranges(node: NodeCost) -> tuple[tuple[int, int] | None, bool]:
    """The iteration ranges of a fusable node, (elements, reduced elements each), and whether it
    reduces; None for a node Inductor runs as a kernel of its own."""
    op = node.op
    if op.startswith("aten._foreach_"):
        return None, False
    if op in _ROW_REDUCTIONS:
        side, index = _ROW_REDUCTIONS[op]
        shapes = node.out_shapes if side == "out" else node.in_shapes
        if index >= len(shapes) or not node.in_shapes:
            return None, False
        rows = max(math.prod(shapes[index]), 1)
        return (rows, math.prod(node.in_shapes[0]) // rows), True
    if op in _DIM_REDUCTIONS or op in CHANNEL_REDUCTIONS:
        if not node.in_shapes or not node.in_shapes[0]:
            return None, False
        shape = node.in_shapes[0]
        dim = int(node.args.get("dim", 1)) if op in _DIM_REDUCTIONS else 1
        reduced = shape[dim % len(shape)]
        return (math.prod(shape) // max(reduced, 1), reduced), True
    tags = _tags(op)
    if "reduction" in tags:
        if not node.in_shapes or not node.out_shapes:
            return None, False
        rows = max(math.prod(node.out_shapes[0]), 1)
        return (rows, max(math.prod(node.in_shapes[0]) // rows, 1)), True
    if "pointwise" in tags or op in _POINTWISE or op in GATHERS:
        shapes = node.out_shapes or node.in_shapes[:1]
        if not shapes:
            return None, False
        return (max(math.prod(shapes[0]), 1), 1), False
    return None, False


# Inductor splits a reduction to few outputs over many reduced elements into partial and final
# reductions (``Reduction.num_splits``). A batch norm over channels-last data (a conv net's, as
# Inductor lays it out: ``fusion_layout``) or over ``[N, C]`` reduces a strided dimension, an outer
# reduction: it stays whole only where its channels reach 64 per SM, which 2,048 never do on a GPU of
# more than 32 SMs (ResNet-50's widest is 2,048), and splits once its elements per channel exceed 4
# per thread over Inductor's smallest 32-element split. Over ``[N, C, L]`` the reduced ``L`` is
# contiguous, an inner reduction, which Inductor splits only to fewer outputs than twice the SMs and
# over more than 8,192 elements each: not modelled, it stays whole here.
_SPLIT_MAX_OUTPUTS = 2048
_SPLIT_MIN_REDUCED = 4 * 32


def split_reduction(node: NodeCost) -> bool:
    """Whether Inductor splits ``node``, a batch norm or its backward, into a partial and a final
    reduction. A split reduction's pointwise epilogue over its input (the normalization, and what
    fuses with it) cannot share its loop: it runs as a kernel of its own that reads the input again
    (the ResNet-50 H100 step's ``triton_red_fused__native_batch_norm_legit_functional`` and
    ``triton_poi_fused__native_batch_norm_legit_functional_relu`` kernels)."""
    if node.op not in CHANNEL_REDUCTIONS or not node.in_shapes or len(node.in_shapes[0]) not in (2, 4):
        return False
    if False in (node.args.get("training"), node.args.get("train")):  # running statistics: no reduction
        return False
    shape = node.in_shapes[0]
    channels = shape[1]
    return 0 < channels <= _SPLIT_MAX_OUTPUTS and math.prod(shape) // channels > _SPLIT_MIN_REDUCED


IntOrArray = TypeVar("IntOrArray", int, np.ndarray)


def launches_of(splits: IntOrArray) -> IntOrArray:
    """The launches of a kernel holding ``splits`` split reductions (an int, or an array of them): a
    partial and a final reduction for each and the one pass after them (the whole kernel, for none)."""
    return 2 * splits + 1


def merged_ranges(
    a: tuple[int, int], a_reduces: bool, b: tuple[int, int], b_reduces: bool
) -> tuple[int, int] | None:
    """The ranges of a kernel running both, or None where Inductor would not fuse them."""
    if a_reduces and b_reduces:
        return a if a == b else None
    if not a_reduces and not b_reduces:
        return a if a[0] == b[0] else None
    reduction, pointwise = (a, b) if a_reduces else (b, a)
    if pointwise[0] in (reduction[0], reduction[0] * reduction[1]):
        return reduction
    return None


_TAGS: dict[str, frozenset[str]] = {}


def _tags(op: str) -> frozenset[str]:
    """The names of an op's torch tags (``pointwise``, ``reduction``), looked up once per op."""
    if op not in _TAGS:
        overload = resolve_op(op) if op.startswith("aten.") else None
        names = {t.name for t in overload.tags} if isinstance(overload, torch._ops.OpOverload) else set()
        _TAGS[op] = frozenset(names)
    return _TAGS[op]
