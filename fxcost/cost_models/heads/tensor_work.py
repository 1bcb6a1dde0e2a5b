"""What a GEMM or convolution node runs as tiled GEMM kernels, on no GPU in particular
(:class:`TensorWork`): its GEMMs, their DRAM bytes and operand-load shares, and its memory passes.
Priced per GPU by :mod:`fxcost.cost_models.heads.tensor_core`: on tensor cores for bf16, fp16 and
TF32 work, on CUDA cores for an fp32 GEMM (kind ``"float32"``; fp32 convolutions without TF32 are the
``conv`` head's).

A convolution runs as cuDNN's implicit GEMM: forward ``M = B*Ho*Wo, N = C_out, K = C_in*kh*kw``; its
input gradient ``M = B*H*W, N = C_in, K = C_out*kh*kw``; its weight gradient ``M = C_out,
N = C_in*kh*kw, K = B*Ho*Wo``; channels padded to 16 bytes. The tensor-core kernels are NHWC, and
PyTorch tensors are NCHW unless a user asks for channels_last (which the records do not say): cuDNN
transposes each tensor such a kernel reads or writes (NVIDIA's convolution performance guide says
so; the recorded H100 kernels show it), one memory pass each. A 1x1 stride-1 convolution (and each
of its gradients) can instead run as a plain GEMM per image, whose leading dimension is the image's
pixels, which sets its load width: cuDNN picks per gradient, and the work carries both
(:attr:`TensorWork.alternatives`), priced as the faster. Grouped, dilated and transposed convolutions
stay with the heads.

A GEMM whose dims are not multiples of 16 bytes runs on narrow-load kernels (cuBLAS ``align1`` /
``align2``), at the share of the rate its load width allows (:func:`load_share`): GPT-2's 50,257-word
vocabulary makes its output GEMMs run 8x slower per FLOP than 50,304 would. That is the one place
where a larger problem may be predicted faster (a dim padded to 16 bytes); doubling a dim never is
(the load width at most doubles with it). Operand layouts are not modelled.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from fxcost.lowering.nodes import MATMULS, gemm_dims
from fxcost.precision import HALF_DTYPES, itemsize
from fxcost.records import NodeCost

__all__ = ["TensorWork", "layout_pass_bytes", "load_share", "tensor_kind", "tensor_work", "work_kind"]

_CONV = "aten.convolution.default"
_CONV_BACKWARD = "aten.convolution_backward.default"
_CONVS = (_CONV, _CONV_BACKWARD)

# The widest load of the tensor-core kernels' main loops (cp.async / TMA vectors): 16 bytes.
_FULL_LOAD_BYTES = 16


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


def work_kind(node: NodeCost) -> str | None:
    """:func:`tensor_kind`, or ``"float32"`` for a GEMM of fp32 operands run on CUDA cores."""
    kind = tensor_kind(node)
    if kind is None and node.op in MATMULS and "float32" in node.in_dtypes[-2:]:
        return "float32"
    return kind


@dataclass(frozen=True)
class TensorWork:
    """What a tiled node runs, independent of the GPU: its GEMMs (batch, M, N, K) with the DRAM
    bytes of each kernel and the share of the rate its operand loads allow (:func:`load_share`), and
    the bytes of each memory pass (layout transposes, a bias gradient)."""

    kind: str
    gemms: tuple[tuple[int, int, int, int], ...]
    gemm_bytes: tuple[float, ...]
    passes: tuple[float, ...]
    load_shares: tuple[float, ...] = ()
    alternatives: tuple[TensorWork, ...] = ()  # other ways the library may run it: the fastest is priced

    def shares(self) -> tuple[float, ...]:
        return self.load_shares or (1.0,) * len(self.gemms)


def tensor_work(node: NodeCost) -> TensorWork | None:
    """The tiled work of ``node`` (None if it is neither a GEMM nor a convolution that runs on tensor
    cores, or its shapes are not those this model reads). An fp32 GEMM's loads are not narrowed by
    its alignment: the CUDA-core tiles' shares were fit over measured GEMMs of every alignment."""
    kind = work_kind(node)
    if kind is None or node.bytes is None:
        return None
    size = 4 if kind == "tf32" else itemsize(kind)
    align = max(_FULL_LOAD_BYTES // size, 1)  # elements per 16 bytes
    try:
        if node.op in MATMULS:
            b, m, n, k = gemm_dims(node)
            if min(b, m, n, k) < 1:
                return None
            share = 1.0 if kind == "float32" else min(load_share(d, size) for d in (m, n, k))
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
    mask = [True, False, False] if not backward else list(args.get("output_mask") or [True, True, False])
    single = [(g == 0, g == 1) for g in range(2) if mask[g]]  # each gradient asked for, on its own
    if not single:
        return None
    conv = _Conv(kind, size, backward, tuple(x), tuple(w), tuple(dy))
    bias_bytes = float(math.prod(dy) * size) if len(mask) > 2 and mask[2] else 0.0  # one pass reading dy
    implicit = [conv.implicit_gemm(align, m) for m in single]
    plain = w[2] == w[3] == 1 and all(int(s) == 1 for s in (args.get("stride") or [1]))
    if not (plain and all(int(p) == 0 for p in (args.get("padding") or [0]))):
        return _joined(implicit, bias_bytes)
    # A 1x1 stride-1 convolution: each gradient a GEMM per image, or the implicit GEMM on transposed
    # tensors where that is faster (pixels that load narrowly), as cuDNN picks per gradient (the H100
    # recordings: ResNet-50's 7x7 maps, 49 pixels, run transposed; its 14x14 ones, 196, per image, but
    # for the weight gradient, transposed).
    per_image = [conv.per_image_gemm(align, m) for m in single]
    pairs = zip(per_image, implicit, strict=True)
    choices = [_joined(list(parts), bias_bytes) for parts in itertools.product(*pairs)]
    return dataclasses.replace(choices[0], alternatives=tuple(choices[1:]))


@dataclass(frozen=True)
class _Conv:
    """A convolution node's problem: input ``x``, weight ``w``, output (or its gradient) ``dy``."""

    kind: str
    size: int
    backward: bool
    x: tuple[int, ...]
    w: tuple[int, ...]
    dy: tuple[int, ...]

    def _bytes(self) -> tuple[int, int, int]:
        return math.prod(self.x) * self.size, math.prod(self.w) * self.size, math.prod(self.dy) * self.size

    def implicit_gemm(self, align: int, mask: tuple[bool, bool]) -> TensorWork:
        """cuDNN's implicit GEMM on NHWC for the gradients ``mask`` names: each tensor a kernel reads
        or writes transposed once."""
        batch, c_in, height, width = self.x
        c_out, _, kh, kw = self.w
        pixels, out_pixels = height * width, self.dy[2] * self.dy[3]
        cin, cout = _up(c_in, align), _up(c_out, align)
        x_bytes, w_bytes, y_bytes = self._bytes()
        gemms, moved, passes = [], [], []
        if mask[0] and not self.backward:
            gemms.append((1, batch * out_pixels, cout, cin * kh * kw))
        elif mask[0]:  # input gradient: dy (x) w^T
            gemms.append((1, batch * pixels, cin, cout * kh * kw))
        if mask[0]:
            moved.append(float(x_bytes + w_bytes + y_bytes))
            passes += [2.0 * y_bytes, 2.0 * w_bytes, 2.0 * x_bytes]
        if mask[1]:  # weight gradient: dy^T (x) x, reduced over the output pixels
            gemms.append((1, cout, cin * kh * kw, batch * out_pixels))
            moved.append(float(y_bytes + x_bytes + w_bytes))
            passes += [2.0 * y_bytes, 2.0 * x_bytes, 2.0 * w_bytes]
        return TensorWork(self.kind, tuple(gemms), tuple(moved), tuple(passes))

    def per_image_gemm(self, align: int, mask: tuple[bool, bool]) -> TensorWork:
        """A 1x1 stride-1 convolution of NCHW tensors as a GEMM per image over its pixels, for the
        gradients ``mask`` names: the pixels are the leading dimension, which sets the load width, and
        nothing is transposed."""
        batch, c_in, height, width = self.x
        c_out = self.w[0]
        pixels = height * width
        cin, cout = _up(c_in, align), _up(c_out, align)
        gemms = []
        if mask[0]:
            gemms.append((batch, cout, pixels, cin) if not self.backward else (batch, cin, pixels, cout))
        if mask[1]:  # the weight gradient, reduced over every image's pixels
            gemms.append((1, cout, cin, batch * pixels))
        moved = float(sum(self._bytes()))
        share = load_share(pixels, self.size)
        return TensorWork(self.kind, tuple(gemms), (moved,) * len(gemms), (), (share,) * len(gemms))


def _joined(parts: list[TensorWork], bias_bytes: float) -> TensorWork:
    """One node's work run as ``parts`` (kernels one after another), with a bias gradient's pass."""
    return TensorWork(
        parts[0].kind,
        tuple(g for p in parts for g in p.gemms),
        tuple(b for p in parts for b in p.gemm_bytes),
        tuple(b for p in parts for b in p.passes) + ((bias_bytes,) if bias_bytes else ()),
        tuple(s for p in parts for s in p.shares()),
    )


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


def layout_pass_bytes(node: NodeCost) -> tuple[float, ...]:
    """The bytes of the NCHW/NHWC transposes :func:`tensor_work` charges a convolution (none for other
    nodes or a 1x1 stride-1 convolution): the passes a step running channels-last does not run. A 1x1
    convolution keeps the faster of its NCHW ways (per image, or transposed where its pixels load
    narrowly): an upper bound on the plain GEMM it runs channels-last."""
    work = tensor_work(node) if node.op in _CONVS else None
    if work is None:
        return ()
    mask = list(node.args.get("output_mask") or [True, True, False]) if node.op == _CONV_BACKWARD else []
    return work.passes[:-1] if len(mask) > 2 and mask[2] else work.passes  # the last: a bias gradient
