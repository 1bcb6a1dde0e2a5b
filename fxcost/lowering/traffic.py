"""Memory traffic of a node and whether it launches a kernel at all."""

from __future__ import annotations

import contextlib
import contextvars
import math
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import sympy
import torch

from fxcost.precision import itemsize

__all__ = ["FLEX_OPS", "bound_sizes", "has_kernel", "recorded_bytes", "size_hint", "tensor_bytes"]

aten = torch.ops.aten

FLEX_OPS = ("torch.ops.higher_order.flex_attention", "torch.ops.higher_order.flex_attention_backward")
"""FlexAttention's higher-order ops (``torch.nn.attention.flex_attention``), forward and backward, as a
capture names them: the higher-order ops that run a kernel, one generated Triton kernel each,
FlashAttention-2's tiled online softmax with the user's score and mask functions inlined
(:mod:`fxcost.lowering.attention` prices them)."""

# Ops that allocate or alias without running a kernel. Views are found from their schema instead.
_NO_KERNEL: frozenset[Any] = frozenset(
    {
        operator.getitem,
        aten.empty.memory_format,
        aten._unsafe_view.default,  # a view of a fresh tensor, though not marked as one
        aten.empty_strided.default,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
        aten._assert_async.default,
        aten._assert_async.msg,
        aten.sym_size.int,
        aten.sym_stride.int,
        aten.sym_numel.default,
        aten.sym_storage_offset.default,
    }
)


def has_kernel(target: Any) -> bool:
    """Whether calling ``target`` launches a GPU kernel.

    ATen ops do, except views, allocations and size queries. Python-level targets in ATen graphs
    (``operator.getitem``, arithmetic on symbolic sizes) run on the host only.
    """
    if target in _NO_KERNEL:
        return False
    if isinstance(target, torch._ops.OpOverload):
        return not target.is_view
    higher_order = isinstance(target, torch._ops.HigherOrderOperator)
    return higher_order and f"torch.ops.higher_order.{target}" in FLEX_OPS


def tensor_bytes(t: torch.Tensor) -> int | torch.SymInt:
    """Bytes a kernel touches to read or write ``t`` once.

    Broadcast (stride-0) dimensions are read once, not once per use, so an expanded bias of shape
    ``[B, N]`` built from ``[N]`` counts ``N`` elements. Under dynamic shapes the result is a ``SymInt``
    expression; strides are compared by their hints, so no guard is added to the graph.
    """
    elements: int | torch.SymInt = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if size_hint(stride) != 0:
            elements = elements * size
    return elements * t.element_size()


def size_hint(x: int | torch.SymInt) -> int:
    """A concrete int from an int or a ``SymInt``, read without adding a guard: its value under the
    sizes :func:`bound_sizes` binds, else at the sizes the graph was traced with.

    Raises:
        ValueError: a data-dependent size, which has no value until the graph runs.
    """
    if isinstance(x, torch.SymInt):
        bindings = _BINDINGS.get()
        if bindings:
            value = sympy.sympify(x.node.expr).xreplace(bindings)
            if value.is_number:
                return int(value)
        hint = x.node.hint
        if hint is None:
            raise ValueError(f"symbolic size {x} has no concrete hint")
        return int(hint)
    return int(x)


@contextlib.contextmanager
def bound_sizes(bindings: Mapping[sympy.Symbol, int]) -> Iterator[None]:
    """Within the block, :func:`size_hint` reads symbolic sizes at ``bindings`` (a graph compiled for
    dynamic shapes, annotated at the sizes it last ran with)."""
    token = _BINDINGS.set({symbol: sympy.Integer(size) for symbol, size in bindings.items()})
    try:
        yield
    finally:
        _BINDINGS.reset(token)


_BINDINGS: contextvars.ContextVar[dict[sympy.Symbol, sympy.Integer] | None] = contextvars.ContextVar(
    "fxcost_size_bindings", default=None
)


def recorded_bytes(shapes: Iterable[Sequence[int]], dtypes: Iterable[str]) -> int:
    """Bytes of tensors known by their recorded shapes and dtype names (dense, no broadcast)."""
    return sum(math.prod(s) * itemsize(d) for s, d in zip(shapes, dtypes, strict=False))
