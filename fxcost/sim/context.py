"""Context parallelism: the sequence split over ``cp`` ranks, ring attention (Megatron-Core CP; Liu et al.
2023, "Ring Attention with Blockwise Transformers").

Every node of the step runs on ``1/cp`` of the sequence: a tensor's dimension as long as the sequence
(or as the micro-batch's tokens) is split; a mixture-of-experts layer's experts run on the rank's
tokens' routed rows (their first dimension, a multiple of the tokens).

Attention needs every key for its queries: the keys and values travel around the ring of the ``cp``
ranks in ``cp - 1`` send/recv steps per layer while each rank computes the attention of its queries on
the block it holds, so a rank's attention is its queries against all keys (``1/cp`` of the whole), and
a step's transfer hides behind a step's compute when the compute is longer
(:class:`~fxcost.sim.plan.Comm` ``hidden_ms``). With a causal mask Megatron splits the
sequence into ``2 cp`` chunks and gives rank ``i`` chunks ``i`` and ``2 cp - 1 - i`` so that every rank
has the same share of the unmasked work: the rank's work is ``1/cp`` of the traced attention's, whatever
the mask. The backward passes the keys and values again, with their gradients: twice the bytes.

Each rank sends ``tokens / cp`` keys and as many values per step, ``2 * tokens / cp * kv_width`` elements
(``kv_width``: the narrowest projection of the attention, the keys' and values' width with grouped-query
attention; a latent attention's keys' and values' mean width; split over ``tp``). Gradients are reduced
over ``dp * cp`` ranks (:mod:`fxcost.sim.simulator`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fxcost.lowering import recorded_bytes
from fxcost.lowering.experts import GROUPED_MM_OPS, is_grouped_weight_gradient
from fxcost.lowering.nodes import MATMULS
from fxcost.records import NodeCost, Shape
from fxcost.sim.comm import Comm
from fxcost.sim.layers import any_layer
from fxcost.sim.moe import is_expert, is_router
from fxcost.sim.shard import split_dim

if TYPE_CHECKING:
    from fxcost.sim.plan import StagePlan

__all__ = ["add_ring", "attention_nodes", "kv_width", "seqlen_of", "split_sequence"]

_FUSED = ("scaled_dot_product",)  # aten's fused attentions: q, k, v in, the queries' rows out


def seqlen_of(nodes: Sequence[NodeCost]) -> int | None:
    """The sequence length: the square trailing dimensions of the attention scores (softmax inputs), or
    the queries' rows of a fused attention; None without attention."""
    for n in nodes:
        if (
            "softmax" in n.op
            and n.in_shapes
            and len(n.in_shapes[0]) >= 3
            and n.in_shapes[0][-1] == n.in_shapes[0][-2]
        ):
            return n.in_shapes[0][-1]
    for n in nodes:
        if any(f in n.op for f in _FUSED) and n.in_shapes and len(n.in_shapes[0]) == 4:
            return n.in_shapes[0][-2]
    return None


def attention_nodes(nodes: Sequence[NodeCost], seqlen: int) -> set[int]:
    """Positions of the nodes that compute attention: those with a ``seqlen x seqlen`` score tensor, and
    fused attentions."""
    return {i for i, n in enumerate(nodes) if any(f in n.op for f in _FUSED) or _has_scores(n, seqlen)}


def split_sequence(nodes: Sequence[NodeCost], cp: int, seqlen: int, tokens: int) -> list[NodeCost]:
    """``nodes`` as one of ``cp`` context-parallel ranks runs them.

    Raises:
        ValueError: the sequence does not split into ``2 cp`` equal chunks (Megatron's load balancing).
    """
    if seqlen % (2 * cp):
        raise ValueError(f"cp={cp}: the sequence of {seqlen} tokens does not split into 2*cp={2 * cp} "
                         f"equal chunks (causal load balancing); accepted: 2*cp divides it")  # fmt: skip
    return [_split(n, cp, seqlen, tokens) for n in nodes]


