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
pixels, which sets its load width: cuDNN picks per gradient, and the work carries both ways
(:attr:`TensorWork.choices`), priced at the faster. Grouped, dilated and
transposed convolutions stay with the heads.

A GEMM whose dims are not multiples of 16 bytes runs on narrow-load kernels (cuBLAS ``align1`` /
``align2``), at the share of the rate its load width allows (:func:`load_share`): GPT-2's 50,257-word
vocabulary makes its output GEMMs run 8x slower per FLOP than 50,304 would. That is the one place
where a larger problem may be predicted faster (a dim padded to 16 bytes); doubling a dim never is
(the load width at most doubles with it). Operand layouts are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fxcost.lowering.nodes import MATMULS, gemm_dims
from fxcost.precision import HALF_DTYPES, itemsize
from fxcost.records import NodeCost

__all__ = ["CONVOLUTIONS", "Gradient", "LayoutWorks", "TensorWork", "layout_works", "load_share",
           "tensor_kind", "tensor_work", "work_kind"]  # fmt: skip

_CONV = "aten.convolution.default"
_CONV_BACKWARD = "aten.convolution_backward.default"
CONVOLUTIONS = (_CONV, _CONV_BACKWARD)

Gradient = Literal["data", "weight"]
"""A convolution's GEMMs: ``"data"``, the forward's output or the input's gradient (cuDNN's fprop and
dgrad); ``"weight"``, the weight's gradient (wgrad)."""
_GRADIENTS: tuple[Gradient, Gradient] = ("data", "weight")

# The widest load of the tensor-core kernels' main loops (cp.async / TMA vectors): 16 bytes.
_FULL_LOAD_BYTES = 16


def tensor_kind(node: NodeCost) -> str | None:
    """``"bfloat16"``, ``"float16"`` or ``"tf32"`` for a GEMM or convolution node that runs on tensor
    cores where the GPU has them (half-precision operands, or fp32 ones with TF32 allowed at
    capture: ``NodeCost.tf32``); None otherwise."""
    if node.op not in MATMULS and node.op not in CONVOLUTIONS:
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
    the bytes of each memory pass (layout transposes, a bias gradient). ``choices``: further kernels
    the node runs, each one of several ways the library may run it (works without choices of their
    own), priced at the fastest: a 1x1 convolution's gradients."""

    kind: str
    gemms: tuple[tuple[int, int, int, int], ...]
    gemm_bytes: tuple[float, ...]
    passes: tuple[float, ...]
    load_shares: tuple[float, ...] = ()
    choices: tuple[tuple[TensorWork, ...], ...] = ()

    def shares(self) -> tuple[float, ...]:
        return self.load_shares or (1.0,) * len(self.gemms)


def tensor_work(node: NodeCost, channels_last: bool = False) -> TensorWork | None:
    """The tiled work of ``node`` (None if it is neither a GEMM nor a convolution that runs on tensor
    cores, or its shapes are not those this model reads). An fp32 GEMM's loads are not narrowed by
    its alignment: the CUDA-core tiles' shares were fit over measured GEMMs of every alignment.
    ``channels_last``: a convolution on NHWC tensors, as a step running channels-last runs it (its
    implicit GEMMs, nothing transposed, no GEMM per image)."""
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
        conv = _Conv.of(node, kind, size, align)
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    if conv is None:
        return None
    if channels_last:
        return conv.work([conv.implicit_gemm(g, layout_passes=False) for g in conv.gradients])
    if not conv.plain:
        return conv.work([conv.implicit_gemm(g) for g in conv.gradients])
    # A 1x1 stride-1 unpadded convolution: each gradient a GEMM per image or the implicit GEMM on
    # transposed tensors, whichever is faster, as cuDNN picks per gradient (the H100 recordings:
    # ResNet-50's 7x7 maps, 49 pixels, run transposed; its 14x14 ones, 196, per image, but for the
    # weight gradient, transposed; its 28x28 and 56x56 ones per image).
    ways = tuple((conv.per_image_gemm(g), conv.implicit_gemm(g)) for g in conv.gradients)
    return conv.work([], choices=ways)


