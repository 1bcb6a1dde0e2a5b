"""The GPU package's sourced tables (``memory_latency.csv``, ``processes.csv``): one value per key,
each with where it comes from, a trailing ``?`` on the value marking it unconfirmed (as in
``gpus.csv``)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from importlib import resources

__all__ = ["read_sourced"]


def read_sourced(
    filename: str, key: str, value: str, source: Callable[[dict[str, str]], str]
) -> dict[str, tuple[float, str]]:
    """``{row[key]: (row[value], source(row))}`` of the package's ``filename``; an unconfirmed
    value's source says so."""
    text = resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")
    table: dict[str, tuple[float, str]] = {}
    for row in csv.DictReader(text.splitlines()):
        cell = row[value].strip()
        note = source(row) + (" (unconfirmed)" if cell.endswith("?") else "")
        table[row[key].strip()] = (float(cell.rstrip("?")), note)
    return table
