"""Numeric precision: the precisions a step can be priced in, and the size of every dtype.

A :class:`Precision` is what a name such as ``"bf16"`` means. Every public entry that takes one
(``fxcost.cost``, ``Estimator.cost``, ``Captured.cost``, ``simulate``, a sweep point, the CLI)
passes it to :func:`parse_precision`, which checks a name and lets a :class:`Precision` through
as it is; inside, it travels as that object. Pricing a step in a precision retypes its float32
tensors to :attr:`Precision.dtype` once (``fxcost.estimator``), and cost models read the dtypes of
the records they get: nothing widens them back.

Element sizes come from one table, PyTorch's own (``torch.<dtype>.itemsize``), read by
:func:`itemsize`; importing this module does not import torch.

Example:
    >>> parse_precision("bf16").dtype
    'bfloat16'
    >>> itemsize("bfloat16"), itemsize("int64")
    (2, 8)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

__all__ = [
    "HALF_DTYPES",
    "PRECISIONS",
    "Precision",
    "PrecisionArg",
    "PrecisionName",
    "float_itemsize",
    "is_float",
    "itemsize",
    "parse_precision",
]

PrecisionName = Literal["fp32", "tf32", "fp16", "bf16"]


@dataclass(frozen=True)
class Precision:
    """A precision a step is priced in.

    Attributes:
        name: ``"fp32"``, ``"tf32"``, ``"fp16"`` or ``"bf16"``.
        dtype: the dtype its float32 tensors take (``"bfloat16"``): pure half precision, not
            autocast's mix.
        tf32: fp32 matmuls and convolutions run on TF32 tensor cores.
    """

    name: str
    dtype: str
    tf32: bool = False

    @property
    def itemsize(self) -> int:
        """Bytes per element of its floating-point tensors."""
        return itemsize(self.dtype)

    def __str__(self) -> str:
        return self.name


PrecisionArg = PrecisionName | Precision | None
"""What a user may pass as a precision: a name, a :class:`Precision`, or None (the captured dtypes)."""

PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", "float32"),
        Precision("tf32", "float32", tf32=True),
        Precision("fp16", "float16"),
        Precision("bf16", "bfloat16"),
    )
}

HALF_DTYPES = frozenset({"float16", "bfloat16"})


def parse_precision(value: PrecisionArg | str) -> Precision | None:
    """The :class:`Precision` a user named (None stays None: the captured dtypes as they are).

    Raises:
        ValueError: an unknown name; the message lists the accepted ones.
    """
    if value is None or isinstance(value, Precision):
        return value
    found = PRECISIONS.get(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError(f"unknown precision {value!r}; accepted: {', '.join(PRECISIONS)} or None")
    return found


@functools.cache
def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype by its name in the records (``"bfloat16"``: 2); 4 if unknown."""
    found = _torch_dtype(dtype)
    return found.itemsize if found is not None else 4


def is_float(dtype: str) -> bool:
    """Whether a dtype name is a floating-point dtype (``"bfloat16"``, ``"float8_e4m3fn"``)."""
    return _float_size(dtype) is not None


def float_itemsize(dtypes: Iterable[str]) -> int | None:
    """Bytes per element of the widest floating-point dtype among ``dtypes``; None if there is none."""
    sizes = [size for size in map(_float_size, dtypes) if size is not None]
    return max(sizes) if sizes else None


@functools.cache
def _float_size(dtype: str) -> int | None:
    found = _torch_dtype(dtype)
    return found.itemsize if found is not None and found.is_floating_point else None


def _torch_dtype(name: str) -> torch.dtype | None:
    import torch

    found = getattr(torch, name, None)
    return found if isinstance(found, torch.dtype) else None
