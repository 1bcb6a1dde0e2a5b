"""Tensor-parallel shards of nodes (Megatron-LM): what one of ``tp`` ranks runs of a node.

Inside a layer's attention and MLP, a matmul is sharded along its wider non-token dimension (the 3H
of QKV, the 4H of the MLP; the contraction of the output projections; in the forward, every product
of a region but its last along its output features: :func:`shard_column`), a batched matmul along
its batch-times-heads dimension, other ops along their head or feature dimension;
tensors as wide as the model (the row-parallel outputs, the residual stream) stay whole. Outside the
layers, the head, the cross-entropy and the embedding are split along the vocabulary. A shard is a
node on smaller tensors, priced at its own shapes rather than as a fraction of the whole.

With sequence parallelism (Korthikanti et al. 2022, §4.2.2) the nodes between the tensor-parallel
blocks (layer norms, dropouts, residual adds) are split along the tokens instead
(:func:`shard_sequence`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from fxcost.lowering import recorded_bytes
from fxcost.lowering.experts import GROUPED_MM_OPS, is_grouped_weight_gradient
from fxcost.lowering.nodes import MATMULS, matmul_operands
from fxcost.records import NodeCost, Shape
from fxcost.sim.recompute import LINEAR

__all__ = [
    "attention_heads",
    "check_tp",
    "shard_column",
    "shard_node",
    "shard_sequence",
    "shard_vocabulary",
    "split_dim",
]


def shard_node(node: NodeCost, tp: int, hidden: int, tokens: int) -> NodeCost | None:
    """``node`` of a layer's attention or MLP as one of ``tp`` tensor-parallel ranks runs it: split
    along its heads or features, or None if its result is as wide as the model (it runs whole)."""
    if node.op in MATMULS:
        return _shard_matmul(node, tp, tokens)
    if node.op in GROUPED_MM_OPS:
        return _shard_grouped(node, tp, hidden)
    outs = node.out_shapes or node.in_shapes
    if not outs or not outs[0] or outs[0][-1] == hidden:
        return None  # as wide as the model: a replicated tensor
    in_shapes, out_shapes = (
        [_split(s, tp, hidden) for s in node.in_shapes],
        [_split(s, tp, hidden) for s in node.out_shapes],
    )
    if in_shapes == list(node.in_shapes) and out_shapes == list(node.out_shapes):
        return None  # nothing splits (a norm's statistics of one column): it runs whole
    return _on_shapes(node, in_shapes, out_shapes)


def shard_column(node: NodeCost, tp: int, tokens: int) -> NodeCost | None:
    """A product of a layer's attention or MLP that is not its last, split along its output features:
    column-parallel, each rank on the whole input (Megatron's QKV and first MLP product, a Llama's
    ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj`` and ``up_proj``, square or not). The last product
    of the region is the row-parallel one, :func:`shard_node`'s. None for a batched product, or where
    the features do not split."""
    return _shard_matmul(node, tp, tokens, column=True) if node.op in LINEAR else None


def shard_sequence(node: NodeCost, tp: int, hidden: int, tokens: int) -> NodeCost | None:
    """``node`` as one of ``tp`` sequence-parallel ranks runs it: every tensor of ``tokens`` rows of
    the width (or of one column: a layer norm's statistics) split along the sequence, or None if it
    has none, or is a matmul (those belong to the tensor-parallel blocks)."""
    if node.op in MATMULS:
        return None

    def rows(shape: Shape) -> bool:
        return len(shape) in (2, 3) and shape[-1] in (hidden, 1) and math.prod(shape[:-1]) == tokens

    def split(shape: Shape) -> Shape:
        if not rows(shape):
            return shape
        # The sequence (the dimension before the width; Megatron's layout puts it first), else the rows.
        dims = [len(shape) - 2, *range(len(shape) - 2)]
        dim = next((i for i in dims if shape[i] % tp == 0), -1)
        return shape if dim < 0 else split_dim(shape, dim, tp)

    if not any(rows(s) and s[-1] == hidden for s in (*node.in_shapes, *node.out_shapes)):
        return None
    in_shapes, out_shapes = [split(s) for s in node.in_shapes], [split(s) for s in node.out_shapes]
    return node.replace(in_shapes=in_shapes, out_shapes=out_shapes,
                        flops=None if node.flops is None else node.flops // tp,
                        bytes_read=recorded_bytes(in_shapes, node.in_dtypes),
                        bytes_written=recorded_bytes(out_shapes, node.out_dtypes))  # fmt: skip


def shard_vocabulary(node: NodeCost, tp: int, tokens: int, vocab: int) -> NodeCost | None:
    """A node outside the layers as Megatron's vocabulary-parallel head, cross-entropy and
    embedding run it: split along the vocabulary if its result (or a matmul operand) spans it."""
    if node.op in MATMULS:
        spans = any(vocab in s for s in (*node.in_shapes, *node.out_shapes))
        return _shard_matmul(node, tp, tokens) if spans else None
    if not any(vocab in s for s in node.out_shapes):
        return None

    def split(shape: Shape) -> Shape:
        return tuple(x // tp if x == vocab else x for x in shape)

    return _on_shapes(node, [split(s) for s in node.in_shapes], [split(s) for s in node.out_shapes])


def _on_shapes(node: NodeCost, in_shapes: list[Shape], out_shapes: list[Shape]) -> NodeCost:
    """``node`` on smaller tensors: FLOPs in proportion to its result, bytes from the shapes."""
    old, new = node.out_shapes or node.in_shapes, out_shapes or in_shapes
    ratio = math.prod(new[0]) / max(math.prod(old[0]), 1) if old and new else 1.0
    return node.replace(in_shapes=in_shapes, out_shapes=out_shapes,
                        flops=None if node.flops is None else round(node.flops * ratio),
                        bytes_read=recorded_bytes(in_shapes, node.in_dtypes),
                        bytes_written=recorded_bytes(out_shapes, node.out_dtypes))  # fmt: skip


def split_dim(shape: Shape, dim: int, parts: int) -> Shape:
    """``shape`` with dimension ``dim`` cut in ``parts``."""
    return (*shape[:dim], shape[dim] // parts, *shape[dim + 1 :])


def _split(shape: Shape, tp: int, hidden: int) -> Shape:
    """A tensor's shard: heads (dimension 1 of a 4-d tensor) or features (the last) split."""
    if not shape or shape[-1] == hidden:
        return shape
    dim = 1 if len(shape) == 4 and shape[1] % tp == 0 else len(shape) - 1
    return shape if shape[dim] % tp else split_dim(shape, dim, tp)


def _shard_matmul(node: NodeCost, tp: int, tokens: int, column: bool = False) -> NodeCost | None:
    shapes = list(node.in_shapes)
    a, b = matmul_operands(node)
    if node.op in ("aten.bmm.default", "aten.baddbmm.default"):
        if len(a) != 3 or a[0] % tp:
            return None
        shapes[-2], shapes[-1] = (a[0] // tp, *a[1:]), (b[0] // tp, *b[1:])
        out = [(s[0] // tp, *s[1:]) for s in node.out_shapes]
        if node.op == "aten.baddbmm.default" and len(shapes[0]) == 3:
            shapes[0] = (shapes[0][0] // tp, *shapes[0][1:])
    else:
        (m, k), (_, n) = a, b
        candidates = {"m": m, "k": k, "n": n}
        # The tokens are one dimension, found by position (the rows, else the contraction of a weight's
        # gradient), so that a projection as wide as the micro-batch's tokens still splits. Where a width
        # equals the tokens too, the rows are taken: a weight gradient's FLOPs hold, its shapes may not.
        token = next((name for name, size in candidates.items() if size == tokens), None)
        free = {name: size for name, size in candidates.items() if name != token and size % tp == 0}
        if column:
            free = {name: size for name, size in free.items() if name == "n"}
        if not free:
            return None
        dim = max(free, key=lambda name: (free[name], name == "k"))  # a tie: split the contraction
        m2, k2, n2 = (x // tp if name == dim else x for name, x in candidates.items())
        shapes[-2], shapes[-1] = (m2, k2), (k2, n2)
        if node.op == "aten.addmm.default":
            shapes[0] = (n2,) if len(shapes[0]) == 1 else (m2, n2)
        out = [(m2, n2)]
    return node.replace(in_shapes=shapes, out_shapes=out,
                        flops=None if node.flops is None else node.flops // tp,
                        bytes_read=recorded_bytes(shapes, node.in_dtypes),
                        bytes_written=recorded_bytes(out, node.out_dtypes))  # fmt: skip


def _shard_grouped(node: NodeCost, tp: int, hidden: int) -> NodeCost | None:
    """A mixture-of-experts grouped GEMM as one of ``tp`` ranks runs it, every expert's MLP split like a
    dense one (Megatron-LM's expert tensor parallelism): the first product's weight ``[E, K, N]`` along
    ``N`` (column-parallel), the last's along ``K`` (row-parallel), told apart by the width that is not
    the model's (the last where both are: an expert as wide as the model). Layouts: rows ``[S, K]`` by
    weights ``[E, K, N]`` (Hugging Face's op; its backward also takes the output's gradient ``[S, N]``
    and returns the rows' and the weights' gradients), and ``aten._grouped_mm``'s weight gradient
    ``[A, S] x [S, B] -> [E, A, B]`` (grouped along the rows), split along ``A`` or ``B``, whichever is
    not the model's width. None if nothing splits evenly."""
    ins = node.in_shapes
    if is_grouped_weight_gradient(node):
        a, b = ins[0][0], ins[1][1]
        if a != hidden and a % tp == 0:
            split, outs = {0: 0}, {0: 1}
        elif b != hidden and b % tp == 0:
            split, outs = {1: 1}, {0: 2}
        else:
            return None
    elif len(ins) >= 2 and len(ins[0]) == 2 and len(ins[1]) == 3:
        _, k, n = ins[1]
        backward = "backward" in node.op
        if n != hidden and n % tp == 0:  # the weight's N, the output gradient's N (operand: dimension)
            split, outs = {1: 2, 3: 1}, ({1: 2} if backward else {0: 1})
        elif (k != hidden or n == hidden) and k % tp == 0:  # the rows' K, the weight's, their gradients'
            split, outs = {0: 1, 1: 1}, ({0: 1, 1: 1} if backward else {})
        else:
            return None
    else:
        return None

    in_shapes = [x if i not in split else split_dim(x, split[i], tp) for i, x in enumerate(ins)]
    out_shapes = [x if i not in outs else split_dim(x, outs[i], tp) for i, x in enumerate(node.out_shapes)]
    return node.replace(in_shapes=in_shapes, out_shapes=out_shapes,
                        flops=None if node.flops is None else node.flops // tp,
                        bytes_read=recorded_bytes(in_shapes, node.in_dtypes),
                        bytes_written=recorded_bytes(out_shapes, node.out_dtypes))  # fmt: skip


_ATTENTION = frozenset(
    f"aten.{op}.default"
    for op in ("_softmax", "_safe_softmax", "scaled_dot_product_attention",
               "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
               "_scaled_dot_product_fused_attention_overrideable")
)  # fmt: skip


def attention_heads(nodes: Sequence[NodeCost]) -> int | None:
    """The attention heads of the layers' ``nodes``: dimension 1 of the 4-d inputs of their softmaxes
    and fused attentions (the most common), or None if they have none."""
    counts = Counter(
        n.in_shapes[0][1] for n in nodes if n.op in _ATTENTION and n.in_shapes and len(n.in_shapes[0]) == 4
    )
    return counts.most_common(1)[0][0] if counts else None


def check_tp(tp: int, hidden: int, heads: int | None) -> None:
    """Megatron splits every attention head and the width (so the MLP's 4x width too) evenly over the
    ``tp`` ranks: refuse a degree that divides them unevenly, listing the degrees that do not."""
    sizes = {"{} attention heads": heads, "width {}": hidden if hidden > 1 else None}
    known = {name: size for name, size in sizes.items() if size}
    uneven = [name.format(size) for name, size in known.items() if size % tp]
    if uneven:
        common = math.gcd(*known.values())
        accepted = ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)
        raise ValueError(
            f"tp={tp} does not divide the model's {' and '.join(uneven)}: tensor parallelism splits "
            f"them evenly over its ranks; accepted tp: {accepted}"
        )