def kv_width(nodes: Sequence[NodeCost], attention: set[int], hidden: int, tokens: int) -> int:
    """The width of the keys (and values) one rank sends: the narrowest output of the matmuls on the
    tokens in the modules of the attention nodes (else in their parents), in any layer (``k_proj``;
    ``hidden`` for a fused QKV projection), a mixture-of-experts router's (one column per expert)
    aside. Any layer: a distinct node names one of the layers that ran it, the attention another
    layer than its projections. Where a fused attention's values are narrower than its keys (DeepSeek's
    latent attention, whose narrowest products are the latents the keys and values are projected up
    from), its keys and values themselves: the mean of their widths over the heads."""
    for i in attention:
        n = nodes[i]
        if any(f in n.op for f in _FUSED) and "backward" not in n.op and len(n.in_shapes) >= 3:
            k, v = n.in_shapes[1], n.in_shapes[2]
            if len(k) == len(v) == 4 and k[-1] != v[-1]:
                return k[1] * (k[-1] + v[-1]) // 2
    attending = {any_layer(nodes[i].module) for i in attention}
    products = [
        (any_layer(n.module), n.out_shapes[0][-1])
        for n in nodes
        if n.op in MATMULS and n.out_shapes and math.prod(n.out_shapes[0][:-1]) == tokens
        and not is_router(n.module)
    ]  # fmt: skip
    parents = {m.rsplit(".", 1)[0] for m in attending}
    for modules in (attending, parents):  # the attention's own products, else its parent's
        widths = [
            w for module, w in products if any(module == m or module.startswith(m + ".") for m in modules)
        ]
        if widths:
            return min(widths)
    return hidden


def _has_scores(node: NodeCost, seqlen: int) -> bool:
    return any(len(x) >= 3 and x[-1] == x[-2] == seqlen for x in (*node.in_shapes, *node.out_shapes))


