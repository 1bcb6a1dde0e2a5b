"""The elementwise head read as a non-decreasing curve over tensor sizes (:class:`SizeTables`).

A class of elementwise nodes is every feature but the size: op, operand count, FLOPs and bytes per
element (:class:`_SizeClass`). Each class is read on a half-octave grid of sizes and made
monotone by isotonic regression; nodes interpolate in their class's table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.heads.envelope import Envelope
from fxcost.cost_models.heads.features import REFERENCE, Group, with_device
from fxcost.cost_models.mlp import MLP
from fxcost.gpus import Device
from fxcost.records import NodeCost

__all__ = ["SizeTables"]

# The elementwise head is read every half octave of size inside a class's span.
_STEP = math.log(2.0) / 2
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


class SizeTables:
    """The elementwise head's size tables of one heads model, least recently used dropped first.

    Read alone, the MLP predicts a bigger tensor faster than a smaller one for 13-17% of random
    doublings of elementwise ops and 40% of the relu passes memory-bound ops are priced as, by up
    to 19%, at sizes where its training rows are noise around a fixed cost; a search loop would
    exploit that (``benchmarks/monotonicity.py``). So each class of node is read on a grid of sizes
    across the span where the MLP sees its size, the closest non-decreasing curve to those times
    taken (isotonic regression, in log ms), and a node's time interpolated at its size (log-log).
    Below the span the MLP's ratio is constant and the time the roofline's, which only grows; above
    it too. Monotone by construction, and the MLP's own value wherever it does not dip. A table is
    never above the same class's table on a GPU the device beats on every strength spec
    (:mod:`~fxcost.cost_models.heads.envelope`).

    The tables are bounded: a broadcasting op (a bias over more rows) is a new class at every size,
    and a sweep over batch sizes would otherwise grow them without end. Safe to use from threads.
    """

    def __init__(self, max_tables: int = _MAX_TABLES) -> None:
        self.max_tables = max_tables
        self._envelope: Envelope[tuple[MLP, _SizeClass]] = Envelope(max_tables)

    def __len__(self) -> int:
        return len(self._envelope)

    def ms(self, mlp: MLP, group: Group, device: Device) -> np.ndarray:
        """The elementwise head's times for ``group``, never less for a larger tensor of the same class."""
        members = group.batch.derived("heads.size_classes", lambda: _size_classes(group))
        found = self._envelope.tables([(mlp, c) for c in members], device, _size_tables)
        sizes = np.array([problem[0] for problem in group.problem])
        out = np.full(len(sizes), np.nan)  # nodes of unknown bytes are in no class: no time
        for c, index in members.items():  # in log ms, exponentiated once: equal values stay equal
            grid, log_ms = _grid(mlp, c), found[mlp, c]
            size = sizes[index]
            # Outside the span the network's ratio is constant: below it the table's first value
            # holds, above it the time grows with the size (the roofline's bytes), from the table's
            # last. Both come from the table, so the GPU order holds there too.
            inside = np.interp(size, grid, log_ms)
            above = log_ms[-1] + (size - grid[-1])
            out[index] = np.exp(np.where(size > grid[-1], above, inside))
        return out * group.repeats


def _size_classes(group: Group) -> dict[_SizeClass, list[int]]:
    """The positions in ``group`` of each class's nodes (nodes of unknown bytes, whose roofline and
    time are unknown, in none)."""
    members: dict[_SizeClass, list[int]] = {}
    for i, (problem, node) in enumerate(zip(group.problem, group.batch.nodes, strict=True)):
        c = _SizeClass.of(problem, node)
        if math.isfinite(c.own_bytes):
            members.setdefault(c, []).append(i)
    return members


def _grid(mlp: MLP, c: _SizeClass) -> np.ndarray:
    """The log sizes a class's table is read at: every half octave across its span."""
    low, high = c.span(mlp)
    return _STEP * np.arange(math.floor(low / _STEP), math.ceil(high / _STEP) + 1)


def _size_tables(
    keys: Sequence[tuple[MLP, _SizeClass]], devices: Sequence[Device]
) -> dict[tuple[Device, tuple[MLP, _SizeClass]], np.ndarray]:
    """The log-ms size table of each class on each device (isotonic), from one network call per network."""
    out = {}
    for mlp in {m for m, _ in keys}:
        mine = [k for k in keys if k[0] is mlp]
        grids = [_grid(mlp, c) for _, c in mine]
        features = np.concatenate([c.features(sizes) for (_, c), sizes in zip(mine, grids, strict=True)])
        ratio = np.exp(mlp.single(np.concatenate([with_device("ew", features, d) for d in devices])))
        start = 0
        for d in devices:
            for key, sizes in zip(mine, grids, strict=True):
                c, numel = key[1], np.exp(sizes)
                reference = REFERENCE.ms(c.flops * numel, c.own_bytes * numel, d.fp32_tflops or math.nan, d)
                out[d, key] = _isotonic(np.log(reference * ratio[start : start + len(sizes)]))
                start += len(sizes)
    return out


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
