"""Tensor-core GEMMs and convolutions (bf16, fp16, TF32): tiles, waves and the sustained tensor rate.

The heads learned fp32 GEMMs on CUDA cores. Read at a tensor-core peak 15x higher, their efficiency
predicted bf16 work far too fast: a tensor-core GEMM of a training step's size is set by how its
output tiles fill the GPU, by memory and by the launch floor, not by a share of the peak. So work
that runs on tensor cores is priced by its structure, as cuBLAS and cuDNN run it:

- **Tiles.** The output is cut into tiles of one of :data:`TILES` (the CUTLASS / cuBLAS tensor-core
  tile shapes shared by Volta to Hopper: 256x128 down to 64x64), optionally with the reduction split
  in :data:`SPLITS` slices (split-K, for few tiles over a long K), whichever is fastest, as the
  library's heuristics pick. A tile smaller than 128x128 reuses each operand element less: it is fed
  at its intensity's share of the rate (:func:`_feed`).
- **Waves.** The tiles run in ``ceil(tiles / SMs)`` waves: CTAs resident together on one SM share its
  tensor cores, so more of them per SM do not finish sooner.
- **Rate.** Each wave runs at the GPU's *sustained* tensor rate (:class:`TensorCores`): a rate
  ``fxcost calibrate`` measured (``tl.dot``) where the user calibrated the GPU, else the spec-sheet
  tensor peak times the share of its peak the GPU sustains on a large GEMM, which the fp32 heads
  learned from fp32 measurements (clocks under the power cap, main-loop issue: what holds a large
  GEMM below peak on any unit; on the training GPUs it is 0.6-0.85).
- **Time.** ``max(launch floor, waves x tile time, DRAM bytes / bandwidth)`` per kernel, a split-K's
  partial sums in fp32 written and read back by one more kernel.

A convolution runs as cuDNN's implicit GEMM: forward ``M = B*Ho*Wo, N = C_out, K = C_in*kh*kw``; its
input gradient ``M = B*H*W, N = C_in, K = C_out*kh*kw``; its weight gradient ``M = C_out,
N = C_in*kh*kw, K = B*Ho*Wo``; channels padded to 16 bytes. The tensor-core kernels are NHWC, and
PyTorch tensors are NCHW unless a user asks for channels_last (which the records do not say): cuDNN
transposes each tensor such a kernel reads or writes (NVIDIA's convolution performance guide says
so; the recorded H100 kernels show it), one memory pass each; a 1x1 stride-1 convolution (and its
gradients) is instead a plain GEMM per image, whose leading dimension is the image's pixels.
Grouped, dilated and transposed convolutions stay with the heads.

Every term grows with every problem dim (tile counts and padded K are ceilings, the candidates are
fixed), so the minimum over candidates never falls as the problem grows (but for alignment, below).
Across GPUs a kernel time is the smallest of the GPU's own and those of the GPUs it beats on every
spec (:func:`fxcost.gpus.order.weaker_than`): a stronger GPU never runs one longer. A calibrated
GPU keeps its own measured rate.

A GEMM whose dims are not multiples of 16 bytes runs on narrow-load kernels (cuBLAS ``align1`` /
``align2``), at the share of the rate its load width allows (:func:`load_share`): GPT-2's 50,257-word
vocabulary makes its output GEMMs run 8x slower per FLOP than 50,304 would. That is the one place
where a larger problem may be predicted faster (a dim padded to 16 bytes); doubling a dim never is
(the load width at most doubles with it). Operand layouts are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.roofline import LAUNCH_FLOOR_MS
from fxcost.gpus import Device
from fxcost.gpus.order import weaker_than
from fxcost.lowering.nodes import MATMULS, gemm_dims
from fxcost.precision import HALF_DTYPES, itemsize
from fxcost.records import NodeCost

__all__ = [
    "SPLITS",
    "TILES",
    "TensorCores",
    "TensorWork",
    "gemm_kernel_ms",
    "layout_pass_bytes",
    "tensor_kind",
    "tensor_peak_tflops",
    "tensor_work",
]

TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
"""Output tile shapes (rows x columns) of the tensor-core GEMM kernels: CUTLASS's default tensor-core
tile configurations for sm70-sm90, which cuBLAS and cuDNN kernels share."""

SPLITS = (1, 2, 4, 8, 16)
"""Split-K slice counts a kernel may run with."""

_FULL_RATE_TILE = (128, 128)  # the smallest tile the libraries run at full rate on sm80 and sm90

# The reduction step of the main loop (elements of K per pipeline stage): K is padded to it.
_K_STEP = 32

# The GEMM whose fp32 efficiency on a GPU stands for the share of its peaks it sustains: large enough
# to fill every GPU with full waves of full tiles, and within every training GPU's measured sizes.
_REFERENCE_SIZE = 4096

_KERNEL_FLOOR_MS = LAUNCH_FLOOR_MS  # the shortest kernel on the GPU's timeline


def tensor_kind(node: NodeCost) -> str | None:
    """``"bfloat16"``, ``"float16"`` or ``"tf32"`` for a GEMM or convolution node that runs on tensor
    cores where the GPU has them (half-precision operands, or fp32 ones with TF32 allowed at
    capture: ``NodeCost.tf32``); None otherwise."""
    if node.op not in MATMULS and node.op not in _CONVS:
        return None
    dtypes = node.in_dtypes[-2:] if node.op in MATMULS else node.in_dtypes[:3]
    half = next((d for d in dtypes if d in HALF_DTYPES), None)
    if half is not None:
        return half
    return "tf32" if node.tf32 and "float32" in dtypes else None


def tensor_peak_tflops(device: Device, kind: str) -> float | None:
    """The spec-sheet dense peak ``device`` runs GEMMs of ``kind`` at: its tensor cores', or for a half
    precision it has none for (a V100's bf16) its fp32 CUDA cores' (as :func:`fxcost.gpus.order.strength`
    ranks it); None for TF32 without TF32 tensor cores (that is fp32 work, the heads')."""
    if kind == "tf32":
        return device.tf32_tflops
    peak = device.bf16_tflops if kind == "bfloat16" else device.fp16_tflops if kind == "float16" else None
    return peak or device.fp32_tflops


@dataclass(frozen=True)
class TensorWork:
    """What a tensor-core node runs, independent of the GPU: its GEMMs (batch, M, N, K) with the DRAM
    bytes of each kernel and the share of the rate its operand loads allow (:func:`load_share`), and
    the bytes of each memory pass (layout transposes, a bias gradient)."""

    kind: str
    gemms: tuple[tuple[int, int, int, int], ...]
    gemm_bytes: tuple[float, ...]
    passes: tuple[float, ...]
    load_shares: tuple[float, ...] = ()

    def shares(self) -> tuple[float, ...]:
        return self.load_shares or (1.0,) * len(self.gemms)


_CONV = "aten.convolution.default"
_CONV_BACKWARD = "aten.convolution_backward.default"
_CONVS = (_CONV, _CONV_BACKWARD)


def tensor_work(node: NodeCost) -> TensorWork | None:
    """The tensor-core work of ``node`` (None if it does not run on tensor cores, or its shapes are
    not those this model reads)."""
    kind = tensor_kind(node)
    if kind is None or node.bytes is None:
        return None
    size = 4 if kind == "tf32" else itemsize(kind)
    align = max(_FULL_LOAD_BYTES // size, 1)  # elements per 16 bytes
    try:
        if node.op in MATMULS:
            b, m, n, k = gemm_dims(node)
            if min(b, m, n, k) < 1:
                return None
            share = min(load_share(d, size) for d in (m, n, k))
            return TensorWork(kind, ((b, m, n, k),), (float(node.bytes),), (), (share,))
        return _conv_work(node, kind, size, align)
    except (IndexError, KeyError, TypeError, ValueError):
        return None


def _conv_work(node: NodeCost, kind: str, size: int, align: int) -> TensorWork | None:
    args = node.args
    if args.get("transposed") or int(args.get("groups") or 1) != 1:
        return None
    if any(int(d) != 1 for d in (args.get("dilation") or [1])):
        return None
    backward = node.op == _CONV_BACKWARD
    dy = node.in_shapes[0] if backward else node.out_shapes[0]
    x, w = (node.in_shapes[1], node.in_shapes[2]) if backward else (node.in_shapes[0], node.in_shapes[1])
    if len(x) != 4 or len(w) != 4 or len(dy) != 4:
        return None
    batch, c_in, height, width = x
    c_out, _, kh, kw = w
    pixels, out_pixels = height * width, dy[2] * dy[3]
    cin, cout = _up(c_in, align), _up(c_out, align)
    x_bytes, w_bytes, y_bytes = (math.prod(s) * size for s in (x, w, dy))
    mask = [True, False, False] if not backward else list(args.get("output_mask") or [True, True, False])
    bias = len(mask) > 2 and bool(mask[2])  # a bias gradient: one pass reading dy
    plain = kh == kw == 1 and all(int(s) == 1 for s in (args.get("stride") or [1]))
    if plain and all(int(p) == 0 for p in (args.get("padding") or [0])):
        # A 1x1 stride-1 convolution of NCHW tensors is a GEMM per image over its pixels (the pixels
        # the leading dimension): no layout transposes.
        share = load_share(pixels, size)
        found = []
        if mask[0]:
            found.append(((batch, cout, pixels, cin), x_bytes + w_bytes + y_bytes) if not backward else
                         ((batch, cin, pixels, cout), y_bytes + w_bytes + x_bytes))  # fmt: skip
        if mask[1]:  # the weight gradient, reduced over every image's pixels
            found.append(((1, cout, cin, batch * pixels), y_bytes + x_bytes + w_bytes))
        if not found:
            return None
        return TensorWork(kind, tuple(g for g, _ in found), tuple(float(b) for _, b in found),
                          (float(y_bytes),) if bias else (), (share,) * len(found))  # fmt: skip
    # cuDNN's implicit GEMM on NHWC: each tensor a kernel reads or writes transposed once.
    gemms_list, moved_list, passes_list = [], [], []
    if mask[0] and not backward:
        gemms_list.append((1, batch * out_pixels, cout, cin * kh * kw))
    elif mask[0]:  # input gradient: dy (x) w^T
        gemms_list.append((1, batch * pixels, cin, cout * kh * kw))
    if mask[0]:
        moved_list.append(float(x_bytes + w_bytes + y_bytes))
        passes_list += [2.0 * y_bytes, 2.0 * w_bytes, 2.0 * x_bytes]
    if mask[1]:  # weight gradient: dy^T (x) x, reduced over the output pixels
        gemms_list.append((1, cout, cin * kh * kw, batch * out_pixels))
        moved_list.append(float(y_bytes + x_bytes + w_bytes))
        passes_list += [2.0 * y_bytes, 2.0 * x_bytes, 2.0 * w_bytes]
    if bias:
        passes_list.append(float(y_bytes))
    if not gemms_list:
        return None
    return TensorWork(kind, tuple(gemms_list), tuple(moved_list), tuple(passes_list))


def layout_pass_bytes(node: NodeCost) -> tuple[float, ...]:
    """The bytes of the NCHW/NHWC transposes :func:`tensor_work` charges a convolution (none for other
    nodes or a 1x1 stride-1 convolution): the passes a step running channels-last does not run."""
    work = tensor_work(node) if node.op in _CONVS else None
    if work is None:
        return ()
    mask = list(node.args.get("output_mask") or [True, True, False]) if node.op == _CONV_BACKWARD else []
    return work.passes[:-1] if len(mask) > 2 and mask[2] else work.passes  # the last: a bias gradient


# The widest load of the tensor-core kernels' main loops (cp.async / TMA vectors): 16 bytes.
_FULL_LOAD_BYTES = 16


def load_share(dim: int, size: int) -> float:
    """The share of the tensor rate a GEMM with dimension ``dim`` (of ``size``-byte elements) runs
    at: the libraries load operands in the widest vector that divides every leading dimension, and a
    main loop built to keep the tensor cores fed with 16-byte loads issues ``16 / width`` times as
    many loads with narrower ones (cuBLAS's ``align1``/``align2`` kernels), running that many times
    slower. Which dims are leading dimensions depends on layouts the records do not keep, so every
    dim counts: a dim that is only a GEMM's row count is priced too slow when odd."""
    width = size * (int(dim) & -int(dim))  # the largest power of two dividing dim, in bytes
    return min(width, _FULL_LOAD_BYTES) / _FULL_LOAD_BYTES


def _up(x: int, multiple: int) -> int:
    return -(-int(x) // multiple) * multiple


def _feed(tile: tuple[int, int]) -> float:
    """The share of the SM's rate a tile is fed at: its operand reuse (FLOPs per element loaded,
    ``tm*tn/(tm+tn)``) over that of the smallest tile run at full rate, at most 1."""
    tm, tn = tile
    fm, fn = _FULL_RATE_TILE
    return min(1.0, (tm * tn / (tm + tn)) / (fm * fn / (fm + fn)))


def gemm_kernel_ms(
    dims: np.ndarray,
    nbytes: np.ndarray,
    sustained_tflops: np.ndarray,
    device: Device,
    load_shares: np.ndarray | float = 1.0,
) -> np.ndarray:
    """Kernel time (ms) of tensor-core GEMMs on ``device``: ``dims`` rows of (batch, M, N, K),
    ``nbytes`` their DRAM bytes, each at its ``sustained_tflops``; the fastest tile and split-K, and
    never less than the work at the share of the rate its operand loads allow (:func:`load_share`:
    a bound apart from the tiles, so doubling a dim, which at most doubles the share, never gives a
    shorter time)."""
    sms = float(device.num_sms or np.nan)
    bandwidth = float(device.bandwidth_gbps or np.nan) * 1e6  # bytes per ms
    b, m, n, k = (dims[:, i].astype(np.float64) for i in range(4))
    per_sm = np.asarray(sustained_tflops, dtype=np.float64) * 1e9 / sms  # FLOPs per ms per SM
    best = np.full(len(dims), np.inf)
    for tile in TILES:
        tm, tn = tile
        rate = per_sm * _feed(tile)
        tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
        for split in SPLITS:
            slice_k = np.ceil(np.ceil(k / split) / _K_STEP) * _K_STEP
            waves = np.ceil(tiles * split / sms)
            compute = waves * 2.0 * tm * tn * slice_k / rate
            partials = 0.0 if split == 1 else 2.0 * split * b * m * n * 4  # fp32, written and read
            memory = (nbytes + partials) / bandwidth
            ms = np.maximum(np.maximum(compute, memory), _KERNEL_FLOOR_MS)
            if split > 1:  # the reduction of the partial sums is a kernel of its own
                ms = ms + _KERNEL_FLOOR_MS
            best = np.fmin(best, ms)
    loads = 2.0 * b * m * n * k / (np.asarray(sustained_tflops, dtype=np.float64) * 1e9 * load_shares)
    return np.maximum(best, loads)


def pass_ms(nbytes: np.ndarray, device: Device) -> np.ndarray:
    """Kernel time (ms) of memory passes moving ``nbytes`` at ``device``'s achieved bandwidth."""
    bandwidth = float(device.bandwidth_gbps or np.nan) * 1e6
    return np.maximum(np.asarray(nbytes, dtype=np.float64) / bandwidth, _KERNEL_FLOOR_MS)


Efficiency = Callable[[Device], float]
"""The share of its peaks a GPU sustains on a large GEMM, in (0, 1] (NaN if unknown)."""


class TensorCores:
    """Prices :class:`TensorWork` on a GPU; ``efficiency`` is the share of its peaks a GPU sustains on
    a large GEMM where no calibrated rate says (the heads' fp32 efficiency on one)."""

    def __init__(self, efficiency: Efficiency) -> None:
        self.efficiency = efficiency

    def sustained_tflops(self, device: Device, kind: str) -> float | None:
        """The tensor rate ``device`` sustains on a large GEMM of ``kind``: the calibrated ``tl.dot``
        rate where measured (TF32 at the calibrated bf16 rate's share of its peak), else the peak
        times :attr:`efficiency`; None if the GPU has no tensor cores for ``kind``."""
        peak = tensor_peak_tflops(device, kind)
        if peak is None:
            return None
        calibrated = _calibrated(device, kind)
        if calibrated is not None:
            return calibrated
        share = self.efficiency(device)
        return peak * min(share, 1.0) if math.isfinite(share) and share > 0 else None

    def kernel_ms(self, works: Sequence[TensorWork], device: Device) -> np.ndarray:
        """Kernel time (ms) of each work on ``device`` by its own rates (NaN where it has none)."""
        out = np.full(len(works), np.nan)
        if not works or device.num_sms is None or device.bandwidth_gbps is None:
            return out
        rates = {kind: self.sustained_tflops(device, kind) for kind in {w.kind for w in works}}
        owners: list[int] = []
        dims: list[tuple[int, int, int, int]] = []
        nbytes: list[float] = []
        rate: list[float] = []
        shares: list[float] = []
        pass_owner: list[int] = []
        pass_bytes: list[float] = []
        for i, work in enumerate(works):
            r = rates[work.kind]
            if r is None:
                continue
            out[i] = 0.0
            owners += [i] * len(work.gemms)
            dims += work.gemms
            nbytes += work.gemm_bytes
            rate += [r] * len(work.gemms)
            shares += work.shares()
            pass_owner += [i] * len(work.passes)
            pass_bytes += work.passes
        if owners:
            ms = gemm_kernel_ms(
                np.array(dims, dtype=np.float64), np.array(nbytes), np.array(rate), device, np.array(shares)
            )
            np.add.at(out, np.array(owners), ms)
        if pass_owner:
            np.add.at(out, np.array(pass_owner), pass_ms(np.array(pass_bytes), device))
        return out

    def predict(self, works: Sequence[TensorWork], device: Device) -> np.ndarray:
        """Isolated-op times (ms, as the heads predict: kernel time plus the per-op overhead an eager
        step hides, :func:`~fxcost.cost_models.eager.hidden_overhead_ms`); the kernel time is the
        smallest of ``device``'s own and those of every GPU it beats (a calibrated GPU: its own)."""
        own = self.kernel_ms(works, device)
        if not _is_calibrated(device):
            found = [own, *(self.kernel_ms(works, weaker) for weaker in weaker_than(device))]
            # A weaker GPU without tensor cores for a kind (NaN) takes no part in the envelope; where
            # the GPU itself has none, there is no prediction (the heads price it).
            own = np.where(np.isfinite(own), np.fmin.reduce(found), np.nan)
        return own + hidden_overhead_ms(device)


def _calibrated(device: Device, kind: str) -> float | None:
    bf16, fp16 = device.dot_bf16_tflops, device.dot_fp16_tflops
    if kind == "bfloat16":
        return bf16
    if kind == "float16":
        return fp16
    if kind == "tf32" and bf16 is not None and device.bf16_tflops and device.tf32_tflops:
        return bf16 * device.tf32_tflops / device.bf16_tflops
    return None


def _is_calibrated(device: Device) -> bool:
    return device.dot_bf16_tflops is not None or device.dot_fp16_tflops is not None
