"""The GEMM, convolution and row heads, and broadcasting elementwise ops, read as curves that never
fall along the batch-like dimension.

A search loop prices the same layer at many batch sizes; an MLP read alone predicted a GEMM with more
rows faster than one with fewer for 1-16% of doublings (``benchmarks/monotonicity.py``), and a search
picks exactly those dips. So each node is read through its *axis*: the node with its batch-like
dimension (a GEMM's rows, a batched GEMM's batch, a convolution's batch, the rows of a layer norm,
a softmax or a broadcasting elementwise op) set to every half octave from 1 to 2^24, the heads'
times there, and their running maximum. A node's time is that table interpolated at its size
(log-log), so a larger problem of the same class is never predicted faster, by construction,
whichever nodes were asked for before. A weight gradient's GEMM has the batch in its inner
dimension, which this does not cover: it can still dip as the batch grows.

A table is also never above the same class's table on a GPU the device beats on every spec that
sets speed (:mod:`~fxcost.cost_models.heads.envelope`): a stronger GPU is never predicted slower.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from fxcost.cost_models.heads.envelope import Envelope
from fxcost.cost_models.heads.features import Group, fp32_bytes, node_features, roofline_ms, with_device
from fxcost.cost_models.interface import NodeBatch
from fxcost.cost_models.mlp import MLP
from fxcost.gpus import Device
from fxcost.lowering.traffic import recorded_bytes
from fxcost.records import NodeCost

__all__ = ["AxisTables", "axis_of"]

_STEPS_PER_OCTAVE = 2
_MAX_TABLES = 4096

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class _Axis:
    """A node with its batch-like dimension taken out: the class its resized copies share.

    The tensors that grow with the size (``carried_*``) have their first dimension stored as 0;
    ``fixed_*`` are the bytes of the others (a GEMM's weight, a layer norm's scale).
    """

    head: str
    op: str
    in_shapes: Shapes
    in_dtypes: tuple[str, ...]
    out_shapes: Shapes
    out_dtypes: tuple[str, ...]
    carried_in: tuple[bool, ...]
    carried_out: tuple[bool, ...]
    args: tuple[tuple[str, object], ...]
    tf32: bool
    flops_per_unit: float
    fixed_read: float
    fixed_written: float
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # hashed once: classes key the tables of every GPU
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self)[:-1])))

    def __hash__(self) -> int:
        return self._hash

    def at(self, size: int) -> NodeCost:
        """The class's node with the batch-like dimension ``size``."""
        ins, outs = (
            _sized(self.in_shapes, self.carried_in, size),
            _sized(self.out_shapes, self.carried_out, size),
        )
        read = self.fixed_read + _carried_bytes(ins, self.in_dtypes, self.carried_in)
        written = self.fixed_written + _carried_bytes(outs, self.out_dtypes, self.carried_out)
        return NodeCost(
            name="axis", op=self.op, phase="fw", in_shapes=list(ins), in_dtypes=list(self.in_dtypes),
            out_shapes=list(outs), out_dtypes=list(self.out_dtypes),
            args={k: _thawed(v) for k, v in self.args},
            flops=round(self.flops_per_unit * size), bytes_read=round(read), bytes_written=round(written),
            tf32=self.tf32,
        )  # fmt: skip


def axis_of(head: str, node: NodeCost) -> tuple[_Axis, int] | None:
    """The class of ``node`` along its batch-like dimension, and its size there (None if the node's
    shapes or traffic are not what the head reads)."""
    if node.flops is None or node.bytes_read is None or node.bytes_written is None or not node.in_shapes:
        return None
    ins, outs = tuple(map(tuple, node.in_shapes)), tuple(map(tuple, node.out_shapes))
    first = _primary(head, node)
    # An elementwise op's rows are its output's (a broadcast operand may come first).
    leading = outs[0] if head == "ew" and outs else ins[first] if first < len(ins) else ()
    if len(leading) < 2 or leading[0] < 1:
        return None
    size = int(leading[0])
    # A tensor of lower rank (a position embedding, a layer norm's weight) never grows with the batch,
    # whatever its first dimension happens to be.
    rank = len(leading)
    carried_in = tuple(
        (i == first and head != "ew")
        or (head not in ("linear", "conv") and len(s) == rank and _leads(s, size))
        for i, s in enumerate(ins)
    )
    carried_out = tuple(len(s) == rank and _leads(s, size) for s in outs)
    axis = _Axis(
        head=head, op=node.op, in_shapes=_sized(ins, carried_in, 0), in_dtypes=tuple(node.in_dtypes),
        out_shapes=_sized(outs, carried_out, 0), out_dtypes=tuple(node.out_dtypes),
        carried_in=carried_in, carried_out=carried_out,
        args=tuple(sorted((k, _frozen(v)) for k, v in node.args.items())), tf32=bool(node.tf32),
        flops_per_unit=float(f"{node.flops / size:.12g}"),
        fixed_read=max(node.bytes_read - _carried_bytes(ins, node.in_dtypes, carried_in), 0.0),
        fixed_written=max(node.bytes_written - _carried_bytes(outs, node.out_dtypes, carried_out), 0.0),
    )  # fmt: skip
    return axis, size


