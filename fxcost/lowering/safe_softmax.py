"""``_safe_softmax`` (the softmax of ``scaled_dot_product_attention``'s math path, zeros for a row that
is masked whole) as the kernels PyTorch runs for it.

It is a composite in PyTorch (ATen's ``_safe_softmax``, the steps of the decomposition in
``torch/_decomp/decompositions.py``): the softmax, then ``eq(x, -inf)`` over the input (a bool
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

__all__ = ["SAFE_SOFTMAX", "lower_safe_softmax"]

SAFE_SOFTMAX = "aten._safe_softmax.default"


def lower_safe_softmax(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The (sub-node, repetitions) a ``_safe_softmax`` node runs; empty for other ops."""
    if node.op != SAFE_SOFTMAX or not node.in_shapes or not node.out_dtypes:
        return []
    x = tuple(node.in_shapes[0])
    dim = int(node.args.get("dim", -1)) % max(len(x), 1)
    rows = (*x[:dim], 1, *x[dim + 1 :])
    numel = math.prod(x)
    dtype = node.out_dtypes[0]
    # The softmax alone: none of the node's measurements, which hold all five kernels.
    softmax = dataclasses.replace(node, op="aten._softmax.default", name="_softmax", origin_ms=None,
                                  kernels=[], pred_ms={}, pred_source={})  # fmt: skip
    masked = _retyped(synthetic_node("aten.eq.Scalar", [x], [x], flops=numel), [node.in_dtypes[0]], ["bool"])
    reduce = synthetic_node("aten.all.dim", [x], [rows], {"dim": dim, "keepdim": True}, flops=0)
    masked_rows = _retyped(reduce, ["bool"], ["bool"])
    zero = synthetic_node("aten.scalar_tensor.default", [], [()], flops=0, dtype=dtype)
    where = _retyped(synthetic_node("aten.where.self", [rows, (), x], [x], flops=numel),
                     ["bool", dtype, dtype], [dtype])  # fmt: skip
    return [(softmax, 1), (masked, 1), (masked_rows, 1), (zero, 1), (where, 1)]


def _retyped(node: NodeCost, in_dtypes: list[str], out_dtypes: list[str]) -> NodeCost:
    """``node`` with its tensors of ``in_dtypes`` and ``out_dtypes``, its bytes counted with them."""
    return dataclasses.replace(
        node, in_dtypes=in_dtypes, out_dtypes=out_dtypes,
        bytes_read=recorded_bytes(node.in_shapes, in_dtypes),
        bytes_written=recorded_bytes(node.out_shapes, out_dtypes),
    )  # fmt: skip
