"""Lowering cuDNN's fused RNN ops to the GEMMs and elementwise work they perform.

There are no measurements of ``_cudnn_rnn`` to learn from; its work is regular, though. Per layer and
direction a cuDNN LSTM (GRU, RNN) runs one GEMM projecting the whole input sequence onto the gates,
then, per time step, a GEMM of the hidden state with the recurrent weights and the pointwise gate
math. The backward pass runs each GEMM twice (gradient of the input and of the weights) and the
pointwise work again. Those sub-nodes are predicted by the GEMM and elementwise models.
"""

from __future__ import annotations

from fxcost.lowering.nodes import gemm_node, synthetic_node
from fxcost.records import NodeCost

__all__ = ["RNN_OPS", "lower_rnn"]

RNN_OPS = frozenset({"aten._cudnn_rnn.default", "aten._cudnn_rnn_backward.default"})

# cuDNN modes: RNN with tanh, RNN with ReLU, LSTM, GRU -> gates per step.
_GATES = {0: 1, 1: 1, 2: 4, 3: 3}
# Pointwise passes over the gate tensor per step: activations, cell update, output (LSTM/GRU).
_POINTWISE_PASSES = 3


def lower_rnn(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The (sub-node, repetitions) an RNN node performs; empty if ``node`` is not a cuDNN RNN."""
    if node.op not in RNN_OPS or not node.in_shapes:
        return []
    args = node.args
    x = node.in_shapes[0]
    steps, batch, features = (x[1], x[0], x[2]) if args.get("batch_first") else (x[0], x[1], x[2])
    hidden, layers = int(args["hidden_size"]), int(args["num_layers"])
    directions = 2 if args.get("bidirectional") else 1
    gates = _GATES.get(int(args["mode"]), 4) * hidden
    passes = 2 if node.op == "aten._cudnn_rnn_backward.default" else 1
    work: list[tuple[NodeCost, int]] = []
    for layer in range(layers):
        width = features if layer == 0 else hidden * directions
        work.append((gemm_node("linear", 1, steps * batch, gates, width), directions * passes))
        work.append((gemm_node("linear", 1, batch, gates, hidden), steps * directions * passes))
        pointwise = synthetic_node("aten.mul.Tensor", [(batch, gates)] * 2, [(batch, gates)])
        work.append((pointwise, steps * directions * passes * _POINTWISE_PASSES))
    return work
