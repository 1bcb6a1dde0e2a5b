"""Row ops (softmax, layer norm) that PyTorch runs as more than their row kernel, as the kernels it runs.

``native_layer_norm_backward`` (``layer_norm_kernel.cu``): the input's gradient in one kernel, the
weight's and bias's in another (``GammaBetaBackwardCUDAKernel``), which reads the output gradient,
the input and the saved statistics again and reduces them over the rows. Lowered to the first as a
node of its own (``output_mask`` only the input's, which the layer-norm head prices) and the second
as a memory pass moving its bytes. The recorded H100 steps show both kernels, about as long each.

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

from fxcost.lowering.nodes import memory_pass, synthetic_node
from fxcost.lowering.traffic import recorded_bytes
from fxcost.records import NodeCost

__all__ = [
    "LAYER_NORM_BACKWARD",
    "PREMULTIPLIED",
    "SAFE_SOFTMAX",
    "SOFTMAX_BACKWARD",
    "lower_layer_norm_backward",
    "lower_safe_softmax",
    "lower_softmax_backward",
    "lowers",
    "reduction_part",
]

SAFE_SOFTMAX = "aten._safe_softmax.default"
LAYER_NORM_BACKWARD = "aten.native_layer_norm_backward.default"
SOFTMAX_BACKWARD = "aten._softmax_backward_data.default"
PREMULTIPLIED = "premultiplied"
"""The argument marking a softmax backward's kernel node, its gradient already times the output."""


def lowers(node: NodeCost) -> bool:
    """Whether ``node`` is a row op this module lowers (not one of the row kernels' own nodes it makes)."""
    if node.op == SOFTMAX_BACKWARD:
        return not node.args.get(PREMULTIPLIED)
    if node.op == LAYER_NORM_BACKWARD:
        return any(_mask(node)[1:])
    return node.op == SAFE_SOFTMAX


def lower_layer_norm_backward(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The (sub-node, repetitions) a ``native_layer_norm_backward`` node runs: the input's gradient
    (where asked for), then the weight's and bias's; empty for other ops and for a node asking for
    the input's gradient alone (one kernel: the node as it is)."""
    if node.op != LAYER_NORM_BACKWARD or len(node.in_shapes) < 5 or not lowers(node):
        return []
    mask = _mask(node)
    dtype = node.in_dtypes[0]
    work: list[tuple[NodeCost, int]] = []
    if mask[0]:
        shapes, dtypes = node.out_shapes[:1], node.out_dtypes[:1]
        grad_input = dataclasses.replace(node, args={**node.args, "output_mask": [True, False, False]},
                                         out_shapes=shapes, out_dtypes=dtypes,
                                         bytes_written=recorded_bytes(shapes, dtypes))  # fmt: skip
        work.append((_unmeasured(grad_input), 1))
    # Reads the output gradient, the input and the statistics; writes a gradient per parameter asked.
    read = recorded_bytes(node.in_shapes[:4], node.in_dtypes[:4])
    written = recorded_bytes([node.in_shapes[4]], [dtype]) * sum(mask[1:])
    work.append((memory_pass(read + written, dtype), 1))
    return work


def _mask(node: NodeCost) -> list[bool]:
    return [bool(m) for m in (node.args.get("output_mask") or [True, True, True])]


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
    """The row kernel's own node of a lowered softmax op (None for other ops): what Inductor's fused
    kernel, which folds the product or the masking passes into it, does no less than. (A layer norm's
    backward has none: Inductor reduces its two gradients in kernels of its own.)"""
    if node.op == SAFE_SOFTMAX:
        work = lower_safe_softmax(node)
        return work[0][0] if work else None
    work = lower_softmax_backward(node)
    return work[1][0] if work else None


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
