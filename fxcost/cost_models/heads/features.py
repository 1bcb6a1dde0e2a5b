"""What the MLP heads see: which head predicts a node, its features, and the reference roofline.

One small MLP per op class (``linear``, ``bmm``, ``conv``, ``ew``, ``ln``, ``softmax``). The target is
``log(T / T_bound)``, how far the op runs from a physical lower bound on the target GPU
(:func:`roofline_ms`), and the heads' softplus output keeps it at or above zero: a bounded efficiency
``T_bound / T`` in (0, 1], so no prediction is faster than the GPU's peak compute and the DRAM
bandwidth it achieves allow. The features say what sets that efficiency: log problem dims, FLOPs,
bytes, arithmetic intensity against the GPU's ridge point, GEMM tile waves per SM, and the GPU's
spec-sheet facts (:func:`device_features`). The convolution head reads no spec-sheet fact but the
ridge point, and the row heads (layer norm, softmax) the ridge point and the problem's size against
the GPU: the time its bytes take at the achieved bandwidth and its rows per SM (:func:`with_device`).

The heads were trained on fp32 measurements. A half-precision node takes its efficiency from its fp32
twin: its features see the bytes the node would move in fp32 (:func:`fp32_bytes`), its roofline its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fxcost.cost_models.heads.sustained import clock_share
from fxcost.cost_models.interface import NodeBatch
from fxcost.cost_models.mlp import Output
from fxcost.cost_models.roofline import Roofline
from fxcost.cost_models.wave_scaling import dram_traffic_factor, kernels_of
from fxcost.gpus import Device
from fxcost.lowering import MEMORY_BOUND, is_pointwise, recorded_bytes
from fxcost.lowering.composite import COMPOSITE_OPS
from fxcost.lowering.nodes import conv_dims, gemm_dims
from fxcost.lowering.row_ops import lowers
from fxcost.precision import HALF_DTYPES
from fxcost.records import NodeCost

__all__ = [
    "CLOCKED_HEADS",
    "EW_OPS",
    "FEATURE_VERSION",
    "HEADS",
    "HEAD_OUTPUT",
    "LOWERED",
    "REFERENCE",
    "RELATIVE_HEADS",
    "Group",
    "device_features",
    "feature_matrix",
    "fp32_bytes",
    "fp32_traffic",
    "head_of",
    "node_features",
    "roofline_ms",
    "with_device",
]

HEADS = ("linear", "bmm", "conv", "ew", "ln", "softmax")

# The heads' output: softplus keeps log(T / T_bound) at or above zero (an efficiency of at most 1).
HEAD_OUTPUT: Output = "softplus"

# Bumped whenever the features change, so trained heads and checkpoints of another version are redone.
# The targets also read the training GPUs' calibrated bandwidths (REFERENCE), and so do the row heads'
# features (RELATIVE_HEADS): retrain the heads after `benchmarks/calibrate_devices.py --write` changes them.
FEATURE_VERSION = 8

CLOCKED_HEADS = frozenset({"conv"})
"""Heads whose bound computes at the clock the GPU sustains under its power cap, given the GEMM fit's
watts (:func:`roofline_ms`), and which read no spec-sheet features but the ridge point
(:func:`with_device`): they are trained against one GEMM fit and again when its watts change."""

RELATIVE_HEADS = frozenset({"ln", "softmax"})
"""Heads that read no spec-sheet fact but the ridge point: the GPU enters their features as the
problem's size against it, the time its (fp32 twin's) bytes take at the GPU's achieved bandwidth and
its rows per SM (:func:`with_device`). Beside the problem's own log bytes and rows, these tell the
network three device quantities (achieved bandwidth, SMs, ridge), where the others read six."""

_SPECLESS = CLOCKED_HEADS | RELATIVE_HEADS  # the heads that read no spec-sheet fact but the ridge

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
         "aten.scalar_tensor.default": "ew",
         # TensorIterator elementwise kernels PyTorch does not tag pointwise.
         "aten.hardswish.default": "ew", "aten.hardswish_backward.default": "ew",
         "aten.hardsigmoid_backward.default": "ew", "aten.hardtanh_backward.default": "ew",
         "aten.floor_divide.default": "ew",
         # Random fills, one elementwise pass over their output.
         "aten.rand.default": "ew", "aten.bernoulli.p": "ew"}  # fmt: skip
# Row ops PyTorch runs as more than their row kernel (SDPA's math-path softmax, the softmax and layer
# norm backward) are lowered before this table is read (``head_of``, ``fxcost.lowering.row_ops``).

# The reference roofline whose ratio to the measured time is the learned target: the peak compute rate
# and the DRAM bandwidth the GPU achieves (calibrated, else its memory controller class's share of the
# spec: fxcost.gpus.fallbacks), so that a head learns what the bandwidth leaves out, not each GPU's
# bandwidth through its spec features (LOO elementwise 9.3% at the spec bandwidth, 3.6% at the achieved
# one; layer norm 14.6 and 11.4; softmax 20.7 and 18.9). Its 10 us floor keeps tiny ops' ratios finite.
REFERENCE = Roofline(launch_floor_ms=0.01, achieved_bandwidth=True)


LOWERED = "lowered"
"""What :func:`head_of` says of a node the heads price as the work it lowers to: a cuDNN RNN, fused
attention or a grouped MoE GEMM as its GEMMs (``lowering.composite``), a memory-bound op
(``lowering.MEMORY_BOUND``) as elementwise passes moving the bytes its kernels move."""


def head_of(node: NodeCost) -> str | None:
    """The head that predicts ``node``, :data:`LOWERED` for work the heads predict, None if none does."""
    if not node.has_kernel:
        return None
    if lowers(node):
        return LOWERED  # a row op run as more than its row kernel (``fxcost.lowering.row_ops``)
    head = _HEAD_OF_OP.get(node.op)
    if head is not None:
        return head
    if node.op in COMPOSITE_OPS or node.op in MEMORY_BOUND:
        return LOWERED
    return "ew" if node.out_shapes and is_pointwise(node.op) else None


def device_features(device: Device) -> list[float]:
    """Spec-sheet facts of a GPU, log-scaled: peak FP32, bandwidth, SMs, L2, clock, memory (the README
    tells why not ratios of them)."""
    values = [device.fp32_tflops, device.mem_bandwidth_gbps, device.num_sms, device.l2_cache_mb,
              device.boost_clock_mhz, device.memory_gb]  # fmt: skip
    if any(v is None for v in values):
        raise ValueError(f"{device.name} lacks a spec value the heads need")
    return [math.log(float(v)) for v in values]  # type: ignore[arg-type]


def node_features(head: str, node: NodeCost, nbytes: float | None = None) -> list[float]:
    """The problem features of ``node`` for ``head`` (device features are appended separately);
    ``nbytes`` stands for the node's bytes where given (see :func:`fp32_bytes`)."""
    flops = max(float(node.flops or 0), 1.0)
    traffic = max(float((node.bytes if nbytes is None else nbytes) or 0), 1.0)
    common = [math.log(flops), math.log(traffic), math.log(flops / traffic)]
    if head in ("linear", "bmm"):
        b, m, n, k = gemm_dims(node)
        dims = [math.log(b), math.log(m), math.log(n), math.log(k)]
        # Tile quantization: the share of the output tiles' work that is real, for the tile shapes of
        # the cuBLAS fp32 kernels in the data (128x128 down to 32x128); and the 128x128 tile count the
        # device features turn into waves.
        use = [math.log(m * n / (_round_up(m, tm) * _round_up(n, tn))) for tm, tn in _TILES]
        tiles = b * math.ceil(m / 128) * math.ceil(n / 128)
        return [*dims, *use, math.log(tiles), *common]
    if head == "conv":
        b, cin, cout, kernel, size, stride = conv_dims(node)
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

