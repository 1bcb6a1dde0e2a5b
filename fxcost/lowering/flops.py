"""FLOP formulas per ATen op.

PyTorch's own registry (``torch.utils.flop_counter``) covers the matmul-class ops (mm, addmm, bmm,
baddbmm, convolution and its backward, attention); fxcost uses it first. The formulas here cover the
rest: pointwise ops and reductions from their ATen tags, and explicit formulas for normalizations,
softmax, pooling, losses, dropout and the ``_foreach`` ops of optimizers. Counting conventions follow
fvcore: one FLOP per multiply or add, a fused multiply-add is two.

An op with no formula gets ``None`` (unknown), never zero; ops that only move data get zero.

Example:
    >>> import torch
    >>> a, b = torch.empty(64, 32), torch.empty(32, 16)
    >>> count_flops(torch.ops.aten.mm.default, (a, b), {}, torch.empty(64, 16))
    65536
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

__all__ = ["count_flops", "is_matmul_class", "register_flops"]

aten = torch.ops.aten

FlopFormula = Callable[..., int | None]
# By canonical packet name (``"aten.mm"``): the ops of optional libraries (``transformers.*``) exist as
# objects only once the library is imported, which importing fxcost must not do.
_FORMULAS: dict[str, FlopFormula] = {}
# Packets that count as matmul-class work besides those of PyTorch's registry.
_MATMUL_EXTRA: set[str] = set()


def register_flops(
    *packets: Any, replace_torch: bool = False, matmul: bool = False
) -> Callable[[FlopFormula], FlopFormula]:
    """Register a formula ``f(args, kwargs, out) -> flops`` for op packets (``aten.mm``, or the
    canonical name of an optional library's op, ``"transformers.grouped_mm_fallback"``); refuses
    duplicates. ``replace_torch`` lets it stand in for PyTorch's own formula of the op (which
    ``count_flops`` otherwise uses); ``matmul`` makes the op matmul-class (:func:`is_matmul_class`)."""

    def decorator(formula: FlopFormula) -> FlopFormula:
        for packet in packets:
            if not isinstance(packet, (torch._ops.OpOverloadPacket, str)):
                raise TypeError(f"register_flops takes op packets (aten.mm) or their names, got {packet!r}")
            name = str(packet)
            in_torch = any(str(p) == name for p in flop_registry)
            if name in _FORMULAS or (in_torch and not replace_torch):
                raise ValueError(f"a FLOP formula for {name} is already registered")
            _FORMULAS[name] = formula
            if matmul:
                _MATMUL_EXTRA.add(name)
        return formula

    return decorator


def _numel(x: Any) -> int:
    return sum(t.numel() for t in tree_leaves(x) if isinstance(t, torch.Tensor))


def _first_tensor(args: Any) -> torch.Tensor:
    return next(t for t in tree_leaves(args) if isinstance(t, torch.Tensor))


def count_flops(
    op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int | torch.SymInt | None:
    """FLOPs of one call of ``op`` on (fake) tensors ``args``/``kwargs`` giving ``out``; None if unknown.

    Under dynamic shapes the count is a ``SymInt`` expression in the graph's symbolic sizes (left
    symbolic: converting it to an int would add a guard that specializes the graph).
    """
    packet = getattr(op, "overloadpacket", None)
    if isinstance(op, torch._ops.HigherOrderOperator):  # named as a capture names it
        packet = f"torch.ops.higher_order.{op}"
    formula = _FORMULAS.get(str(packet)) if packet is not None else None
    if formula is not None:
        return formula(args, kwargs, out)
    if packet in flop_registry:
        return flop_registry[packet](*args, **kwargs, out_val=out)
    if isinstance(op, torch._ops.OpOverload):
        if op.is_view:
            return 0
        if torch.Tag.pointwise in op.tags:
            return _numel(out)
        if torch.Tag.reduction in op.tags:
            return _first_tensor(args).numel()
    return None


def is_matmul_class(op: str) -> bool:
    """Whether a canonical op name (``"aten.mm.default"``) is GEMM, convolution or attention work.

    These are the ops PyTorch's own FLOP registry covers, and the ones tensor cores run.
    """
    packet = op.rsplit(".", 1)[0]
    return packet in _MATMUL_CLASS or packet in _MATMUL_EXTRA or op in _MATMUL_EXTRA  # or a higher-order op


_MATMUL_CLASS = frozenset(str(packet) for packet in flop_registry)


def _per_element(flops_per_element: int, of: str = "input") -> FlopFormula:
    """A formula counting ``flops_per_element`` per element of the first input (or of the output)."""

    def formula(args: Any, kwargs: Any, out: Any) -> int:
        n = _first_tensor(args).numel() if of == "input" else _numel(_first_tensor(out))
        return flops_per_element * n

    return formula


# Data movement: copies, concatenation, padding, gathers, fills. They cost bytes, not FLOPs.
register_flops(
    aten.clone, aten._to_copy, aten.copy, aten.copy_, aten.cat, aten.stack, aten.constant_pad_nd,
    aten.index_select, aten.gather, aten.index, aten.slice_scatter, aten.select_scatter,
    aten.as_strided_scatter, aten.embedding, aten.zeros, aten.ones, aten.full, aten.zeros_like,
    aten.ones_like, aten.full_like, aten.fill, aten.fill_, aten.scalar_tensor, aten.arange,
    aten.repeat, aten.new_zeros, aten.new_ones, aten.new_full, aten.lift_fresh_copy,
    aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
    aten.bernoulli, aten.rand, aten.randn, aten.rand_like, aten.randn_like, aten.randint,
    aten.roll, aten.flip, aten._unsafe_index, aten.scatter, aten.sort, aten.topk,
)(lambda args, kwargs, out: 0)  # fmt: skip

# Elementwise ops PyTorch does not tag pointwise: one FLOP per output element, as for tagged ones.
register_flops(aten.hardswish, aten.hardswish_backward, aten.hardsigmoid_backward, aten.hardtanh_backward,
               aten.floor_divide, aten.histc)(_per_element(1, of="output"))  # fmt: skip
# Scatter-adds: one add per added element (the values, the source); a plain index_put only copies.
register_flops(aten.scatter_add)(lambda args, kwargs, out: _numel(args[3]))


@register_flops(aten._unsafe_index_put, aten.index_put)
def _index_put(args: Any, kwargs: Any, out: Any) -> int:
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    return _numel(args[2]) if accumulate else 0


@register_flops(aten._embedding_bag, aten._embedding_bag_forward_only)
def _embedding_bag(args: Any, kwargs: Any, out: Any) -> int:
    """One add per gathered element: a row of the weight per index (sum, mean or max of the bag)."""
    weight, indices = args[0], args[1]
    return _numel(indices) * weight.shape[-1]


@register_flops(aten._embedding_bag_backward, aten._embedding_bag_dense_backward)
def _embedding_bag_backward(args: Any, kwargs: Any, out: Any) -> int:
    """One add per index: its bag's gradient row added into the weight row it names."""
    grad, indices = args[0], args[1]
    return _numel(indices) * grad.shape[-1]


