"""Ops priced as the GEMMs they run: cuDNN RNNs (``rnn``), fused attention (``attention``), grouped
mixture-of-experts GEMMs (``experts``). No measurements of these ops exist to learn from; their work
is GEMMs (and a few memory passes) the GEMM and elementwise models do know. And row ops PyTorch runs
as more than their row kernel (``row_ops``): SDPA's math-path softmax, a softmax and the memory
passes that zero its masked rows; the softmax backward, a product and the backward kernel; the layer
norm backward, the input's gradient and a pass reducing the parameters'.
"""

from __future__ import annotations

from fxcost.lowering.attention import ATTENTION_OPS, lower_attention
from fxcost.lowering.experts import GROUPED_MM_OPS, lower_grouped_mm
from fxcost.lowering.rnn import RNN_OPS, lower_rnn
from fxcost.lowering.row_ops import (
    LAYER_NORM_BACKWARD,
    SAFE_SOFTMAX,
    SOFTMAX_BACKWARD,
    lower_layer_norm_backward,
    lower_safe_softmax,
    lower_softmax_backward,
)
from fxcost.records import NodeCost

__all__ = ["COMPOSITE_OPS", "ROW_OPS", "composite_head", "lower_composite"]

ROW_OPS = frozenset({SAFE_SOFTMAX, SOFTMAX_BACKWARD, LAYER_NORM_BACKWARD})
"""Row ops run as more than their row kernel (:mod:`fxcost.lowering.row_ops`)."""
COMPOSITE_OPS = RNN_OPS | ATTENTION_OPS | GROUPED_MM_OPS | ROW_OPS
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
    if node.op == LAYER_NORM_BACKWARD:
        return lower_layer_norm_backward(node)
    return lower_grouped_mm(node)


def composite_head(op: str) -> str:
    """The head whose accuracy a composite op's prediction has: ``bmm`` for attention, ``softmax`` and
    ``ln`` for the row ops, else ``linear``."""
    if op in ATTENTION_OPS:
        return "bmm"
    if op in ROW_OPS:
        return "ln" if op == LAYER_NORM_BACKWARD else "softmax"
    return "linear"
