"""Scaled-dot-product attention: its FLOPs and the batched GEMMs it runs.

Every fused attention kernel (FlashAttention, memory-efficient, cuDNN, and the CPU flash kernel a
capture on a laptop records) computes ``S = Q K^T`` and ``O = softmax(S) V`` tile by tile without
writing ``S`` to memory: the work of two batched GEMMs, ``2·B·H·Sq·Sk·(D + Dv)`` FLOPs
(``4·B·H·Sq·Sk·D`` when ``Dv = D``), half of it under a causal mask, whose tiles above the diagonal
are skipped. The backward recomputes ``S`` and runs four more GEMMs of the same sizes
(``dV = P^T dO``, ``dP = dO V^T``, ``dQ = dS K``, ``dK = dS^T Q``): 2.5 times the forward's work.
The softmax between them stays in registers and is not counted, as PyTorch's own formulas do not.

Queries, keys and values are ``[B, H, S, D]``; grouped-query attention gives keys and values fewer
heads, and the work follows the queries' heads. PyTorch counts the flash, efficient and cuDNN variants
without the causal half; the formulas here replace those.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.fx.operator_schemas import normalize_function

from fxcost.lowering.flops import register_flops
from fxcost.lowering.nodes import gemm_node
from fxcost.records import NodeCost, Shape

__all__ = ["ATTENTION_OPS", "attention_flops", "lower_attention"]

aten = torch.ops.aten


def _packets(*names: str) -> tuple[Any, ...]:
    """The aten packets of ``names`` this torch has (the cuDNN and overrideable kernels are newer
    than the oldest torch fxcost supports)."""
    return tuple(getattr(aten, n) for n in names if hasattr(aten, n))


_KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable")  # fmt: skip
_FORWARD = _packets(*_KERNELS)
_BACKWARD = _packets(*(f"{k}_backward" for k in _KERNELS))
_BACKWARD_NAMES = frozenset(f"{p}.default" for p in _BACKWARD)

ATTENTION_OPS = frozenset(f"{p}.default" for p in (*_FORWARD, *_BACKWARD))
"""The fused attention ops (canonical names), forward and backward, priced as their GEMMs."""


def attention_flops(q: Shape, k: Shape, v: Shape, causal: bool, backward: bool) -> int:
    """FLOPs of attention over queries ``q``, keys ``k`` and values ``v`` (``[..., S, D]`` shapes).

    Example:
        >>> attention_flops((2, 4, 128, 64), (2, 4, 128, 64), (2, 4, 128, 64), causal=False, backward=False)
        16777216
    """
    heads, sq, d = math.prod(q[:-2]), q[-2], q[-1]
    sk, dv = k[-2], v[-1]
    # Forward: S (D), O (Dv). Backward: S (D), dV (Dv), dP (Dv), dQ (D), dK (D).
    flops = 2 * heads * sq * sk * ((3 * d + 2 * dv) if backward else (d + dv))
    return flops // 2 if causal else flops


def _formula(packet: Any, backward: bool) -> Any:
    first = 1 if backward else 0  # a backward's first argument is the output's gradient

    def formula(args: Any, kwargs: Any, out: Any) -> int:
        q, k, v = (tuple(t.shape) for t in args[first : first + 3])
        normalized = normalize_function(packet.default, args, kwargs, normalize_to_only_use_kwargs=True)
        causal = bool(normalized.kwargs.get("is_causal", False)) if normalized is not None else False
        return attention_flops(q, k, v, causal, backward)

    return formula


for _packet in _FORWARD:
    register_flops(_packet, replace_torch=True, matmul=True)(_formula(_packet, backward=False))
for _packet in _BACKWARD:
    register_flops(_packet, replace_torch=True, matmul=True)(_formula(_packet, backward=True))


def lower_attention(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The batched GEMMs an attention node runs, as (``bmm`` node, repetitions); empty for other ops.

    A causal mask halves the keys each query meets: the GEMMs are those over half of the keys.
    """
    if node.op not in ATTENTION_OPS:
        return []
    backward = node.op in _BACKWARD_NAMES
    first = 1 if backward else 0
    q, k, v = node.in_shapes[first : first + 3]
    heads, sq, d = math.prod(q[:-2]), q[-2], q[-1]
    sk, dv = k[-2], v[-1]
    if node.args.get("is_causal"):
        sk = max(math.ceil(sk / 2), 1)
    dtype = node.in_dtypes[first]
    scores = gemm_node("bmm", heads, sq, sk, d, dtype)  # S = Q K^T
    if not backward:
        return [(scores, 1), (gemm_node("bmm", heads, sq, dv, sk, dtype), 1)]  # O = P V
    return [
        (scores, 1),
        (gemm_node("bmm", heads, sk, dv, sq, dtype), 1),  # dV = P^T dO
        (gemm_node("bmm", heads, sq, sk, dv, dtype), 1),  # dP = dO V^T
        (gemm_node("bmm", heads, sq, d, sk, dtype), 1),  # dQ = dS K
        (gemm_node("bmm", heads, sk, d, sq, dtype), 1),  # dK = dS^T Q
    ]