# Normalizations: mean, variance, normalize, scale and shift, as fvcore counts them (5 per element
# with an affine transform); their backward passes cost about twice the forward.
register_flops(
    aten.native_layer_norm, aten.native_batch_norm, aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
    aten.native_group_norm,
)(_per_element(5))  # fmt: skip
register_flops(
    aten.native_layer_norm_backward,
    aten.native_batch_norm_backward,
    aten.native_group_norm_backward,
)(_per_element(10, of="output"))

# Softmax: max, subtract, exp, sum, divide; its backward: multiply, sum, subtract, multiply.
register_flops(aten._softmax, aten._log_softmax, aten._safe_softmax)(_per_element(5))
register_flops(aten._softmax_backward_data, aten._log_softmax_backward_data)(_per_element(4))

# Dropout draws a random number, compares and scales; its backward multiplies by the mask.
register_flops(aten.native_dropout)(_per_element(3))
register_flops(aten.native_dropout_backward)(_per_element(2))

register_flops(aten.embedding_dense_backward)(_per_element(1))  # scatter-add of the gradient rows
register_flops(aten.nll_loss_forward, aten.nll_loss_backward, aten.nll_loss2d_forward,
               aten.nll_loss2d_backward, aten.mse_loss)(_per_element(1))  # fmt: skip
register_flops(aten.mse_loss_backward)(_per_element(3))


@register_flops(aten.max_pool2d_with_indices, aten.avg_pool2d)
def _pool2d(args: Any, kwargs: Any, out: Any) -> int:
    """One compare (max) or add (average) per window element per output element."""
    kernel = args[1] if len(args) > 1 else kwargs["kernel_size"]
    window = math.prod(kernel) if len(kernel) > 1 else kernel[0] ** 2
    return window * _first_tensor(out).numel()


register_flops(aten.max_pool2d_with_indices_backward, aten.avg_pool2d_backward)(_per_element(1))
register_flops(aten._adaptive_avg_pool2d)(_per_element(1))
register_flops(aten._adaptive_avg_pool2d_backward)(_per_element(1, of="output"))


def _foreach(flops_per_element: int) -> FlopFormula:
    """Optimizer ``_foreach`` ops apply one pointwise op to every tensor of their first list."""

    def formula(args: Any, kwargs: Any, out: Any) -> int:
        return flops_per_element * _numel(args[0])

    return formula


register_flops(
    aten._foreach_add, aten._foreach_add_, aten._foreach_sub, aten._foreach_sub_,
    aten._foreach_mul, aten._foreach_mul_, aten._foreach_div, aten._foreach_div_,
    aten._foreach_sqrt, aten._foreach_sqrt_, aten._foreach_neg, aten._foreach_neg_,
    aten._foreach_reciprocal, aten._foreach_reciprocal_, aten._foreach_maximum,
    aten._foreach_maximum_, aten._foreach_pow, aten._foreach_sign, aten._foreach_abs,
)(_foreach(1))  # fmt: skip
register_flops(
    aten._foreach_addcmul, aten._foreach_addcmul_, aten._foreach_addcdiv, aten._foreach_addcdiv_,
    aten._foreach_lerp, aten._foreach_lerp_,
)(_foreach(2))  # fmt: skip
register_flops(aten._foreach_copy_, aten._foreach_zero_)(lambda args, kwargs, out: 0)
