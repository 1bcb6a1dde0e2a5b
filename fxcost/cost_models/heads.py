"""MLP cost heads: origin-free predictions for GEMMs, convolutions and kernel-alike ops.

One small MLP per op class (``linear``, ``bmm``, ``conv``, ``ew``, ``ln``, ``softmax``), in the spirit of
Habitat §3.4 but built to generalize to GPUs never seen in training:

- the target is physical: ``log(T / T_roofline)``, how far the op runs from the roofline bound of the
  target GPU, rather than raw time, so the model learns an efficiency that transfers across GPUs;
- the features say what determines that efficiency: log problem dims, FLOPs, bytes, arithmetic
  intensity against the GPU's ridge point, GEMM tile waves per SM, and the GPU's spec-sheet facts
  (peak FP32, bandwidth, SMs, L2, clock, memory). Only spec-sheet facts, so an unseen GPU needs
  nothing measured.

Inference is numpy, vectorized over all nodes of a class at once. Weights ship in
``fxcost/cost_models/weights`` (trained by ``fxcost train`` on the shared training data only).
"""

from __future__ import annotations

import functools
import json
import math
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from fxcost.cost_models import NodeBatch, register
from fxcost.cost_models.roofline import Roofline
from fxcost.cost_models.wave_scaling import dram_traffic_factor, kernels_of
from fxcost.devices import Device
from fxcost.lowering import MEMORY_BOUND, itemsize, lower, recorded_bytes
from fxcost.lowering.rnn import RNN_OPS, lower_rnn
from fxcost.records import NodeCost, Shape

__all__ = [
    "FEATURE_VERSION",
    "HEADS",
    "LOWERED",
    "MLP",
    "Heads",
    "HeadsRatio",
    "device_features",
    "head_of",
    "memory_pass",
    "node_features",
    "roofline_ms",
]

HEADS = ("linear", "bmm", "conv", "ew", "ln", "softmax")

# Bumped whenever the features change, so trained heads and checkpoints of another version are redone.
FEATURE_VERSION = 3

# Elementwise ops the training data measures, as one-hot features; other pointwise ops count as "other".
EW_OPS = ("add", "mul", "div", "pow", "relu", "gelu", "tanh")

_HEAD_OF_OP = {"aten.mm.default": "linear", "aten.addmm.default": "linear", "aten.bmm.default": "bmm",
         "aten.baddbmm.default": "bmm", "aten.convolution.default": "conv",
         "aten.convolution_backward.default": "conv", "aten.native_layer_norm.default": "ln",
         "aten.native_layer_norm_backward.default": "ln", "aten._softmax.default": "softmax",
         "aten._log_softmax.default": "softmax", "aten._softmax_backward_data.default": "softmax",
         "aten._log_softmax_backward_data.default": "softmax",
         # Copies and dtype casts: one elementwise pass (PyTorch does not tag them pointwise).
         "aten._to_copy.default": "ew", "aten.copy.default": "ew", "aten.copy_.default": "ew",
         "aten.lift_fresh_copy.default": "ew",
         # Elementwise kernels of PyTorch's TensorIterator family, one pass over the output: dropout's
         # fused mask-and-scale and the fills.
         "aten.native_dropout.default": "ew", "aten.arange.default": "ew", "aten.arange.start": "ew",
         "aten.ones.default": "ew", "aten.zeros.default": "ew", "aten.full.default": "ew",
         "aten.fill.Scalar": "ew", "aten.fill.Tensor": "ew", "aten.new_zeros.default": "ew",
         "aten.new_ones.default": "ew", "aten.new_full.default": "ew", "aten.zeros_like.default": "ew",
         "aten.ones_like.default": "ew", "aten.full_like.default": "ew",
         "aten.scalar_tensor.default": "ew"}  # fmt: skip

# The reference roofline whose ratio to the measured time is the learned target; its 10 us floor keeps
# the ratio of tiny ops finite.
_REFERENCE = Roofline(launch_floor_ms=0.01)


