"""Inductor's attention rewrite: ``softmax(Q K^T * scale [+ mask]) V`` run as one fused attention kernel.

Before it fuses anything, Inductor matches the attention of models written out op by op (Hugging
Face's eager attention) and replaces it with ``scaled_dot_product_attention``
(``torch/_inductor/fx_passes/fuse_attention.py``): the score matrix is then never written to
memory. :func:`attention_chains` finds those chains in node records: a ``bmm`` whose scores go,
through views and pointwise ops on the scores only (a scale, an additive or ``where`` mask, a cast),
to a ``_softmax`` over the last dimension, then (an inactive or active dropout aside) into the
``bmm`` with the values. :func:`attention_node` is the fused kernel the chain becomes, an
``aten._scaled_dot_product_efficient_attention`` node (the kernel that runs fp32, and that a mask
tensor selects), priced as its GEMMs by the cost models (:mod:`fxcost.lowering.attention`).

Only forward-only steps are rewritten here: in a training step the forward's softmax result is saved
for backward, and the records do not say which of the forward's results the backward reads.
Which patterns match depends on the torch version (the installed one matches masks added and
``where``-masked); a mask's own read is not counted in the fused kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fxcost.lowering.attention import attention_flops
from fxcost.lowering.nodes import synthetic_node
from fxcost.records import NodeCost

__all__ = ["ATTENTION_KERNEL", "attention_chains", "attention_node"]

ATTENTION_KERNEL = "aten._scaled_dot_product_efficient_attention.default"

_BMM = "aten.bmm.default"
_SOFTMAX = "aten._softmax.default"
# Pointwise ops a matched chain may hold between the scores and the softmax, and after it.
_BEFORE = frozenset({"aten.mul.Tensor", "aten.div.Tensor", "aten.add.Tensor", "aten.where.self",
                     "aten.masked_fill.Scalar", "aten.masked_fill.Tensor",
                     "aten._to_copy.default"})  # fmt: skip
_AFTER = frozenset({"aten.native_dropout.default", "aten.clone.default", "aten._to_copy.default"})


def attention_chains(nodes: Sequence[NodeCost], users: Sequence[list[int]]) -> list[list[int]]:
    """The attention chains among ``nodes`` (positions, from the scores' ``bmm`` to the values'
    ``bmm``); ``users[i]``: the positions reading node ``i``. Empty for a step with a backward phase."""
    if any(n.phase == "bw" for n in nodes):
        return []
    chains = []
    for i, node in enumerate(nodes):
        if node.op == _BMM and node.out_shapes:
            chain = _chain_from(i, nodes, users)
            if chain is not None:
                chains.append(chain)
    return chains


def attention_node(scores: NodeCost, values: NodeCost) -> NodeCost:
    """The fused attention kernel of a chain from its two ``bmm`` nodes: queries ``[BH, Sq, D]``,
    keys ``[BH, Sk, D]``, values ``[BH, Sk, Dv]``."""
    q, k_t = scores.in_shapes[0], scores.in_shapes[1]
    v = values.in_shapes[1]
    k = (*k_t[:-2], k_t[-1], k_t[-2])
    out = (*q[:-1], v[-1])
    flops = attention_flops(q, k, v, causal=False, backward=False)
    return synthetic_node(ATTENTION_KERNEL, [q, k, v], [out], flops=flops, dtype=scores.in_dtypes[0])


def _chain_from(start: int, nodes: Sequence[NodeCost], users: Sequence[list[int]]) -> list[int] | None:
    numel = math.prod(nodes[start].out_shapes[0])
    chain, i, seen_softmax = [start], start, False
    while True:
        following = _kernel_users(i, nodes, users)
        if len(following) != 1:
            return None
        j = following[0]
        node = nodes[j]
        if node.op == _BMM and seen_softmax:  # the probabilities must be its first operand
            return [*chain, j] if math.prod(node.in_shapes[0]) == numel else None
        allowed = _AFTER if seen_softmax else _BEFORE | {_SOFTMAX}
        if node.op not in allowed or not node.out_shapes or math.prod(node.out_shapes[0]) != numel:
            return None
        if node.op == _SOFTMAX:
            if int(node.args.get("dim", -1)) not in (-1, len(node.out_shapes[0]) - 1):
                return None
            seen_softmax = True
        chain.append(j)
        i = j


def _kernel_users(i: int, nodes: Sequence[NodeCost], users: Sequence[list[int]]) -> list[int]:
    """The kernel nodes reading node ``i``'s result, through views and tuple access."""
    out, stack = [], list(users[i])
    while stack:
        u = stack.pop()
        if nodes[u].has_kernel:
            out.append(u)
        else:
            stack.extend(users[u])
    return sorted(set(out))