# Positions of the log rows and the log bytes in the row heads' features (rows, row length, FLOPs,
# bytes, intensity).
_ROW_ROWS, _ROW_BYTES = 0, 3


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def roofline_ms(batch: NodeBatch, device: Device, watts: float | None = None) -> np.ndarray:
    """The lower bound the heads' targets are relative to: the roofline of the work and DRAM traffic
    of the nodes on ``device``, at its peak compute rate and the DRAM bandwidth it achieves.

    Row kernels (layer norm, softmax) read rows again in later passes; the re-reads that miss
    ``device``'s L2 count as traffic, so an op whose rows outgrow the L2 of one GPU (an effect beyond
    the training rows' row lengths) keeps the efficiency it has on another. A 3x3 stride-1
    convolution may run as Winograd's F(2x2, 3x3), with 2.25x fewer multiplies (cuDNN's fastest
    measured ones sustain 2.25x the fp32 peak in direct FLOPs): every convolution's compute bound
    counts that many fewer (:data:`WINOGRAD_SAVING`).

    ``watts``: the GEMM fit's draw per TFLOP/s of peak (``GemmFit.watts``). Where given, a
    convolution computes at the clock ``device`` sustains under its power cap
    (:func:`~fxcost.cost_models.heads.sustained.clock_share`), as its GEMMs do; the conv head's
    efficiency is read against that bound, so that a 70 W T4 and a 250 W V100 running the same
    kernels get the same one (see :func:`with_device`). None: every op at the boost clock.
    """
    kernels = batch.derived("heads.row_kernels", lambda: [_row_kernels(n) for n in batch.nodes])
    traffic = np.array([dram_traffic_factor(k, device) if k else 1.0 for k in kernels])
    fewer = batch.derived("heads.winograd", lambda: np.array([_winograd(n) for n in batch.nodes]))
    # A new GPU's tables read this bound for some 200 batches, most without a clocked head's node:
    # they skip the work (20% of a ResNet's price).
    clocked = batch.derived(
        "heads.clocked", lambda: np.array([head_of(n) in CLOCKED_HEADS for n in batch.nodes])
    )
    if watts is not None and clocked.any():
        fewer = np.where(clocked, fewer * clock_share(device, watts), fewer)
    return REFERENCE.predict(batch, device, traffic, flops=np.nan_to_num(batch.flops) / fewer)


