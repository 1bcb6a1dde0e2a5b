"""Checks of the counts a user passes (batch sizes, sequence lengths, parallel degrees): one message
for each, naming the argument, what it got and what is accepted."""

from __future__ import annotations

import numbers

__all__ = ["positive_int"]


def positive_int(name: str, value: object) -> int:
    """``value`` as an int if it is a whole number >= 1.

    Raises:
        ValueError: it is not (a bool, a float, zero or negative), naming ``name`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return int(value)