LOWERED = "lowered"
"""What :func:`head_of` says of a node the heads price as the work it lowers to: a cuDNN RNN as its
GEMMs and gate math, a memory-bound op (``lowering.MEMORY_BOUND``) as elementwise passes moving the
bytes its kernels move."""


def head_of(node: NodeCost) -> str | None:
    """The head that predicts ``node``, :data:`LOWERED` for work the heads predict, None if none does."""
    if not node.has_kernel:
        return None
    head = _HEAD_OF_OP.get(node.op)
    if head is not None:
        return head
    if node.op in RNN_OPS or node.op in MEMORY_BOUND:
        return LOWERED
    return "ew" if node.out_shapes and _pointwise(node.op) else None


@functools.cache
def _pointwise(op_name: str) -> bool:
    """Whether PyTorch tags the ATen op pointwise (looked up once per op: ``head_of`` runs for every
    node each time a step is priced at a new batch)."""
    import torch

    from fxcost.lowering import resolve_op

    op = resolve_op(op_name)
    return op is not None and torch.Tag.pointwise in op.tags


def device_features(device: Device) -> list[float]:
    """Spec-sheet facts of a GPU, log-scaled: peak FP32, bandwidth, SMs, L2, clock, memory."""
    values = [device.fp32_tflops, device.mem_bandwidth_gbps, device.num_sms, device.l2_cache_mb,
              device.boost_clock_mhz, device.memory_gb]  # fmt: skip
    if any(v is None for v in values):
        raise ValueError(f"{device.name} lacks a spec value the heads need")
    return [math.log(float(v)) for v in values]  # type: ignore[arg-type]