def _primary(head: str, node: NodeCost) -> int:
    """The input whose first dimension is the batch-like one (a GEMM's weight or a convolution's
    filter never grows with it, whatever its first dimension happens to be)."""
    if head == "linear" and node.op == "aten.addmm.default":
        return 1  # addmm(bias, a, b)
    if head == "bmm" and node.op == "aten.baddbmm.default":
        return 1  # baddbmm(input, b1, b2)
    return 0


def _leads(shape: tuple[int, ...], size: int) -> bool:
    return len(shape) >= 2 and shape[0] == size


def _sized(shapes: Shapes, carried: tuple[bool, ...], size: int) -> Shapes:
    return tuple((size, *s[1:]) if c else s for s, c in zip(shapes, carried, strict=True))


def _carried_bytes(shapes: Shapes, dtypes: Sequence[str], carried: tuple[bool, ...]) -> int:
    return recorded_bytes(
        [s for s, c in zip(shapes, carried, strict=True) if c],
        [d for d, c in zip(dtypes, carried, strict=True) if c],
    )


def _frozen(value: object) -> object:
    """A hashable copy of an argument value (lists become tuples)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _thawed(value: object) -> object:
    return [_thawed(v) for v in value] if isinstance(value, tuple) else value


@dataclass(frozen=True)
class _Grid:
    """A class's nodes at the grid's sizes (:data:`_GRID`, every class's), as one batch, and their
    problem features."""

    batch: NodeBatch
    problem: list[list[float]]


class AxisTables:
    """The axis tables of one heads model; safe to use from threads.

    Every class is read on one grid, from 1 to 2^24, so a sweep over batch sizes reads each class
    once; grids (device-independent) and tables (per device, never above those of weaker GPUs:
    :mod:`~fxcost.cost_models.heads.envelope`) are cached, least recently used dropped first.
    ``watts``: the GEMM fit's, which the heads' bound prices convolutions with
    (:func:`~fxcost.cost_models.heads.features.roofline_ms`).
    """

    def __init__(self, max_tables: int = _MAX_TABLES, watts: float | None = None) -> None:
        self.max_tables = max_tables
        self.watts = watts
        self._grids: OrderedDict[_Axis, _Grid] = OrderedDict()
        self._envelope: Envelope[tuple[MLP, str, _Axis]] = Envelope(max_tables)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._envelope)

    def ms(self, head: str, mlp: MLP, group: Group, device: Device) -> np.ndarray:
        """The times of ``group``'s nodes of ``head`` along their axes, read from ``mlp``; a node
        without an axis (or whose table has no value there) gets the network's own reading."""
        batch = group.batch
        on = batch.derived(f"heads.axes.{head}", lambda: _on_grid(_members(head, batch.nodes)))
        out = np.full(len(batch), np.nan)
        if on.axes:
            keys = [(mlp, head, axis) for axis in on.axes]
            tables = self._envelope.tables(keys, device, self._read)
            out[on.index] = np.exp(on.read(np.stack([tables[key] for key in keys])))
        alone = np.flatnonzero(~np.isfinite(out)).tolist()
        if len(alone):
            nodes = NodeBatch.of([batch.nodes[i] for i in alone])
            problem = [group.problem[i] for i in alone]
            bound = roofline_ms(nodes, device, self.watts)
            out[alone] = bound * np.exp(mlp(with_device(head, problem, device)))
        return out

    def _grid(self, axis: _Axis) -> _Grid:
        key = axis
        with self._lock:
            grid = self._grids.get(key)
            if grid is not None:
                self._grids.move_to_end(key)
                return grid
        nodes = [axis.at(int(size)) for size in _GRID]
        problem = [node_features(axis.head, n, fp32_bytes(n)) for n in nodes]
        grid = _Grid(NodeBatch.of(nodes), problem)
        with self._lock:
            self._grids[key] = grid
            while len(self._grids) > self.max_tables:
                self._grids.popitem(last=False)
        return grid

    def _read(
        self, keys: Sequence[tuple[MLP, str, _Axis]], devices: Sequence[Device]
    ) -> dict[tuple[Device, tuple[MLP, str, _Axis]], np.ndarray]:
        """The running maximum of the network's log ms over each class's grid on each device, in one
        network call (one per network, if the keys hold several)."""
        out = {}
        for mlp, head in {(k[0], k[1]) for k in keys}:
            mine = [k for k in keys if k[0] is mlp and k[1] == head]
            grids = [self._grid(k[2]) for k in mine]
            problem = [row for grid in grids for row in grid.problem]
            features = np.concatenate([with_device(head, problem, d) for d in devices])
            bound = np.concatenate(
                [roofline_ms(grid.batch, d, self.watts) for d in devices for grid in grids]
            )
            log_ms = (mlp.single(features) + np.log(bound)).reshape(len(devices), len(mine), len(_GRID))
            # A grid point the network cannot read (NaN) takes the curve below it (NaN below every
            # readable one: no prediction there).
            tables = np.fmax.accumulate(np.where(np.isfinite(log_ms), log_ms, -np.inf), axis=2)
            tables = np.where(np.isneginf(tables), np.nan, tables)
            for d, per_device in zip(devices, tables, strict=True):
                out.update({(d, key): table for key, table in zip(mine, per_device, strict=True)})
        return out


def _members(head: str, nodes: Sequence[NodeCost]) -> dict[_Axis, tuple[np.ndarray, np.ndarray]]:
    """The positions and sizes of the nodes of each class (nodes without an axis in none)."""
    found: dict[_Axis, tuple[list[int], list[int]]] = {}
    for i, node in enumerate(nodes):
        axis = axis_of(head, node)
        if axis is not None:
            index, sizes = found.setdefault(axis[0], ([], []))
            index.append(i)
            sizes.append(axis[1])
    return {
        axis: (np.array(index), np.array(sizes, dtype=np.float64)) for axis, (index, sizes) in found.items()
    }


@dataclass(frozen=True)
class _OnGrid:
    """Where a batch's nodes of one head fall on the grid every class shares, for every device alike:
    node ``index[i]`` is of class ``axes[row[i]]``, its log size ``frac[i]`` of the way from grid
    point ``low[i]`` to the next, or ``beyond[i] > 0`` log units past the grid's top."""

    axes: list[_Axis]
    index: np.ndarray
    row: np.ndarray
    low: np.ndarray
    frac: np.ndarray
    beyond: np.ndarray

    def read(self, table: np.ndarray) -> np.ndarray:
        """The nodes' log times from their classes' log-time tables (a row per class of ``axes``, a
        column per grid size), interpolated in log size as ``np.interp`` does."""
        low, high = table[self.row, self.low], table[self.row, self.low + 1]
        inside = np.where(self.frac <= 0, low, np.where(self.frac >= 1, high, low + self.frac * (high - low)))
        # Beyond the grid the work grows in proportion to the size, and so does the time.
        return np.where(self.beyond > 0, table[self.row, -1] + self.beyond, inside)


def _on_grid(members: dict[_Axis, tuple[np.ndarray, np.ndarray]]) -> _OnGrid:
    index = np.concatenate([np.zeros(0, dtype=np.int64), *(index for index, _ in members.values())])
    log_sizes = np.log(np.concatenate([np.zeros(0), *(sizes for _, sizes in members.values())]))
    low = np.clip(np.searchsorted(_LOG_GRID, log_sizes, side="right") - 1, 0, len(_LOG_GRID) - 2)
    frac = (log_sizes - _LOG_GRID[low]) / (_LOG_GRID[low + 1] - _LOG_GRID[low])
    row = np.repeat(np.arange(len(members)), [len(index) for index, _ in members.values()])
    return _OnGrid(list(members), index, row, low, frac, np.maximum(log_sizes - _LOG_GRID[-1], 0.0))


def _grid_sizes(top: int) -> np.ndarray:
    """Distinct integer sizes every half octave from 1 to ``top``."""
    steps = round(_STEPS_PER_OCTAVE * math.log2(top))
    return np.unique(np.rint(2.0 ** (np.arange(steps + 1) / _STEPS_PER_OCTAVE)).astype(np.int64))


# Every class is read on one grid, so a new batch size never needs a new one: up to 2^24 rows (a
# GEMM of 16M rows, a batch of 16M sequences), beyond which time grows with the size.
_TOP = 2**24
_GRID = _grid_sizes(_TOP)
_LOG_GRID = np.log(_GRID.astype(np.float64))
