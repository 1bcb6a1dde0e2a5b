"""The elementwise head read as a non-decreasing curve over tensor sizes (:class:`SizeTables`).

A class of elementwise nodes is every feature but the size: op, operand count, FLOPs and bytes per
element (:class:`_SizeClass`). Each class is read on a quarter-octave grid of sizes and made
monotone by isotonic regression; nodes interpolate in their class's table.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.heads.features import REFERENCE, Group, roofline_ms, with_device
from fxcost.cost_models.mlp import MLP
from fxcost.gpus import Device
from fxcost.records import NodeCost

__all__ = ["SizeTables"]

# The elementwise head is read every quarter octave of size inside a class's span.
_STEP = math.log(2.0) / 4
_MAX_TABLES = 4096


@dataclass(frozen=True)
class _SizeClass:
    """What sets an elementwise node's time besides its size: its other features (op, operand count)
    and, per element, its FLOPs, the bytes it would move in fp32 (its features) and its own bytes (its
    roofline)."""

    fixed: tuple[float, ...]
    flops: float
    fp32_bytes: float
    own_bytes: float

    @classmethod
    def of(cls, problem: Sequence[float], node: NodeCost) -> _SizeClass:
        numel = max(math.prod(node.out_shapes[0]), 1)  # as node_features counts it

        def per_element(x: float) -> float:
            return float(f"{x / numel:.9g}")  # equal classes at any size get equal keys

        return cls(tuple(problem[1:-3]), per_element(node.flops or 0), per_element(math.exp(problem[-2])),
                   per_element(node.bytes if node.bytes is not None else math.nan))  # fmt: skip

    def features(self, log_numel: np.ndarray) -> np.ndarray:
        """Problem features (``node_features``) of nodes of this class with ``e^log_numel`` elements."""
        numel = np.exp(log_numel)
        flops = np.log(np.maximum(self.flops * numel, 1.0))
        traffic = np.log(np.maximum(self.fp32_bytes * numel, 1.0))
        fixed = np.broadcast_to(self.fixed, (len(numel), len(self.fixed)))
        return np.c_[log_numel, fixed, flops, traffic, flops - traffic]

    def span(self, mlp: MLP) -> tuple[float, float]:
        """The log sizes between which some size feature lies inside the MLP's clipping range: beyond
        them every one is clipped, the MLP's ratio is constant and the time grows with the roofline."""
        if mlp.low is None or mlp.high is None:
            raise ValueError("the elementwise head has no training range to read sizes within")
        size, flops, traffic = 0, len(self.fixed) + 1, len(self.fixed) + 2
        offsets = [(size, 0.0), (traffic, math.log(self.fp32_bytes))]
        if self.flops > 0:
            offsets.append((flops, math.log(self.flops)))
        low = min(float(mlp.low[i]) - offset for i, offset in offsets)
        high = max(float(mlp.high[i]) - offset for i, offset in offsets)
        return low, high


@dataclass(frozen=True)
class _SizeTable:
    """Log sizes, and a class's log ms at them made non-decreasing."""

    sizes: np.ndarray
    log_ms: np.ndarray