@dataclass(frozen=True)
class _Conv:
    """A convolution node's problem: input ``x``, weight ``w``, output (or its gradient) ``dy``, in
    ``size``-byte elements loaded ``align`` at a time; the GEMMs it runs, and whether it also computes
    a bias gradient."""

    kind: str
    size: int
    align: int
    backward: bool
    x: tuple[int, ...]
    w: tuple[int, ...]
    dy: tuple[int, ...]
    gradients: tuple[Gradient, ...]
    bias: bool
    plain: bool  # 1x1, stride 1, no padding: a GEMM per image on NCHW tensors

    @classmethod
    def of(cls, node: NodeCost, kind: str, size: int, align: int) -> _Conv | None:
        """The problem of a convolution node; None for one this model does not read (transposed,
        grouped, dilated, not 2-D, or asked for no gradient it prices)."""
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
        mask = list(args.get("output_mask") or [True, True, False]) if backward else [True, False, False]
        gradients = tuple(g for g, wanted in zip(_GRADIENTS, mask[:2], strict=True) if wanted)
        if not gradients:
            return None
        plain = (
            w[2] == w[3] == 1
            and all(int(s) == 1 for s in (args.get("stride") or [1]))
            and all(int(p) == 0 for p in (args.get("padding") or [0]))
        )
        return cls(kind, size, align, backward, tuple(x), tuple(w), tuple(dy), gradients,
                   len(mask) > 2 and bool(mask[2]), plain)  # fmt: skip

    def bytes(self) -> tuple[int, int, int]:
        """The bytes of ``x``, ``w`` and ``dy``."""
        return math.prod(self.x) * self.size, math.prod(self.w) * self.size, math.prod(self.dy) * self.size

    def implicit_gemm(self, gradient: Gradient, layout_passes: bool = True) -> TensorWork:
        """cuDNN's implicit GEMM on NHWC tensors for ``gradient``, with ``layout_passes``: each tensor
        it reads or writes transposed from NCHW and back once (a 1x1 filter reads the same in either
        layout: the recorded kernels transpose only the activations)."""
        batch, c_in, height, width = self.x
        c_out, _, kh, kw = self.w
        pixels, out_pixels = height * width, self.dy[2] * self.dy[3]
        cin, cout = _up(c_in, self.align), _up(c_out, self.align)
        x_bytes, w_bytes, y_bytes = self.bytes()
        if gradient == "weight":  # dy^T (x) x, reduced over the output pixels
            gemm = (1, cout, cin * kh * kw, batch * out_pixels)
        elif self.backward:  # the input's gradient: dy (x) w^T
            gemm = (1, batch * pixels, cin, cout * kh * kw)
        else:
            gemm = (1, batch * out_pixels, cout, cin * kh * kw)
        passes = [2.0 * y_bytes, 2.0 * x_bytes] + ([2.0 * w_bytes] if kh * kw > 1 else [])
        return TensorWork(self.kind, (gemm,), (float(x_bytes + w_bytes + y_bytes),),
                          tuple(passes) if layout_passes else ())  # fmt: skip

    def per_image_gemm(self, gradient: Gradient) -> TensorWork:
        """A 1x1 convolution of NCHW tensors as a GEMM per image over its pixels for ``gradient``:
        the pixels are the leading dimension, which sets the load width, and nothing is transposed."""
        batch, c_in, height, width = self.x
        pixels = height * width
        cin, cout = _up(c_in, self.align), _up(self.w[0], self.align)
        if gradient == "weight":  # reduced over every image's pixels
            gemm = (1, cout, cin, batch * pixels)
        else:
            gemm = (batch, cin, pixels, cout) if self.backward else (batch, cout, pixels, cin)
        moved = float(sum(self.bytes()))
        return TensorWork(self.kind, (gemm,), (moved,), (), (load_share(pixels, self.size),))

    def work(self, parts: list[TensorWork], choices: tuple[tuple[TensorWork, ...], ...] = ()) -> TensorWork:
        """The node's work: ``parts`` (kernels one after another), each of ``choices`` at its fastest
        way, then a bias gradient's pass reading ``dy`` where the node computes one."""
        bias = (float(math.prod(self.dy) * self.size),) if self.bias else ()
        return TensorWork(
            self.kind,
            tuple(g for p in parts for g in p.gemms),
            tuple(b for p in parts for b in p.gemm_bytes),
            tuple(b for p in parts for b in p.passes) + bias,
            tuple(s for p in parts for s in p.shares()),
            choices,
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


LayoutWorks = list[tuple[int, TensorWork, TensorWork]]


def layout_works(nodes: Sequence[NodeCost]) -> LayoutWorks:
    """(position, work on NCHW tensors, work on NHWC ones) of each convolution in ``nodes`` the tiled
    model reads: what a channels-last step saves on it (``TiledGemms.layout_savings_ms``), the same on
    every GPU."""
    found = []
    for i, node in enumerate(nodes):
        nchw = tensor_work(node) if node.op in CONVOLUTIONS else None
        nhwc = tensor_work(node, channels_last=True) if nchw is not None else None
        if nchw is not None and nhwc is not None:
            found.append((i, nchw, nhwc))
    return found
