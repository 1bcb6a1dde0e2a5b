"""Softmax ops that PyTorch runs as more than the softmax kernel, as the kernels it runs.

``_softmax_backward_data``: ATen's CUDA softmax backward (``SoftMax.cu``) first multiplies the
incoming gradient by the softmax's output in a kernel of its own (``tmp = grad * output``), then runs
the backward kernel on ``tmp``; the recorded H100 steps show the elementwise kernel before
``softmax_warp_backward``, as long as it. Lowered to that product and the backward kernel's node
(marked :data:`PREMULTIPLIED`, which the softmax head prices). ``_log_softmax_backward_data`` has no
such product.

``_safe_softmax`` (the softmax of ``scaled_dot_product_attention``'s math path, zeros for a row that
is masked whole) is a composite in PyTorch (ATen's ``_safe_softmax``, the steps of the decomposition
in ``torch/_decomp/decompositions.py``): the softmax, then ``eq(x, -inf)`` over the input (a bool
tensor), ``all`` over each row of it, and ``where`` putting zeros in the rows found masked. Each step
is a kernel of its own through memory; the recorded H100 steps show the five launches (softmax,
``eq``, the reduction, a scalar zero, ``where``), the four after the softmax taking 1.6-2.3x its time.
Priced as a softmax plus those passes, each by the model of its class.
"""

from __future__ import annotations

import dataclasses
import math

from fxcost.lowering.nodes import synthetic_node
from fxcost.lowering.traffic import recorded_bytes
from fxcost.records import NodeCost

__all__ = [
    "PREMULTIPLIED",
    "SAFE_SOFTMAX",
    "SOFTMAX_BACKWARD",
    "lower_safe_softmax",
    "lower_softmax_backward",
    "reduction_part",
]

SAFE_SOFTMAX = "aten._safe_softmax.default"
SOFTMAX_BACKWARD = "aten._softmax_backward_data.default"
PREMULTIPLIED = "premultiplied"
"""The argument marking a softmax backward's kernel node, its gradient already times the output."""


def lower_softmax_backward(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The (sub-node, repetitions) a ``_softmax_backward_data`` node runs: ``grad * output``, then the
    backward kernel; empty for other ops and for the backward kernel's own node."""
    if node.op != SOFTMAX_BACKWARD or len(node.in_shapes) < 2 or node.args.get(PREMULTIPLIED):
        return []
    grad, output = (tuple(s) for s in node.in_shapes[:2])
    product = _retyped(synthetic_node("aten.mul.Tensor", [grad, output], [grad], flops=math.prod(grad)),
                       list(node.in_dtypes[:2]), [node.in_dtypes[0]])  # fmt: skip
    kernel = _unmeasured(dataclasses.replace(node, args={**node.args, PREMULTIPLIED: True}))
    return [(product, 1), (kernel, 1)]


def lower_safe_softmax(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The (sub-node, repetitions) a ``_safe_softmax`` node runs; empty for other ops."""
    if node.op != SAFE_SOFTMAX or not node.in_shapes or not node.out_dtypes:
        return []
    x = tuple(node.in_shapes[0])
    dim = int(node.args.get("dim", -1)) % max(len(x), 1)
    rows = (*x[:dim], 1, *x[dim + 1 :])
    numel = math.prod(x)
    dtype = node.out_dtypes[0]
    softmax = _unmeasured(dataclasses.replace(node, op="aten._softmax.default", name="_softmax"))
    masked = _retyped(synthetic_node("aten.eq.Scalar", [x], [x], flops=numel), [node.in_dtypes[0]], ["bool"])
    reduce = synthetic_node("aten.all.dim", [x], [rows], {"dim": dim, "keepdim": True}, flops=0)
    masked_rows = _retyped(reduce, ["bool"], ["bool"])
    zero = synthetic_node("aten.scalar_tensor.default", [], [()], flops=0, dtype=dtype)
    where = _retyped(synthetic_node("aten.where.self", [rows, (), x], [x], flops=numel),
                     ["bool", dtype, dtype], [dtype])  # fmt: skip
    return [(softmax, 1), (masked, 1), (masked_rows, 1), (zero, 1), (where, 1)]


def reduction_part(node: NodeCost) -> NodeCost | None:
    """The softmax kernel's own node of a lowered softmax op (None for other ops): what Inductor's
    fused kernel, which folds the product or the masking passes into it, does no less than."""
    work = lower_safe_softmax(node) or lower_softmax_backward(node)
    if not work:
        return None
    return work[0][0] if node.op == SAFE_SOFTMAX else work[1][0]


def _unmeasured(node: NodeCost) -> NodeCost:
    """``node`` without the measurements of the node it stands in part for (they hold all its kernels)."""
    return dataclasses.replace(node, origin_ms=None, kernels=[], pred_ms={}, pred_source={})


def _retyped(node: NodeCost, in_dtypes: list[str], out_dtypes: list[str]) -> NodeCost:
    """``node`` with its tensors of ``in_dtypes`` and ``out_dtypes``, its bytes counted with them."""
    return dataclasses.replace(
        node, in_dtypes=in_dtypes, out_dtypes=out_dtypes,
        bytes_read=recorded_bytes(node.in_shapes, in_dtypes),
        bytes_written=recorded_bytes(node.out_shapes, out_dtypes),
    )  # fmt: skip
