"""Grouped GEMMs of mixture-of-experts layers: their FLOPs and the GEMMs they run.

Hugging Face's MoE experts (``transformers.integrations.moe``) sort the routed tokens by expert and
multiply each expert's rows by its weight in one grouped GEMM: ``aten._grouped_mm`` where PyTorch
has it for the weights' dtype, else their own opaque custom op ``transformers.grouped_mm_fallback``,
which loops over the experts with one ``mm`` each (what a torch.compile capture of fp32 weights
records, on a CPU or a GPU). Input ``[S, K]`` (S routed rows: tokens times experts per token), weight
``[E, K, N]``, ``offs[E]`` the rows' cumulative end per expert: ``2·S·K·N`` FLOPs forward, twice that
backward (the input's and the weight's gradients).

Which rows go to which expert is data, unknown when a graph is traced: the lowering assumes the
router balances them, ``ceil(S / E)`` rows per expert, which is also what a load-balancing loss aims
at. The outputs (and backward gradients) are zero-filled first, one memory pass each.

The custom ops are known by name: their objects exist only once ``transformers`` is imported.
"""

from __future__ import annotations

import math
from typing import Any

from fxcost.lowering.flops import register_flops
from fxcost.lowering.nodes import gemm_node, memory_pass
from fxcost.precision import itemsize
from fxcost.records import NodeCost

__all__ = ["GROUPED_MM_OPS", "grouped_mm_flops", "is_grouped_weight_gradient", "lower_grouped_mm"]

_FALLBACK = "transformers.grouped_mm_fallback"
_FALLBACK_BACKWARD = "transformers.grouped_mm_fallback_backward"
_ATEN = "aten._grouped_mm"

GROUPED_MM_OPS = frozenset({f"{_FALLBACK}.default", f"{_FALLBACK_BACKWARD}.default", f"{_ATEN}.default"})
"""Grouped GEMM ops (canonical names), priced as one GEMM per expert."""


def is_grouped_weight_gradient(node: NodeCost) -> bool:
    """Whether ``node`` is ``aten._grouped_mm`` grouped along the rows it contracts, as autograd runs an
    expert weight's gradient: ``[A, S] x [S, B] -> [E, A, B]`` (the other layouts: rows ``[S, K]`` by
    weights ``[E, K, N]``)."""
    ins, outs = node.in_shapes, node.out_shapes
    return (
        node.op in GROUPED_MM_OPS
        and len(ins) >= 2
        and len(ins[0]) == len(ins[1]) == 2
        and bool(outs)
        and len(outs[0]) == 3
    )


def grouped_mm_flops(rows: int, k: int, n: int, backward: bool) -> int:
    """FLOPs of ``rows`` rows of width ``k`` multiplied by their experts' ``[k, n]`` weights.

    Example:
        >>> grouped_mm_flops(4096, 1024, 3584, backward=False)
        30064771072
    """
    return (4 if backward else 2) * rows * k * n


@register_flops(_FALLBACK, _ATEN, matmul=True)  # by name: aten._grouped_mm is new in torch 2.8
def _forward(args: Any, kwargs: Any, out: Any) -> int | None:
    x, w = args[0], args[1]
    if x.dim() != 2 or w.dim() != 3:  # other _grouped_mm layouts (3-D by 3-D, groups along K)
        return None
    return grouped_mm_flops(x.shape[0], x.shape[1], w.shape[2], backward=False)


@register_flops(_FALLBACK_BACKWARD, matmul=True)
def _backward(args: Any, kwargs: Any, out: Any) -> int:
    x, w = args[0], args[1]
    return grouped_mm_flops(x.shape[0], x.shape[1], w.shape[2], backward=True)


def lower_grouped_mm(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The GEMMs (one per expert, rows balanced) and zero-fills a grouped GEMM node runs, as (node,
    repetitions); empty for other ops or layouts."""
    if node.op not in GROUPED_MM_OPS or len(node.in_shapes) < 2:
        return []
    x, w = node.in_shapes[0], node.in_shapes[1]
    if len(x) != 2 or len(w) != 3:
        return []
    rows, k = x
    experts, n = w[0], w[2]
    per_expert = max(math.ceil(rows / experts), 1)
    dtype = node.in_dtypes[1]
    if node.op == f"{_FALLBACK_BACKWARD}.default":
        zeros = (rows * k + experts * k * n) * itemsize(dtype)  # grad_input and grad_weight
        return [
            (memory_pass(zeros, dtype), 1),
            (gemm_node("linear", 1, per_expert, k, n, dtype), experts),  # dX = dY W^T
            (gemm_node("linear", 1, k, n, per_expert, dtype), experts),  # dW = X^T dY
        ]
    work = [(gemm_node("linear", 1, per_expert, n, k, dtype), experts)]
    if node.op == f"{_FALLBACK}.default":  # it zero-fills its output first; aten's kernel writes it
        work.insert(0, (memory_pass(rows * n * itemsize(dtype), dtype), 1))
    return work
