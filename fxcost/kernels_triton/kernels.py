"""Triton microbenchmark kernels with their launchers; each returns a result checkable against torch.

Importing this module imports Triton. On a machine without a GPU set ``TRITON_INTERPRET=1`` before the
import: the kernels then run on CPU tensors under Triton's interpreter (correct but slow; timings mean
nothing there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "BLOCK",
    "DOT_BLOCK",
    "copy",
    "dot",
    "dot_flops",
    "empty",
    "fma",
    "fma_flops",
    "interpreted",
    "l2_read",
    "l2_read_bytes",
    "triad",
]

BLOCK = 1024  # elements per program; a multiple of every warp layout Triton picks
DOT_BLOCK = (128, 128, 32)  # (BM, BN, BK) of the dot kernel: a tile shape tensor cores run at full rate
FMA_CHAINS = 4  # independent accumulators per element, so FMA latency does not bound throughput


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _triad_kernel(a_ptr, b_ptr, c_ptr, s, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    b = tl.load(b_ptr + offs, mask=mask)
    c = tl.load(c_ptr + offs, mask=mask)
    tl.store(a_ptr + offs, b + s * c, mask=mask)


@triton.jit
def _fma_kernel(x_ptr, y_ptr, n, iters, mul, add, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    # Four independent chains, each one FMA per iteration; x stays in registers throughout.
    a0 = x
    a1 = x + 1.0
    a2 = x + 2.0
    a3 = x + 3.0
    for _ in range(iters):
        a0 = a0 * mul + add
        a1 = a1 * mul + add
        a2 = a2 * mul + add
        a3 = a3 * mul + add
    tl.store(y_ptr + offs, a0 + a1 + a2 + a3, mask=mask)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # One BM x BN tile of c = a @ b per program (row-major, sizes multiples of the tile: no masks),
    # accumulated in fp32 from tl.dot on the inputs' own type (fp16/bf16: the tensor cores).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    inner = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rows[:, None] * K + (k + inner)[None, :])
        b = tl.load(b_ptr + (k + inner)[:, None] * N + cols[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc)


@triton.jit
def _empty_kernel(x_ptr):
    pass


@triton.jit
def _l2_read_kernel(x_ptr, y_ptr, x_blocks, reps, BLOCK: tl.constexpr):
    # Program p sums blocks p, p+1, ..., p+reps-1 (mod x_blocks) of a small x: after the first pass every
    # read hits L2. The address changes every iteration, so the loads cannot be hoisted out of the loop.
    pid = tl.program_id(0)
    lane = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(reps):
        block = (pid + i) % x_blocks
        acc += tl.load(x_ptr + block * BLOCK + lane).to(tl.float32)
    tl.store(y_ptr + pid * BLOCK + lane, acc)


def interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return type(_copy_kernel).__name__ == "InterpretedFunction"


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK),)


def _check_same(*tensors: torch.Tensor) -> None:
    first = tensors[0]
    for t in tensors:
        if not t.is_contiguous() or t.shape != first.shape or t.device != first.device:
            raise ValueError("expected contiguous tensors of one shape on one device")


def copy(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = x`` (moves ``2 * x.nbytes`` bytes)."""
    _check_same(x, out)
    _copy_kernel[_grid(x.numel())](x, out, x.numel(), BLOCK=BLOCK)
    return out


def triad(b: torch.Tensor, c: torch.Tensor, s: float, out: torch.Tensor) -> torch.Tensor:
    """STREAM triad ``out = b + s * c`` (moves ``3 * b.nbytes`` bytes)."""
    _check_same(b, c, out)
    _triad_kernel[_grid(b.numel())](out, b, c, s, b.numel(), BLOCK=BLOCK)
    return out


def fma(
    x: torch.Tensor, out: torch.Tensor, iters: int, mul: float = 0.999, add: float = 0.001
) -> torch.Tensor:
    """Per element, ``iters`` FMAs on each of four chains from ``x, x+1, x+2, x+3``; ``out`` is their sum.

    ``mul`` below 1 keeps the chains bounded (they converge to ``add / (1 - mul)``).
    """
    _check_same(x, out)
    if x.dtype != torch.float32:
        raise ValueError(f"fma measures fp32 throughput; got {x.dtype}")
    _fma_kernel[_grid(x.numel())](x, out, x.numel(), iters, mul, add, BLOCK=BLOCK)
    return out


def fma_flops(elements: int, iters: int) -> int:
    """Floating-point operations of :func:`fma` (an FMA counts as two)."""
    return 2 * FMA_CHAINS * iters * elements


def dot(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = a @ b`` for ``[M, K] @ [K, N]`` with M, N and K multiples of :data:`DOT_BLOCK`'s tiles;
    ``a`` and ``b`` fp16, bf16 or fp32 (of one dtype), ``out`` fp32.

    Under the interpreter bf16 operands are multiplied wrongly (a Triton limitation): check bf16 on a GPU.
    """
    bm, bn, bk = DOT_BLOCK
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or out.shape != (m, n) or m % bm or n % bn or k % bk:
        raise ValueError(
            f"dot needs [M, K] @ [K, N] into [M, N] with M % {bm}, N % {bn}, K % {bk} == 0; "
            f"got {tuple(a.shape)} @ {tuple(b.shape)} into {tuple(out.shape)}"
        )
    if a.dtype != b.dtype or out.dtype != torch.float32:
        raise ValueError(
            f"dot takes a and b of one dtype and an fp32 out; got {a.dtype}, {b.dtype}, {out.dtype}"
        )
    for t in (a, b, out):
        if not t.is_contiguous() or t.device != a.device:
            raise ValueError("dot takes contiguous tensors on one device")
    _dot_kernel[(m // bm, n // bn)](a, b, out, m, n, k, BM=bm, BN=bn, BK=bk, num_warps=4)
    return out


def dot_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of :func:`dot` (a multiply-add counts as two)."""
    return 2 * m * n * k


def empty(x: torch.Tensor) -> None:
    """Launch one program that does nothing (``x`` only tells Triton the device)."""
    _empty_kernel[(1,)](x)


def l2_read(x: torch.Tensor, out: torch.Tensor, reps: int) -> torch.Tensor:
    """Program ``p`` of ``out.numel() // BLOCK`` writes the sum of ``reps`` consecutive blocks of ``x``.

    Block ``p`` of ``out`` is ``sum(xb[(p + i) % nb] for i in range(reps))`` with ``xb = x.view(nb, BLOCK)``.
    ``x`` is meant to fit in L2 so that the re-reads measure L2 bandwidth.
    """
    if x.numel() % BLOCK or out.numel() % BLOCK or not (x.is_contiguous() and out.is_contiguous()):
        raise ValueError(f"x and out must be contiguous with a multiple of {BLOCK} elements")
    if out.dtype != torch.float32 or x.device != out.device:
        raise ValueError("out must be fp32 on x's device")
    _l2_read_kernel[(out.numel() // BLOCK,)](x, out, x.numel() // BLOCK, reps, BLOCK=BLOCK)
    return out


def l2_read_bytes(x: torch.Tensor, out: torch.Tensor, reps: int) -> int:
    """Bytes :func:`l2_read` moves: ``reps`` blocks of ``x`` read and one block written per program."""
    programs = out.numel() // BLOCK
    return programs * BLOCK * (reps * x.element_size() + out.element_size())
