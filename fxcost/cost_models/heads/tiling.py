"""GEMM kernels as tiles and waves: one model for CUDA-core (fp32) and tensor-core (bf16, fp16, TF32) work.

A library GEMM kernel cuts the output into tiles, one thread block each; the blocks run in waves of
one per SM, each wave at the SM's share of the GPU's sustained rate; the kernel takes the longest of
its waves, its DRAM traffic at the achieved bandwidth, and a launch floor (:func:`gemm_kernel_ms`).
The library picks the tile shape and split of the reduction; the model takes the fastest of a
:class:`Tiling`'s candidates, as a well-tuned heuristic would.

Every term grows with every problem dim (tile counts, waves and padded K are ceilings; the candidates
are fixed), so the fastest candidate never falls as any of B, M, N or K grows: more work never takes
less time, by construction. And a GPU with at least as many SMs, per-SM rate and bandwidth runs every
candidate at least as fast.

Kernel families differ in their :class:`Tiling`: the tensor-core tiles are CUTLASS's defaults with the
share of the rate their operand reuse allows (:data:`TENSOR_TILING`); the CUDA-core (fp32) tiles and
their shares are fit to the shared measurements (:mod:`~fxcost.cost_models.heads.sustained`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.roofline import LAUNCH_FLOOR_MS

__all__ = ["TENSOR_TILING", "Tiling", "gemm_kernel_ms", "pass_ms"]


@dataclass(frozen=True)
class Tiling:
    """How a family of GEMM kernels cuts its work.

    Attributes:
        tiles: output tile shapes (rows x columns) the kernels use.
        shares: the share of an SM's sustained rate each tile is fed at, in (0, 1].
        k_step: elements of K per main-loop iteration; K is padded to it.
        k_overhead: K elements' worth of time a tile spends outside its main loop (its prologue and
            epilogue), at least 0.
        splits: split-K slice counts (one more kernel sums a split's fp32 partials).
        floor_ms: the shortest a kernel of the family takes.
    """

    tiles: tuple[tuple[int, int], ...]
    shares: tuple[float, ...]
    k_step: int = 1
    k_overhead: float = 0.0
    splits: tuple[int, ...] = (1,)
    floor_ms: float = LAUNCH_FLOOR_MS

    def __post_init__(self) -> None:
        if len(self.tiles) != len(self.shares):
            raise ValueError(f"{len(self.tiles)} tiles but {len(self.shares)} shares")
        if not all(0 < s <= 1 for s in self.shares):
            raise ValueError(f"tile shares must lie in (0, 1], got {self.shares}")
        if self.k_overhead < 0 or self.floor_ms < 0 or self.k_step < 1 or min(self.splits) < 1:
            raise ValueError(f"invalid tiling: {self}")


def _reuse_share(tile: tuple[int, int], full: tuple[int, int] = (128, 128)) -> float:
    """The share of the rate a tile is fed at: its operand reuse (FLOPs per element loaded,
    ``tm*tn/(tm+tn)``) over that of the smallest tile run at full rate, at most 1."""
    (tm, tn), (fm, fn) = tile, full
    return min(1.0, (tm * tn / (tm + tn)) / (fm * fn / (fm + fn)))


_TENSOR_TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))

TENSOR_TILING = Tiling(
    tiles=_TENSOR_TILES,
    shares=tuple(_reuse_share(t) for t in _TENSOR_TILES),
    k_step=32,
    splits=(1, 2, 4, 8, 16),
)
"""Tensor-core GEMM kernels: CUTLASS's default tensor-core tiles for sm70-sm90, which cuBLAS and
cuDNN kernels share (256x128 down to 64x64; 128x128 is the smallest run at full rate on sm80 and
sm90), split-K up to 16 slices, K padded to the 32-element pipeline stage."""


def gemm_kernel_ms(
    dims: np.ndarray,
    nbytes: np.ndarray,
    sustained_tflops: np.ndarray,
    sms: np.ndarray | float,
    bandwidth_gbps: np.ndarray | float,
    tiling: Tiling,
    load_shares: np.ndarray | float = 1.0,
    sharpness: float | None = None,
) -> np.ndarray:
    """Kernel time (ms) of GEMMs: ``dims`` rows of (batch, M, N, K), ``nbytes`` their DRAM bytes, each at
    its ``sustained_tflops`` on a GPU of ``sms`` SMs and ``bandwidth_gbps`` achieved bandwidth (per row,
    so that one call prices many GPUs); the fastest of ``tiling``'s tiles and splits, and never less than
    the work at the share of the rate its operand loads allow (``load_shares``, a bound apart from the
    tiles: doubling a dim, which at most doubles the share, never gives a shorter time).

    ``sharpness``: instead of the fastest candidate, a smooth minimum of their log times at that
    sharpness (for fitting the tiles by gradients; prediction takes the fastest)."""
    sms = np.asarray(sms, dtype=np.float64)
    bandwidth = np.asarray(bandwidth_gbps, dtype=np.float64) * 1e6  # bytes per ms
    rates = np.asarray(sustained_tflops, dtype=np.float64) * 1e9  # FLOPs per ms
    b, m, n, k = (dims[:, i].astype(np.float64) for i in range(4))
    per_sm = rates / sms
    floor = tiling.floor_ms
    best = np.full(len(dims), np.inf)
    candidates = []
    for (tm, tn), share in zip(tiling.tiles, tiling.shares, strict=True):
        tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
        for split in tiling.splits:
            slice_k = np.ceil(np.ceil(k / split) / tiling.k_step) * tiling.k_step
            waves = np.ceil(tiles * split / sms)
            compute = waves * (2.0 * tm * tn) * (slice_k + tiling.k_overhead) / (per_sm * share)
            partials = 0.0 if split == 1 else 2.0 * split * b * m * n * 4  # fp32, written and read
            ms = np.maximum(np.maximum(compute, (nbytes + partials) / bandwidth), floor)
            if split > 1:  # the reduction of the partial sums is a kernel of its own
                ms = ms + floor
            np.fmin(best, ms, out=best)
            if sharpness is not None:
                candidates.append(np.log(ms))
    if sharpness is not None:  # the soft minimum, in log time: -log(sum(exp(-s * (log t - log best)))) / s
        logs = np.array(candidates) - np.log(best)
        best = best * np.exp(-np.log(np.exp(-sharpness * logs).sum(axis=0)) / sharpness)
    loads = 2.0 * b * m * n * k / (rates * load_shares)
    return np.maximum(best, loads)


def pass_ms(nbytes: np.ndarray, bandwidth_gbps: np.ndarray | float) -> np.ndarray:
    """Kernel time (ms) of memory passes moving ``nbytes`` at an achieved bandwidth."""
    bandwidth = np.asarray(bandwidth_gbps, dtype=np.float64) * 1e6
    return np.maximum(np.asarray(nbytes, dtype=np.float64) / bandwidth, LAUNCH_FLOOR_MS)