# How many times fewer multiplies a convolution's bound counts: Winograd's F(2x2, 3x3) does a 3x3
# convolution with 2.25x fewer, and cuDNN's fastest measured convolutions reach exactly 2.25x the fp32
# peak in direct FLOPs. Every convolution's bound counts it, whatever its kernel: the training rows
# are all 3x3 stride-1 convolutions, and the efficiency learned there carries to a 1x1 one only
# against a bound of the same kind (4x, F(4x4, 3x3)'s saving, did worse on the GPUs left out: conv
# LOO 39% against 31%).
WINOGRAD_SAVING = 2.25


def _winograd(node: NodeCost) -> float:
    """How many times fewer multiplies ``node``'s bound counts (1 but for convolutions)."""
    return WINOGRAD_SAVING if head_of(node) == "conv" else 1.0


def _row_kernels(node: NodeCost) -> list[Any]:
    return kernels_of(node) if head_of(node) in ("ln", "softmax") else []


@dataclass(frozen=True)
class Group:
    """The nodes of one head in a batch: their positions, the nodes (a backward convolution as its
    forward one), how often each runs, and their problem features."""

    index: list[int]
    batch: NodeBatch
    repeats: np.ndarray
    problem: list[list[float]]


def feature_matrix(head: str, nodes: Sequence[NodeCost], device: Device) -> np.ndarray:
    """Rows of problem features + device features (none for :data:`CLOCKED_HEADS` and
    :data:`RELATIVE_HEADS`) + intensity over the device's ridge point (+ the row heads' problem
    against the GPU, the GEMMs' waves: see :func:`with_device`)."""
    return with_device(head, [node_features(head, n) for n in nodes], device)


