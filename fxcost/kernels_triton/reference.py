"""Reference Triton kernels whose launch configurations are chosen here, not by a library heuristic.

Elementwise (add, mul, relu), row softmax and layer norm: the common kernel-alike ops of a training
step. Each comes with a function that gives its exact launch (grid, threads per block) for a shape
before anything runs, and the launcher uses that very launch. A measurement of one of these kernels
on one GPU therefore carries a launch that wave scaling (Habitat §3.2) can re-count in waves on any
other GPU without guessing the grid, and :func:`kernel_record` turns a timed run into the
:class:`~fxcost.records.KernelRecord` the cost models read.

Launch choices (fp32):

- elementwise: ``BLOCK = 1024`` elements per program, 4 warps (128 threads, 8 elements per thread);
  grid ``ceil(n / 1024)``.
- softmax and layer norm: one program per row, the row padded to the next power of two
  (``ROW``, at most 65,536 elements), warps growing with the row: 1 warp up to 256 elements, then
  ``min(ROW / 256, 16)``; grid ``rows``.

Importing this module imports Triton (set ``TRITON_INTERPRET=1`` first on a machine without a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fxcost.gpus.occupancy import Launch
from fxcost.records import KernelRecord

__all__ = [
    "EW_BLOCK",
    "EW_OPS",
    "MAX_ROW",
    "elementwise",
    "elementwise_launch",
    "kernel_record",
    "layer_norm",
    "row_launch",
    "softmax",
]

EW_BLOCK = 1024
EW_WARPS = 4
MAX_ROW = 65536
EW_OPS = ("add", "mul", "relu")


@triton.jit
def _binary_kernel(x_ptr, y_ptr, out_ptr, n, IS_MUL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * y if IS_MUL else x + y, mask=mask)


@triton.jit
def _relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, cols, ROW: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, ROW)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    e = tl.where(mask, e, 0.0)
    tl.store(out_ptr + row * cols + offs, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, cols, eps, ROW: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, ROW)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / cols
    centred = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * cols + offs, centred * rstd * w + b, mask=mask)


def elementwise_launch(numel: int) -> Launch:
    """The launch of :func:`elementwise` over ``numel`` elements."""
    return Launch(grid=(max(triton.cdiv(numel, EW_BLOCK), 1), 1, 1), block=(32 * EW_WARPS, 1, 1))


def row_launch(rows: int, cols: int) -> Launch:
    """The launch of :func:`softmax` or :func:`layer_norm` over a ``[rows, cols]`` tensor."""
    return Launch(grid=(max(rows, 1), 1, 1), block=(32 * _row_warps(cols), 1, 1))


def _row_block(cols: int) -> int:
    row = triton.next_power_of_2(max(cols, 1))
    if row > MAX_ROW:
        raise ValueError(f"rows of {cols} elements exceed the reference kernels' {MAX_ROW}")
    return row


def _row_warps(cols: int) -> int:
    return min(max(_row_block(cols) // 256, 1), 16)


def elementwise(op: str, x: torch.Tensor, y: torch.Tensor | None = None) -> tuple[torch.Tensor, Launch]:
    """``x + y``, ``x * y`` or ``relu(x)`` of contiguous fp32 tensors of one shape, and its launch."""
    if op not in EW_OPS:
        raise ValueError(f"unknown elementwise op {op!r}; reference kernels: {', '.join(EW_OPS)}")
    _check(x)
    out = torch.empty_like(x)
    launch = elementwise_launch(x.numel())
    if op == "relu":
        _relu_kernel[launch.grid](x, out, x.numel(), BLOCK=EW_BLOCK, num_warps=EW_WARPS)
    else:
        if y is None or y.shape != x.shape:
            raise ValueError(f"{op} needs a second tensor of shape {tuple(x.shape)}")
        _check(y)
        _binary_kernel[launch.grid](
            x, y, out, x.numel(), IS_MUL=op == "mul", BLOCK=EW_BLOCK, num_warps=EW_WARPS
        )
    return out, launch


def softmax(x: torch.Tensor) -> tuple[torch.Tensor, Launch]:
    """Softmax over the last dimension of a contiguous fp32 tensor, and its launch."""
    _check(x)
    cols = x.shape[-1]
    rows = x.numel() // max(cols, 1)
    out = torch.empty_like(x)
    launch = row_launch(rows, cols)
    _softmax_kernel[launch.grid](x, out, cols, ROW=_row_block(cols), num_warps=launch.block[0] // 32)
    return out, launch


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5
) -> tuple[torch.Tensor, Launch]:
    """Layer norm over the last dimension (weight and bias of that size), and its launch."""
    _check(x)
    cols = x.shape[-1]
    if weight.shape != (cols,) or bias.shape != (cols,):
        raise ValueError(f"weight and bias must have shape ({cols},)")
    rows = x.numel() // max(cols, 1)
    out = torch.empty_like(x)
    launch = row_launch(rows, cols)
    _layer_norm_kernel[launch.grid](
        x, weight, bias, out, cols, eps, ROW=_row_block(cols), num_warps=launch.block[0] // 32
    )
    return out, launch


def kernel_record(name: str, launch: Launch, duration_ms: float) -> KernelRecord:
    """The record of one timed reference kernel, as the profiler would give it on the origin GPU."""
    return KernelRecord(name=name, duration_ms=duration_ms, grid=launch.grid, block=launch.block)


def _check(t: torch.Tensor) -> None:
    if t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError(f"reference kernels take contiguous float32 tensors; got {t.dtype}")
