"""A step's inputs: how example inputs become a call, and which of their dimensions is the batch."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._pytree import keystr, tree_flatten_with_path, tree_leaves, tree_map

__all__ = ["as_call", "batch_of", "batch_of_leaves", "map_batched", "seqlen_of"]


def as_call(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of a step from example inputs: a tensor, a tuple or list of positional
    arguments, or a dict of keyword arguments.

    Raises:
        TypeError: ``example_inputs`` is none of those.
        ValueError: a tensor among them has no elements (a dimension of size 0): a step on it does
            no work to price.
    """
    if isinstance(example_inputs, torch.Tensor):
        call: tuple[tuple[Any, ...], dict[str, Any]] = (example_inputs,), {}
    elif isinstance(example_inputs, dict):
        call = (), dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        call = tuple(example_inputs), {}
    else:
        raise TypeError(
            "example_inputs must be a tensor, a tuple/list of positional arguments or a dict of keyword "
            f"arguments, got {type(example_inputs).__name__}"
        )
    _check_not_empty(example_inputs)
    return call


def _check_not_empty(example_inputs: Any) -> None:
    """Refuse a tensor with a dimension of size 0, naming where it is among ``example_inputs``."""
    for path, leaf in tree_flatten_with_path(example_inputs)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.numel() == 0:
            raise ValueError(
                f"example_inputs{keystr(path)} has shape {tuple(leaf.shape)}, no elements; fxcost "
                "prices a step on inputs whose every dimension is >= 1 (a batch of at least one)"
            )


def batch_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The leading dimension of the step's first tensor input: its batch size, by convention."""
    return batch_of_leaves(tree_leaves((args, kwargs)))


def batch_of_leaves(leaves: Iterable[Any]) -> int | None:
    """:func:`batch_of` from the inputs' flattened leaves."""
    first = next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim()), None)
    return int(first.shape[0]) if first is not None else None


def seqlen_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The sequence length of a step whose first integer input is a (batch, sequence) matrix of token
    ids, as language models take; None for any other step (images, float sequences)."""
    leaves = tree_leaves((args, kwargs))
    first = next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim()), None)
    if first is None or first.dim() != 2 or first.dtype.is_floating_point or first.dtype == torch.bool:
        return None
    return int(first.shape[1])


def map_batched(
    args: tuple[Any, ...], kwargs: dict[str, Any], batch: int, fn: Callable[[torch.Tensor], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs with ``fn`` applied to every tensor whose leading dimension is ``batch``."""

    def apply(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != batch:
            return t
        return fn(t)

    return tree_map(apply, args), tree_map(apply, kwargs)
