"""Cache keys of the estimator: what in a model and its inputs decides the traced graph.

Two calls with equal keys run the same ATen graph, so the second is served from the first's capture.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from fxcost.capture import LossFn

__all__ = ["inputs_key", "leaves_key", "model_key"]


def model_key(model: Any, module_key: Callable[[torch.nn.Module], str] | None = None) -> str:
    """A hash of what in a model decides its traced graph: the module tree with each module's class
    and plain settings, and the parameters' and buffers' names, shapes and dtypes. A callable that is
    no module counts by :func:`_code_identity`, the modules it calls by ``module_key`` (a memoized
    ``model_key``; this function if None)."""
    parts: list[Any] = []
    if isinstance(model, torch.nn.Module):
        for name, module in model.named_modules():
            parts.append(
                (name, type(module).__module__, type(module).__qualname__, _plain_attributes(module))
            )
        parts += [(name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in model.named_parameters()]
        parts += [(name, tuple(b.shape), b.dtype) for name, b in model.named_buffers()]
    else:
        parts.append(_code_identity(model, module_key or model_key))
    return _digest(parts)


def inputs_key(
    args: tuple[Any, ...], kwargs: dict[str, Any], train: bool, loss_fn: LossFn, batch: int | None,
    module_key: Callable[[torch.nn.Module], str] | None = None,
) -> str:  # fmt: skip
    """A hash of the step's inputs (shapes but the batch, dtypes, structure), ``train`` and loss (a
    module the loss calls counts by ``module_key``, as in :func:`model_key`)."""
    return leaves_key(*tree_flatten((args, kwargs)), train, loss_fn, batch, module_key)


def leaves_key(
    leaves: list[Any], spec: Any, train: bool, loss_fn: LossFn, batch: int | None,
    module_key: Callable[[torch.nn.Module], str] | None,
) -> str:  # fmt: skip
    """:func:`inputs_key` from the inputs flattened (``tree_flatten((args, kwargs))``)."""
    parts: list[Any] = [train, _code_identity(loss_fn, module_key or model_key), str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            shape = ["B" if i == 0 and s == batch else s for i, s in enumerate(leaf.shape)]
            parts.append((shape, leaf.dtype, leaf.requires_grad, leaf.device.type))
        else:
            parts.append((type(leaf).__name__, leaf if isinstance(leaf, _PLAIN) else ""))
    return _digest(parts)


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


_PLAIN = (int, float, str, bool, type(None))


def _plain_attributes(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """A module's scalar settings (``num_heads``, ``eps``, ``training``, tuples of ints)."""
    return sorted(
        (k, v)
        for k, v in vars(module).items()
        if isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v))
    )


def _code_identity(fn: Any, module_key: Callable[[torch.nn.Module], str]) -> Any:
    """Where a function's code is defined, and what it closes over or is bound to: two lambdas from
    the same line are the same loss, unless they call different modules (``lambda x: m(x)`` in a loop
    over widths) or capture other values. Modules count by ``module_key``, plain values by value,
    anything else by identity (a bound method of a fresh object each call is a new key)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return (type(fn).__module__, type(fn).__qualname__, id(fn))
    captured = [getattr(fn, "__self__", None)]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            captured.append(None)
    values = [
        module_key(v) if isinstance(v, torch.nn.Module) else v if isinstance(v, _PLAIN) else id(v)
        for v in captured
    ]
    return (code.co_filename, code.co_firstlineno, code.co_qualname, *values)