def _gemm_dims(node: NodeCost) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a GEMM-like node."""
    shapes = node.in_shapes
    if node.op in ("aten.addmm.default", "aten.baddbmm.default"):
        shapes = shapes[1:]
    a, b = shapes[0], shapes[1]
    if len(a) == 3:
        return a[0], a[1], b[2], a[2]
    return 1, a[0], b[1], a[1]


def _conv_dims(node: NodeCost) -> tuple[int, int, int, int, int, int]:
    """(batch, C_in, C_out, kernel, input size, stride) of a 2-D convolution (or its backward)."""
    if node.op == "aten.convolution_backward.default":
        x, w = node.in_shapes[1], node.in_shapes[2]
    else:
        x, w = node.in_shapes[0], node.in_shapes[1]
    stride = node.args.get("stride") or [1]
    return x[0], x[1], w[0], w[-1], x[-1], int(stride[0])


def node_features(head: str, node: NodeCost) -> list[float]:
    """The problem features of ``node`` for ``head`` (device features are appended separately)."""
    flops = max(float(node.flops or 0), 1.0)
    traffic = max(float(node.bytes or 0), 1.0)
    common = [math.log(flops), math.log(traffic), math.log(flops / traffic)]
    if head in ("linear", "bmm"):
        b, m, n, k = _gemm_dims(node)
        dims = [math.log(b), math.log(m), math.log(n), math.log(k)]
        # Tile quantization: the share of the output tiles' work that is real, for the tile shapes of
        # the cuBLAS fp32 kernels in the data (128x128 down to 32x128); and the 128x128 tile count the
        # device features turn into waves.
        use = [math.log(m * n / (_round_up(m, tm) * _round_up(n, tn))) for tm, tn in _TILES]
        tiles = b * math.ceil(m / 128) * math.ceil(n / 128)
        return [*dims, *use, math.log(tiles), *common]
    if head == "conv":
        b, cin, cout, kernel, size, stride = _conv_dims(node)
        dims = [math.log(b), math.log(cin), math.log(cout), float(kernel), math.log(size), float(stride)]
        return [*dims, *common]
    if head == "ew":
        numel = max(math.prod(node.out_shapes[0]), 1)
        name = node.op.split(".")[1]
        onehot = [float(name == op) for op in EW_OPS] + [float(name not in EW_OPS)]
        return [math.log(numel), float(len(node.in_shapes)), *onehot, *common]
    if head in ("ln", "softmax"):
        x = node.in_shapes[0]
        row = x[-1] if x else 1
        rows = max(math.prod(x) // max(row, 1), 1)
        return [math.log(rows), math.log(row), *common]
    raise ValueError(f"unknown head {head!r}; heads: {', '.join(HEADS)}")


_TILES = ((128, 128), (128, 64), (64, 64), (32, 128))

# Position of the log 128x128 tile count in the GEMM features: after the 4 dims and the tile uses.
_GEMM_TILES = 4 + len(_TILES)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _conv_gradients(node: NodeCost) -> int:
    """How many convolutions a ``convolution_backward`` runs: grad of the input and/or the weight."""
    mask = node.args.get("output_mask") or [True, True, False]
    return max(int(bool(mask[0])) + int(bool(mask[1])), 1)


def roofline_ms(batch: NodeBatch, device: Device) -> np.ndarray:
    """The reference time the heads' targets are relative to: the roofline of the DRAM traffic the
    nodes move on ``device``. Row kernels (layer norm, softmax) read rows again in later passes; the
    re-reads that miss ``device``'s L2 count as traffic, so an op whose rows outgrow the L2 of one GPU
    (an effect beyond the training rows' row lengths) keeps the efficiency it has on another.
    """
    kernels = batch.derived("heads.row_kernels", lambda: [_row_kernels(n) for n in batch.nodes])
    traffic = np.array([dram_traffic_factor(k, device) if k else 1.0 for k in kernels])
    return _REFERENCE.predict(batch, device, traffic)


def _row_kernels(node: NodeCost) -> list[Any]:
    return kernels_of(node) if head_of(node) in ("ln", "softmax") else []


def feature_matrix(head: str, nodes: Sequence[NodeCost], device: Device) -> np.ndarray:
    """Rows of problem features + device features + intensity over the device's ridge point."""
    return with_device(head, [node_features(head, n) for n in nodes], device)


def with_device(head: str, problem: Sequence[Sequence[float]] | np.ndarray, device: Device) -> np.ndarray:
    """Problem feature rows (see :func:`node_features`) completed with ``device``'s features, the
    problem's arithmetic intensity over the device's ridge point and, for GEMMs, its waves of tiles."""
    dev = device_features(device)
    ridge = math.log(float(device.fp32_tflops) * 1e12 / (float(device.mem_bandwidth_gbps) * 1e9))  # type: ignore[arg-type]
    rows = np.asarray(problem, dtype=np.float64).reshape(len(problem), -1)
    x = np.c_[rows, np.broadcast_to(dev, (len(rows), len(dev))), rows[:, -1] - ridge]
    if head in ("linear", "bmm"):
        # One 128x128 tile per SM at a time: the waves of the grid, and the share of the last wave filled.
        tiles = np.rint(np.exp(x[:, _GEMM_TILES]))
        waves = np.ceil(tiles / float(device.num_sms))  # type: ignore[arg-type]
        x = np.c_[x, np.log(waves), np.log(tiles / (waves * float(device.num_sms)))]  # type: ignore[arg-type]
    return x


@dataclass(frozen=True, eq=False)
class MLP:
    """A trained head: feature range, standardization, weights and biases of a ReLU MLP, one output.

    Inputs are clipped to the range seen in training: a ReLU network extrapolates linearly, and an
    op's efficiency saturates beyond the largest problems measured rather than growing without bound.
    Compared and hashed by identity (its arrays are not hashable).
    """

    low: np.ndarray
    high: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self._forward(x, list(zip(self.weights, self.biases, strict=True)))

    def single(self, x: np.ndarray) -> np.ndarray:
        """The head in float32: three times faster on many rows, within 1e-6 of :meth:`__call__`."""
        return self._forward(x, self._float32).astype(np.float64)

    @functools.cached_property
    def _float32(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [
            (w.astype(np.float32), b.astype(np.float32))
            for w, b in zip(self.weights, self.biases, strict=True)
        ]

    def _forward(self, x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        h = ((np.clip(x, self.low, self.high) - self.mean) / self.std).astype(layers[0][0].dtype, copy=False)
        for i, (w, b) in enumerate(layers):
            h = h @ w + b
            if i < len(layers) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        arrays = {f"{prefix}/low": self.low, f"{prefix}/high": self.high, f"{prefix}/mean": self.mean,
                  f"{prefix}/std": self.std}  # fmt: skip
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            arrays[f"{prefix}/w{i}"], arrays[f"{prefix}/b{i}"] = w, b
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Any, prefix: str) -> MLP:
        layers = sum(1 for k in arrays if k.startswith(f"{prefix}/w"))
        return cls(
            low=np.asarray(arrays[f"{prefix}/low"], dtype=np.float64),
            high=np.asarray(arrays[f"{prefix}/high"], dtype=np.float64),
            mean=np.asarray(arrays[f"{prefix}/mean"], dtype=np.float64),
            std=np.asarray(arrays[f"{prefix}/std"], dtype=np.float64),
            weights=tuple(np.asarray(arrays[f"{prefix}/w{i}"], dtype=np.float64) for i in range(layers)),
            biases=tuple(np.asarray(arrays[f"{prefix}/b{i}"], dtype=np.float64) for i in range(layers)),
        )


def load_heads(directory: str | Path | None = None) -> dict[str, MLP]:
    """Heads from ``directory`` (``heads.npz``), or the ones shipped with fxcost."""
    if directory is None:
        return dict(_shipped())
    path = Path(directory) / "heads.npz"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no trained heads (run `fxcost train --out {directory}`)")
    with np.load(path) as arrays:
        return _read(arrays, str(path))


@functools.cache
def _shipped() -> tuple[tuple[str, MLP], ...]:
    weights = resources.files("fxcost.cost_models").joinpath("weights", "heads.npz")
    if not weights.is_file():
        return ()
    with weights.open("rb") as f, np.load(f) as arrays:
        return tuple(_read(arrays, "the shipped heads").items())


def _read(arrays: Any, source: str) -> dict[str, MLP]:
    version = int(arrays["feature_version"]) if "feature_version" in arrays.files else None
    if version != FEATURE_VERSION:
        raise ValueError(
            f"{source} were trained on feature version {version}; this fxcost computes version "
            f"{FEATURE_VERSION}: retrain them with `fxcost train`"
        )
    names = sorted({k.split("/")[0] for k in arrays.files if "/" in k})
    return {name: MLP.from_arrays(arrays, name) for name in names}


@functools.cache
def _shipped_heads() -> dict[str, MLP]:
    """The shipped heads as one shared mapping: every default ``Heads`` holds the same object, so their
    predictions on a batch are computed once (read-only; ``load_heads()`` hands out copies)."""
    return dict(_shipped())


def shipped_manifest() -> dict[str, Any]:
    """The training manifest of the shipped heads (data files and hashes, devices, metrics)."""
    path = resources.files("fxcost.cost_models").joinpath("weights", "manifest.json")
    return json.loads(path.read_text()) if path.is_file() else {}


class Heads:
    """Origin-free cost model: each node predicted by the head of its op class."""

    name = "mlp"

    def __init__(self, heads: dict[str, MLP] | None = None) -> None:
        self.heads = _shipped_heads() if heads is None else heads

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        # The same heads on the same batch and device give the same answer: computed once, whether
        # ``mlp`` or ``mlp_ratio`` (which shares the shipped instance) asks.
        return batch.derived(f"heads.ms.{id(self.heads)}.{device.name}", lambda: self._predict(batch, device))

    def _predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        out = np.where(batch.has_kernel, np.nan, 0.0)
        try:
            device_features(device)
        except ValueError:  # a device without the spec values the heads need
            return out
        groups, lowered = batch.derived("heads", lambda: _groups(batch))
        for head, group in groups.items():
            if head not in self.heads:
                continue
            if head == "ew":
                out[group.index] = _elementwise_ms(self.heads[head], group, device)
            else:
                reference = roofline_ms(group.batch, device)
                ratio = np.exp(self.heads[head](with_device(head, group.problem, device)))
                out[group.index] = reference * ratio * group.repeats
        if lowered is not None:  # a node's time is its work's; NaN if a head its work needs is missing
            total = np.zeros(len(batch))
            if len(lowered.work):
                np.add.at(total, lowered.owner, self.predict(lowered.work, device) * lowered.counts)
            out[lowered.nodes] = total[lowered.nodes]
        return out


def _groups(batch: NodeBatch) -> tuple[dict[str, _Group], _Lowered | None]:
    """Nodes by head with their device-independent features, and the work of the lowered nodes (for
    every head, so the result does not depend on which heads a model holds)."""
    members: dict[str, list[tuple[int, NodeCost, float, list[float]]]] = {}
    work: list[tuple[int, NodeCost, int]] = []
    lowered_nodes: list[int] = []
    for i, node in enumerate(batch.nodes):
        head = head_of(node) if node.has_kernel else None
        if head == LOWERED:
            runs = _work(node)
            if runs is not None:  # an empty list: it launches nothing, and costs nothing
                lowered_nodes.append(i)
                work.extend((i, sub, count) for sub, count in runs)
        elif head is not None:
            try:
                # The heads learned forward convolutions: a backward runs one per gradient.
                repeats = _conv_gradients(node) if _is_backward(node) else 1
                node = _forward_conv(node) if _is_backward(node) else node
                members.setdefault(head, []).append((i, node, repeats, node_features(head, _as_fp32(node))))
            except (IndexError, KeyError, TypeError, ValueError):
                pass  # shapes the head does not expect: left unpredicted, not a crash
    groups = {
        head: _Group(
            index=[i for i, *_ in rows],
            batch=NodeBatch.of([n for _, n, *_ in rows]),
            repeats=np.array([r for *_, r, _ in rows], dtype=float),
            problem=[p for *_, p in rows],
        )
        for head, rows in members.items()
    }
    lowered = None
    if lowered_nodes:
        lowered = _Lowered(
            nodes=np.array(lowered_nodes),
            owner=np.array([i for i, *_ in work], dtype=int),
            work=NodeBatch.of([sub for _, sub, _ in work]),
            counts=np.array([count for *_, count in work], dtype=float),
        )
    return groups, lowered


@dataclass(frozen=True)
class _Group:
    """The nodes of one head in a batch: positions, the nodes (as forward ops), repeats, features."""

    index: list[int]
    batch: NodeBatch
    repeats: np.ndarray
    problem: list[list[float]]


@dataclass(frozen=True)
class _SizeClass:
    """What sets an elementwise node's time besides its size: its other features (op, operand count)
    and, per element, its FLOPs, the bytes of its fp32 twin (its features) and its own bytes (its
    roofline)."""

    fixed: tuple[float, ...]
    flops: float
    twin_bytes: float
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
        traffic = np.log(np.maximum(self.twin_bytes * numel, 1.0))
        fixed = np.broadcast_to(self.fixed, (len(numel), len(self.fixed)))
        return np.c_[log_numel, fixed, flops, traffic, flops - traffic]

    def span(self, mlp: MLP) -> tuple[float, float]:
        """The log sizes between which some size feature lies inside the MLP's clipping range: beyond
        them every one is clipped, the MLP's ratio is constant and the time grows with the roofline."""
        size, flops, traffic = 0, len(self.fixed) + 1, len(self.fixed) + 2
        offsets = [(size, 0.0), (traffic, math.log(self.twin_bytes))]
        if self.flops > 0:
            offsets.append((flops, math.log(self.flops)))
        low = min(float(mlp.low[i]) - offset for i, offset in offsets)
        high = max(float(mlp.high[i]) - offset for i, offset in offsets)
        return low, high


# The elementwise head is read every quarter octave of size inside a class's span.
_STEP = math.log(2.0) / 4
# Size tables per head, LRU-bounded: a broadcasting op (a bias over more rows) is a new class at
# every size, and a sweep over batch sizes would otherwise grow them without end.
_TABLES: weakref.WeakKeyDictionary[MLP, OrderedDict[tuple[Device, _SizeClass], _SizeTable]] = (
    weakref.WeakKeyDictionary()
)
_MAX_TABLES = 4096


@dataclass(frozen=True)
class _SizeTable:
    """Log sizes, and a class's log ms at them made non-decreasing."""

    sizes: np.ndarray
    log_ms: np.ndarray


def _elementwise_ms(mlp: MLP, group: _Group, device: Device) -> np.ndarray:
    """The elementwise head's times for ``group``, never less for a larger tensor of the same class.

    Read alone, the MLP predicts a bigger tensor faster than a smaller one for 13-17% of random
    doublings of elementwise ops and 40% of the relu passes memory-bound ops are priced as, by up
    to 19%, at sizes where its training rows are noise around a fixed cost; a search loop would
    exploit that (``benchmarks/monotonicity.py``). So each class of node is read on a grid of sizes
    across the span where the MLP sees its size, the closest non-decreasing curve to those times
    taken (isotonic regression, in log ms), and a node's time interpolated at its size (log-log).
    Below the span the MLP's ratio is constant and the time the roofline's, which only grows; above
    it too. Monotone by construction, and the MLP's own value wherever it does not dip.
    """
    raw = roofline_ms(group.batch, device) * np.exp(mlp(with_device("ew", group.problem, device)))
    members = group.batch.derived("heads.size_classes", lambda: _size_classes(group))
    tables = _TABLES.setdefault(mlp, OrderedDict())
    missing = [c for c in members if (device, c) not in tables]
    if missing:
        tables.update(zip([(device, c) for c in missing], _size_tables(mlp, missing, device), strict=True))
    found = {c: tables[device, c] for c in members}
    for c in members:
        tables.move_to_end((device, c))
    while len(tables) > _MAX_TABLES:
        tables.popitem(last=False)
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


def _size_classes(group: _Group) -> dict[_SizeClass, list[int]]:
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
        reference = _REFERENCE.ms(
            c.flops * numel, c.own_bytes * numel, device.fp32_tflops or math.nan, device
        )
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


@dataclass(frozen=True)
class _Lowered:
    """The lowered nodes of a batch (positions), their work as one batch, and the work item's owner
    and repetitions: the owner's time is the sum of its work's times their counts."""

    nodes: np.ndarray
    owner: np.ndarray
    work: NodeBatch
    counts: np.ndarray


_HALF = ("float16", "bfloat16")


def _as_fp32(node: NodeCost) -> NodeCost:
    """The fp32 twin of a half-precision node, whose features the heads (trained on fp32) know.

    The heads predict how far an op runs from its roofline bound; a half-precision node takes that
    efficiency from its fp32 twin and its bound from itself (``Heads._predict`` scales the node's own
    roofline). Fed half-precision bytes directly, they would see an op twice as compute-dense as any
    they learned, and predict bf16 work slower than fp32.
    """
    if not any(d in _HALF for d in (*node.in_dtypes, *node.out_dtypes)):
        return node

    def widened(dtypes: list[str]) -> list[str]:
        return ["float32" if d in _HALF else d for d in dtypes]

    def growth(shapes: list[Shape], dtypes: list[str]) -> float:
        """How much the tensors' bytes grow when their half-precision ones widen (bool masks and
        integer indices do not)."""
        now, wide = recorded_bytes(shapes, dtypes), recorded_bytes(shapes, widened(dtypes))
        return wide / now if now else 2.0

    read = growth(node.in_shapes, node.in_dtypes)
    # In-place ops write their inputs (no outputs recorded): those grow as the inputs do.
    written = growth(node.out_shapes, node.out_dtypes) if node.out_shapes else read
    return node.replace(
        in_dtypes=widened(node.in_dtypes),
        out_dtypes=widened(node.out_dtypes),
        bytes_read=None if node.bytes_read is None else round(read * node.bytes_read),
        bytes_written=None if node.bytes_written is None else round(written * node.bytes_written),
    )


def _work(node: NodeCost) -> list[tuple[NodeCost, int]] | None:
    """What a lowered node runs, as (node a head predicts, repetitions): empty if it launches nothing,
    None where it cannot tell."""
    if node.op in RNN_OPS:
        try:
            return lower_rnn(node) or None
        except (IndexError, KeyError, TypeError, ValueError):  # an RNN node without the arguments we read
            return None
    dtype = next((d for d in (*node.out_dtypes, *node.in_dtypes) if d in _FLOATS), "float32")
    kernels = lower(node)
    if kernels is None or not all(math.isfinite(k.bytes) for k in kernels):
        return None
    return [(memory_pass(k.bytes, dtype), 1) for k in kernels]


_FLOATS = ("float32", "float16", "bfloat16", "float64")


def memory_pass(nbytes: float, dtype: str) -> NodeCost:
    """A memory pass moving ``nbytes``, as the elementwise head knows it: a ``relu`` over ``dtype``
    elements, half of the bytes read and half written."""
    numel = max(round(nbytes / (2 * itemsize(dtype))), 1)
    return NodeCost(
        name="relu",
        op="aten.relu.default",
        phase="fw",
        in_shapes=[(numel,)],
        in_dtypes=[dtype],
        out_shapes=[(numel,)],
        out_dtypes=[dtype],
        flops=numel,
        bytes_read=numel * itemsize(dtype),
        bytes_written=numel * itemsize(dtype),
    )


def _is_backward(node: NodeCost) -> bool:
    return node.op == "aten.convolution_backward.default"


def _forward_conv(node: NodeCost) -> NodeCost:
    """The forward convolution whose gradients a ``convolution_backward`` node computes."""
    from fxcost.datasets import conv_node

    b, cin, cout, kernel, size, stride = _conv_dims(node)
    return conv_node(b, cin, cout, kernel, size, stride, int((node.args.get("padding") or [0])[0]))


class HeadsRatio:
    """Runtime-based prediction for kernel-varying ops: the origin measurement scaled by the ratio of
    the heads' predictions on the target and on the origin GPU.

    The measurement carries what the heads miss about this exact shape on real hardware (a
    well-aligned GEMM's better kernel, a harness's overhead); the heads carry how the op's time
    changes from one GPU to another. Where the origin's profiler timed the node's kernels, the ratio
    scales that kernel time and the target's per-op overhead is added: the event-timed ``origin_ms``
    carries the origin machine's launch overhead, which is no part of the GPU's speed. On the origin
    itself it returns the measurement.
    """

    name = "mlp_ratio"

    def __init__(self, heads: Heads | None = None) -> None:
        self.heads = heads or Heads()

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        origin = batch.origin
        if origin is None:
            return np.full(len(batch), np.nan)
        on_origin = batch.derived("mlp_ratio.origin", lambda: self.heads.predict(batch, origin))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = self.heads.predict(batch, device) / on_origin
        if device != origin:
            timed = np.isfinite(batch.kernel_ms)
            scaled = np.where(timed, device.overhead_ms + batch.kernel_ms * ratio, batch.origin_ms * ratio)
        else:
            scaled = batch.origin_ms
        out = np.where(on_origin > 0, scaled, np.nan)
        return np.where(batch.has_kernel, out, 0.0)


@register("mlp")
def _mlp() -> Heads:
    return Heads()


@register("mlp_ratio")
def _mlp_ratio() -> HeadsRatio:
    return HeadsRatio()