class SizeTables:
    """The elementwise head's size tables of one heads model, least recently used dropped first.

    Read alone, the MLP predicts a bigger tensor faster than a smaller one for 13-17% of random
    doublings of elementwise ops and 40% of the relu passes memory-bound ops are priced as, by up
    to 19%, at sizes where its training rows are noise around a fixed cost; a search loop would
    exploit that (``benchmarks/monotonicity.py``). So each class of node is read on a grid of sizes
    across the span where the MLP sees its size, the closest non-decreasing curve to those times
    taken (isotonic regression, in log ms), and a node's time interpolated at its size (log-log).
    Below the span the MLP's ratio is constant and the time the roofline's, which only grows; above
    it too. Monotone by construction, and the MLP's own value wherever it does not dip.

    The tables are bounded: a broadcasting op (a bias over more rows) is a new class at every size,
    and a sweep over batch sizes would otherwise grow them without end. Safe to use from threads.
    """

    def __init__(self, max_tables: int = _MAX_TABLES) -> None:
        self.max_tables = max_tables
        self._tables: OrderedDict[tuple[MLP, Device, _SizeClass], _SizeTable] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tables)

    def ms(self, mlp: MLP, group: Group, device: Device) -> np.ndarray:
        """The elementwise head's times for ``group``, never less for a larger tensor of the same class."""
        raw = roofline_ms(group.batch, device) * np.exp(mlp(with_device("ew", group.problem, device)))
        members = group.batch.derived("heads.size_classes", lambda: _size_classes(group))
        found = self._lookup(mlp, device, list(members))
        sizes = np.array([problem[0] for problem in group.problem])
        out = raw.copy()
        for c, index in members.items():  # in log ms, exponentiated once: equal values stay equal
            table, size, alone = found[c], sizes[index], np.log(raw[index])
            inside = np.interp(size, table.sizes, table.log_ms)
            below = np.minimum(alone, table.log_ms[0])
            above = np.maximum(alone, table.log_ms[-1])
            out[index] = np.exp(
                np.where(size > table.sizes[-1], above, np.where(size >= table.sizes[0], inside, below))
            )
        return out * group.repeats

    def _lookup(self, mlp: MLP, device: Device, classes: list[_SizeClass]) -> dict[_SizeClass, _SizeTable]:
        """The tables of ``classes``, those not built yet built in one MLP call."""
        with self._lock:
            found = {c: self._tables[mlp, device, c] for c in classes if (mlp, device, c) in self._tables}
        missing = [c for c in classes if c not in found]
        if missing:
            found.update(zip(missing, _size_tables(mlp, missing, device), strict=True))
        with self._lock:
            for c in classes:
                self._tables[mlp, device, c] = found[c]
                self._tables.move_to_end((mlp, device, c))
            while len(self._tables) > self.max_tables:
                self._tables.popitem(last=False)
        return found


def _size_classes(group: Group) -> dict[_SizeClass, list[int]]:
    """The positions in ``group`` of each class's nodes (nodes of unknown bytes, whose roofline and
    time are unknown, in none)."""
    members: dict[_SizeClass, list[int]] = {}
    for i, (problem, node) in enumerate(zip(group.problem, group.batch.nodes, strict=True)):
        c = _SizeClass.of(problem, node)
        if math.isfinite(c.own_bytes):
            members.setdefault(c, []).append(i)
    return members


def _size_tables(mlp: MLP, classes: list[_SizeClass], device: Device) -> list[_SizeTable]:
    """The size table of each class, from one MLP call for all of them."""
    grids = []
    for c in classes:
        low, high = c.span(mlp)
        grids.append(_STEP * np.arange(math.floor(low / _STEP), math.ceil(high / _STEP) + 1))
    features = np.concatenate([c.features(sizes) for c, sizes in zip(classes, grids, strict=True)])
    ratios = np.split(
        np.exp(mlp.single(with_device("ew", features, device))), np.cumsum([len(g) for g in grids])[:-1]
    )
    tables = []
    for c, sizes, ratio in zip(classes, grids, ratios, strict=True):
        numel = np.exp(sizes)
        reference = REFERENCE.ms(c.flops * numel, c.own_bytes * numel, device.fp32_tflops or math.nan, device)
        tables.append(_SizeTable(sizes, _isotonic(np.log(reference * ratio))))
    return tables


def _isotonic(y: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to ``y`` in least squares (pooling adjacent violators):
    a dip and the values before it become their mean."""
    means: list[float] = []
    counts: list[int] = []
    for value in y.tolist():
        means.append(value)
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            mean, count = means.pop(), counts.pop()
            means[-1] = (means[-1] * counts[-1] + mean * count) / (counts[-1] + count)
            counts[-1] += count
    return np.repeat(means, counts)
