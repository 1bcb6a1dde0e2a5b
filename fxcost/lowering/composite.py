"""Ops priced as the GEMMs they run: cuDNN RNNs (``rnn``), fused attention (``attention``), grouped
mixture-of-experts GEMMs (``experts``). No measurements of these ops exist to learn from; their work
is GEMMs (and a few memory passes) the GEMM and elementwise models do know. And softmax ops PyTorch
runs as more than the softmax kernel (``softmax``): SDPA's math-path softmax, a softmax and the
memory passes that zero its masked rows; the softmax backward, a product and the backward kernel.
"""

from __future__ import annotations

from fxcost.lowering.attention import ATTENTION_OPS, lower_attention
from fxcost.lowering.experts import GROUPED_MM_OPS, lower_grouped_mm
from fxcost.lowering.rnn import RNN_OPS, lower_rnn
from fxcost.lowering.softmax import SAFE_SOFTMAX, SOFTMAX_BACKWARD, lower_safe_softmax, lower_softmax_backward
from fxcost.records import NodeCost

__all__ = ["COMPOSITE_OPS", "composite_head", "lower_composite"]

COMPOSITE_OPS = RNN_OPS | ATTENTION_OPS | GROUPED_MM_OPS | {SAFE_SOFTMAX, SOFTMAX_BACKWARD}
"""Canonical names of the ops :func:`lower_composite` lowers."""


def lower_composite(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The (sub-node, repetitions) a composite node runs; empty for other ops or shapes it cannot read."""
    if node.op in RNN_OPS:
        return lower_rnn(node)
    if node.op in ATTENTION_OPS:
        return lower_attention(node)
    if node.op == SAFE_SOFTMAX:
        return lower_safe_softmax(node)
    if node.op == SOFTMAX_BACKWARD:
        return lower_softmax_backward(node)
    return lower_grouped_mm(node)


def composite_head(op: str) -> str:
    """The head whose accuracy a composite op's prediction has: ``bmm`` for attention, ``softmax`` for
    the softmax ops, else ``linear``."""
    return "bmm" if op in ATTENTION_OPS else "softmax" if op in (SAFE_SOFTMAX, SOFTMAX_BACKWARD) else "linear"