def with_device(head: str, problem: Sequence[Sequence[float]] | np.ndarray, device: Device) -> np.ndarray:
    """Problem feature rows (see :func:`node_features`) completed with ``device``'s features, the
    problem's arithmetic intensity over the device's ridge point and, for GEMMs, its waves of tiles.

    The convolution head (:data:`CLOCKED_HEADS`) sees no device features but the ridge point: its
    bound (:func:`roofline_ms` with the GEMM fit's ``watts``) carries the GPU, and the efficiency
    against it is the problem's and cuDNN's. Three
    GPUs train it in a fold that leaves one out (no A100 convolutions are in the data), too few for
    six spec features to say how a fourth behaves: with them, a left-out GPU's convolutions came
    out 31% off (LOO) and 27% (LOGO), every GPU biased its own way; without them and against the
    power-capped bound, 23% and 23% (``benchmarks/generalization.py``; against the boost clock's
    bound, 30% and 29%).

    The row heads (:data:`RELATIVE_HEADS`) see the same ridge and, in place of the spec-sheet facts,
    the problem against the GPU (the last two columns): the log time its bytes (its fp32 twin's, as
    the problem features count them) take at the achieved bandwidth, and its log rows per SM. Their
    efficiency is set by how a row kernel's passes meet the caches and by how full the GPU is, not
    by which GPU it is; four GPUs cannot teach six spec features that. On the GPUs left out
    (``benchmarks/generalization.py --full``, seeds 0 and 1) layer norm went from 11.2 and 13.1%
    (LOO) to 10.4 and 11.0, softmax from 18.0 and 17.6% to 15.0 and 15.8; in distribution too (layer
    norm 7.0 and 7.2 to 6.0 and 6.9, softmax 13.1 and 13.5 to 12.3 and 11.5).
    """
    dev = device_features(device) if head not in _SPECLESS else []
    # The ridge of the spec sheet, a feature like the others (the bound itself takes the achieved bandwidth).
    ridge = math.log(float(device.fp32_tflops) * 1e12 / (float(device.mem_bandwidth_gbps) * 1e9))  # type: ignore[arg-type]
    rows = np.asarray(problem, dtype=np.float64).reshape(len(problem), -1)
    x = np.c_[rows, np.broadcast_to(dev, (len(rows), len(dev))), rows[:, -1] - ridge]
    if head in RELATIVE_HEADS:
        at_bandwidth = rows[:, _ROW_BYTES] - math.log(float(device.bandwidth_gbps) * 1e6)  # type: ignore[arg-type]
        per_sm = rows[:, _ROW_ROWS] - math.log(float(device.num_sms))  # type: ignore[arg-type]
        x = np.c_[x, at_bandwidth, per_sm]
    if head in ("linear", "bmm"):
        # One 128x128 tile per SM at a time: the waves of the grid, and the share of the last wave filled.
        tiles = np.rint(np.exp(x[:, _GEMM_TILES]))
        waves = np.ceil(tiles / float(device.num_sms))  # type: ignore[arg-type]
        x = np.c_[x, np.log(waves), np.log(tiles / (waves * float(device.num_sms)))]  # type: ignore[arg-type]
    return x


def fp32_traffic(node: NodeCost) -> tuple[int | None, int | None]:
    """(bytes read, bytes written) of ``node`` with its half-precision tensors in fp32 (bool masks and
    integer indices stay as they are); the node's own traffic when it has none. The heads' features
    read these: fed half-precision bytes, they would see an op twice as compute-dense as any they
    learned and predict bf16 work slower than fp32."""
    if not any(d in HALF_DTYPES for d in (*node.in_dtypes, *node.out_dtypes)):
        return node.bytes_read, node.bytes_written
    read = _growth(node.in_shapes, node.in_dtypes)
    # In-place ops write their inputs (no outputs recorded): those grow as the inputs do.
    written = _growth(node.out_shapes, node.out_dtypes) if node.out_shapes else read
    return (
        None if node.bytes_read is None else round(read * node.bytes_read),
        None if node.bytes_written is None else round(written * node.bytes_written),
    )


def fp32_bytes(node: NodeCost) -> int | None:
    """The bytes :func:`fp32_traffic` moves in all, None if unknown."""
    read, written = fp32_traffic(node)
    return None if read is None or written is None else read + written


def _growth(shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> float:
    """How much tensors' bytes grow when their half-precision ones widen to fp32."""
    wide = ["float32" if d in HALF_DTYPES else d for d in dtypes]
    now = recorded_bytes(shapes, dtypes)
    return recorded_bytes(shapes, wide) / now if now else 2.0