def _split(node: NodeCost, cp: int, seqlen: int, tokens: int) -> NodeCost:
    attention = any(f in node.op for f in _FUSED) or _has_scores(node, seqlen)

    def split(shape: Shape, queries: bool = False) -> Shape:
        if queries:  # the scores' or a matmul's rows: the rank's queries; the keys stay whole
            dims = [len(shape) - 2] if len(shape) >= 2 and shape[-2] == seqlen else []
        else:
            dims = [i for i, x in enumerate(shape) if x in (seqlen, tokens)][:1]
        return tuple(x // cp if i in dims else x for i, x in enumerate(shape))

    if attention and node.op in MATMULS:  # queries x keys, or scores x values: the rank's rows of each
        ins = list(node.in_shapes)
        ins[-2] = split(ins[-2], queries=True)
        in_shapes, out_shapes = ins, [split(x, queries=True) for x in node.out_shapes]
    elif attention and any(f in node.op for f in _FUSED):  # the queries split, the keys and values whole
        backward = "backward" in node.op  # (grad_out, q, k, v, ...) -> (dq, dk, dv) or (q, k, v, ...) -> out
        whole, whole_out = ((2, 3), (1, 2)) if backward else ((1, 2), ())
        in_shapes = [x if i in whole else split(x) for i, x in enumerate(node.in_shapes)]
        out_shapes = [x if i in whole_out else split(x) for i, x in enumerate(node.out_shapes)]
    elif node.op in MATMULS and _is_2d_matmul(node):  # the tokens are its rows or its inner dimension
        return _split_matmul(node, cp, tokens)
    elif attention:  # scores (softmax, mask, dropout): the rank's queries' rows
        in_shapes = [split(x, queries=True) for x in node.in_shapes]
        out_shapes = [split(x, queries=True) for x in node.out_shapes]
    elif is_expert(node.module):  # routed rows (tokens x top-k, sorted by expert); the weights stay whole
        in_shapes, out_shapes = _expert_rows(node, cp, tokens)
    else:
        in_shapes, out_shapes = [split(x) for x in node.in_shapes], [split(x) for x in node.out_shapes]
    if in_shapes == list(node.in_shapes) and out_shapes == list(node.out_shapes):
        return node
    flops = (
        None
        if node.flops is None
        else node.flops // cp
        if attention
        else _scaled(node, in_shapes, out_shapes)
    )
    return node.replace(in_shapes=in_shapes, out_shapes=out_shapes, flops=flops,
                        bytes_read=recorded_bytes(in_shapes, node.in_dtypes),
                        bytes_written=recorded_bytes(out_shapes, node.out_dtypes))  # fmt: skip


def _expert_rows(node: NodeCost, cp: int, tokens: int) -> tuple[list[Shape], list[Shape]]:
    """An expert's node on the rank's routed rows: a grouped GEMM's rows (its input's, its output
    gradient's, its result's; the rows ``aten._grouped_mm``'s weight gradient contracts), any other
    tensor's first dimension where it is a multiple of the tokens (each token's routed copies, or the
    tokens); the weights and the experts' offsets stay whole, and so does a width as long as the
    tokens."""
    ins, outs = list(node.in_shapes), list(node.out_shapes)
    if is_grouped_weight_gradient(node):  # [A, S] x [S, B] -> [E, A, B]
        return [split_dim(ins[0], 1, cp), split_dim(ins[1], 0, cp), *ins[2:]], outs
    if node.op in GROUPED_MM_OPS:
        rows = (0, 3)  # the rows and the output's gradient, of [S, K] x [E, K, N] (offsets [E])
        split_ins = [split_dim(x, 0, cp) if i in rows else x for i, x in enumerate(ins)]
        return split_ins, [split_dim(x, 0, cp) for x in outs[:1]] + outs[1:]  # the rows' result; not dW

    def routed(shape: Shape) -> Shape:
        return split_dim(shape, 0, cp) if shape and shape[0] % tokens == 0 else shape

    return [routed(x) for x in ins], [routed(x) for x in outs]


def _is_2d_matmul(node: NodeCost) -> bool:
    return len(node.in_shapes) >= 2 and all(len(x) == 2 for x in node.in_shapes[-2:])


def _split_matmul(node: NodeCost, cp: int, tokens: int) -> NodeCost:
    """A ``[m, k] x [k, n]`` matmul on the rank's tokens: its rows where they are the tokens (a forward
    or an input gradient), else its inner dimension (a weight gradient: the output keeps the weight's
    shape). The weight operand keeps its shape even where a dimension is as long as the tokens."""
    (m, k), (_, n) = node.in_shapes[-2], node.in_shapes[-1]
    ins: list[Shape] = list(node.in_shapes)
    outs: list[Shape]
    if m == tokens:  # an addmm's bias of the result's shape is split with it, a row bias is not
        ins = [(m // cp, n) if tuple(x) == (m, n) else x for x in ins[:-2]] + [(m // cp, k), ins[-1]]
        outs = [(m // cp, n)]
    elif k == tokens:
        ins[-2], ins[-1], outs = (m, k // cp), (k // cp, n), list(node.out_shapes)
    else:
        return node
    flops = None if node.flops is None else node.flops // cp
    return node.replace(in_shapes=ins, out_shapes=outs, flops=flops,
                        bytes_read=recorded_bytes(ins, node.in_dtypes),
                        bytes_written=recorded_bytes(outs, node.out_dtypes))  # fmt: skip


def _scaled(node: NodeCost, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape]) -> int | None:
    """FLOPs in proportion to the node's first input (its result where it has none): the same for an
    elementwise op, and right for a reduction over the tokens (a bias gradient), whose result keeps its
    shape."""
    old, new = node.in_shapes or node.out_shapes, in_shapes or out_shapes
    if node.flops is None or not old or not new:
        return node.flops
    return round(node.flops * math.prod(new[0]) / max(math.prod(old[0]), 1))


def add_ring(
    stages: Sequence[StagePlan],
    attention_ms: Mapping[tuple[str, str], float],
    kv_bytes: float,
    cp: int,
) -> None:
    """Each layer's ring passes: before its first forward segment's end ``cp - 1`` send/recv steps of the
    keys and values (``kv_bytes``), in its backward of those and their gradients, each step hidden
    behind the step's attention (``attention_ms[(layer, phase)] / cp``)."""
    for st in stages:
        for phase, segments, factor in (("fw", st.forward, 1), ("bw", st.backward, 2)):
            for seg in {seg.layer: seg for seg in reversed(segments) if seg.layer}.values():
                hidden = attention_ms.get((seg.layer, phase), 0.0) / cp
                seg.inside.append(Comm("send_recv", kv_bytes * factor, "cp", "feature", cp - 1, hidden))
