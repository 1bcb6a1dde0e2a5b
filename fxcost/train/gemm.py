"""Fitting the tiled GEMM model's fp32 parameters (:class:`~fxcost.cost_models.heads.sustained.GemmFit`).

Two steps, so that what sets one GPU apart from another is never learned as a shape effect:

1. **Tiles.** The fp32 CUDA-core tiles' shares and the K a tile spends outside its main loop are
   fit, shared by every GPU, to the ``linear`` and ``bmm`` training rows of all the
   GPUs at once, each GPU with a free scale of its rate (the share of its peak it sustains): least
   squares on log times with a soft-L1 loss, robust to the rows a GPU ran slower for reasons no
   shape explains (a P100's TLB misses over long reductions; a P4's long runs in its training rows,
   at a third to a half of the pace of its held-out rows of the same shapes).
2. **GPUs.** The GPUs' shares are then explained by what a spec sheet says
   (:mod:`~fxcost.cost_models.heads.sustained`): one ``watts`` for the clock under the power cap
   (what a GEMM draws per TFLOP/s of peak, against each GPU's power headroom) and one share per
   kernel family, the family's median, at most 1 (no kernel runs above peak); ``watts`` is the value
   on a grid whose shares leave the smallest squared log deviation. Which GPUs' rows show a cap
   (:func:`power_capped`) is kept in the fit's metrics as a check on the power model.

Predictions go through :class:`~fxcost.cost_models.heads.model.Heads` as in use; the predicted time is
the kernel's plus the per-op overhead the measurements carry (``hidden_overhead_ms``). The kernel
floor is the launch floor every kernel model shares, not fit: the data's smallest GEMMs take 30-90
us, most of it the harness's and cuBLAS's host-side dispatch, which an eager step overlaps with the
GPU's work; fit as a floor, 22 us of it became kernel time in every step's GEMMs. Needs scipy
(``pip install 'fxcost[models]'``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads.sustained import FAMILIES, GemmFit, clock_share, kernel_family
from fxcost.cost_models.heads.tiling import Tiling, gemm_kernel_ms
from fxcost.cost_models.roofline import LAUNCH_FLOOR_MS
from fxcost.data.datasets import row_node
from fxcost.gpus import Device, get_device
from fxcost.lowering.nodes import gemm_dims

__all__ = ["FP32_TILES", "GemmRows", "fit_gemm", "fit_sustained", "gemm_rows", "power_capped", "predict_rows"]

FP32_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128), (64, 32), (32, 64), (32, 32))
"""The fp32 CUDA-core tiles cuBLAS's ``*_sgemm_<columns>x<rows>`` kernels use (as rows x columns of
the output): every shape the measured kernels name, 128x128 down to 32x32."""

_FP32_SPLITS = (1, 2, 4, 8, 16, 32)  # split-K: a small output over a long reduction runs on many SMs
_FP32_K_STEP = 8  # the main loop's step (``sgemm_128x128x8``)
_WATTS = np.round(np.exp(np.arange(math.log(4.0), math.log(80.0), 0.01)), 3)  # 1% steps
_SHARPNESS = (5.0, 20.0, 80.0)  # the smooth minimum's sharpness, step by step
_LONG_MS = 10.0  # a kernel long enough for a power cap to bind
_CAP_SIGNATURE = 0.2  # how much slower, in log time, a capped GPU's long kernels run than its short ones
_MIN_SHARE = 1e-3


class GemmRows:
    """Measured GEMM rows as arrays: dims (batch, M, N, K), DRAM bytes, ms, op and GPU per row."""

    def __init__(self, dims: np.ndarray, nbytes: np.ndarray, ms: np.ndarray, ops: np.ndarray,
                 devices: np.ndarray) -> None:  # fmt: skip
        self.dims, self.nbytes, self.ms, self.ops, self.devices = dims, nbytes, ms, ops, devices
        self.gpus: list[str] = sorted(set(devices))
        self.gpu_index = np.array([self.gpus.index(d) for d in devices], dtype=int)
        specs = {g: get_device(g) for g in self.gpus}
        self.peak = np.array([_spec(specs[d], "fp32_tflops") for d in devices])
        self.sms = np.array([_spec(specs[d], "num_sms") for d in devices])
        self.bandwidth = np.array([_spec(specs[d], "bandwidth_gbps") for d in devices])
        self.overhead = np.array([hidden_overhead_ms(specs[d]) for d in devices])

    def __len__(self) -> int:
        return len(self.ms)


def _spec(device: Device, name: str) -> float:
    value = getattr(device, name)
    if value is None:
        raise ValueError(f"{device.name} lacks {name}, which the GEMM model needs")
    return float(value)


def gemm_rows(frame: Any) -> GemmRows:
    """:class:`GemmRows` of a frame of ``linear`` and ``bmm`` data-set rows (canonical ``device``)."""
    nodes = [row_node(r) for r in frame.itertuples(index=False)]
    return GemmRows(
        np.array([gemm_dims(n) for n in nodes], dtype=np.float64).reshape(-1, 4),
        np.array([float(n.bytes or 0) for n in nodes]),
        frame["Latency"].to_numpy(dtype=np.float64),
        frame["OPName"].to_numpy(dtype=object),
        frame["device"].to_numpy(dtype=object),
    )


def predict_rows(
    rows: GemmRows, tiling: Tiling, shares: np.ndarray, sharpness: float | None = None
) -> np.ndarray:
    """Isolated-op ms of ``rows``, each GPU sustaining its share (``shares[i]``: row i's) of its peak
    (``sharpness``: the smooth minimum over the tiles, as :func:`gemm_kernel_ms` takes it)."""
    rates = rows.peak * shares
    kernel = gemm_kernel_ms(
        rows.dims, rows.nbytes, rates, rows.sms, rows.bandwidth, tiling, sharpness=sharpness
    )
    return kernel + rows.overhead


def fit_gemm(rows: GemmRows, test: GemmRows | None = None) -> GemmFit:
    """Fit the tiles to ``rows`` (step 1), then the GPUs' shares (step 2); ``test`` rows only report."""
    from scipy.optimize import least_squares

    tiles = len(FP32_TILES)
    count = len(rows.gpus)

    def unpack(p: np.ndarray) -> tuple[Tiling, np.ndarray]:
        shares = np.clip(1.0 / (1.0 + np.exp(-p[:tiles])), _MIN_SHARE, 1.0)
        tiling = Tiling(FP32_TILES, tuple(map(float, shares)), _FP32_K_STEP, float(np.exp(p[tiles])),
                        _FP32_SPLITS, LAUNCH_FLOOR_MS)  # fmt: skip
        return tiling, np.exp(p[tiles + 1 :])

    def residuals(p: np.ndarray, sharpness: float | None) -> np.ndarray:
        tiling, scale = unpack(p)
        return np.log(predict_rows(rows, tiling, scale[rows.gpu_index], sharpness)) - np.log(rows.ms)

    # The fastest tile is a kink in the loss: gradients find a minimum of a smooth stand-in first,
    # sharper and sharper, then the fastest tile itself. The minimum is one of several of nearly equal
    # loss, and which one the fit stops at can depend on the order of the rows (README, "The fp32
    # tile fit").
    found = np.r_[np.ones(tiles), math.log(8.0), np.zeros(count)]
    for sharpness in (*_SHARPNESS, None):
        found = least_squares(residuals, found, args=(sharpness,), loss="soft_l1", f_scale=0.1).x
    tiling, scale = unpack(found)
    best = max(tiling.shares)  # the best tile's share is 1: the GPU's share says the rest
    tiling = dataclasses.replace(tiling, shares=tuple(s / best for s in tiling.shares))
    measured = {g: float(s * best) for g, s in zip(rows.gpus, scale, strict=True)}
    capped = power_capped(rows, predict_rows(rows, tiling, (scale * best)[rows.gpu_index]))
    watts, families = fit_sustained(measured)
    fit = GemmFit(tiling, watts, families, measured, tuple(rows.gpus))
    metrics: dict[str, Any] = {"power_capped": capped, "train_mape": _mape_by(rows, fit)}
    if test is not None and len(test):
        metrics["test_mape"] = _mape_by(test, fit)
    return dataclasses.replace(fit, metrics=metrics)


def fit_sustained(measured: Mapping[str, float]) -> tuple[float, dict[str, float]]:
    """``watts`` and the kernel families' shares that explain the GPUs' ``measured`` shares best: the
    smallest sum of squared log deviations of each GPU's share from its family's share times its
    clock share (:func:`~fxcost.cost_models.heads.sustained.clock_share`), a family's share the
    median of its GPUs' at their boost clock, at most 1. Of equals (a family of one GPU explains any
    cap of it) the one that caps the fewest measured GPUs, then the largest: where nothing says how
    deep a cap goes, no measured GPU is capped, and every GPU with less power for its peak than the
    least of theirs is. A GPU whose power headroom is unknown is read at its boost clock."""
    devices = {name: get_device(name) for name in measured}
    families: dict[str, str] = {}  # a GPU without a kernel family (AMD) explains nothing here
    for name, device in devices.items():
        family = kernel_family(device)
        if family is not None:
            families[name] = family
    if not families:
        raise ValueError(f"no GPU with CUDA SGEMM kernels to fit the sustained shares on: {sorted(measured)}")
    best: tuple[tuple[float, int, float], float, dict[str, float]] | None = None
    for watts in _WATTS:
        clocks = {n: clock_share(devices[n], float(watts)) for n in families}
        logs = {n: math.log(measured[n] / clocks[n]) for n in families}
        shares = {}
        for family in set(families.values()):
            mine = [logs[n] for n in families if families[n] == family]
            shares[family] = min(1.0, math.exp(float(np.median(mine))))
        deviation = float(sum((logs[n] - math.log(shares[f])) ** 2 for n, f in families.items()))
        # Of equal deviations, the fewest measured GPUs capped, then the largest watts.
        key = (round(deviation, 9), sum(c < 1.0 for c in clocks.values()), -float(watts))
        if best is None or key < best[0]:
            best = (key, float(watts), shares)
    assert best is not None  # the grid is not empty
    return best[1], {f: best[2][f] for f in FAMILIES if f in best[2]}


def power_capped(rows: GemmRows, predicted: np.ndarray) -> list[str]:
    """The GPUs whose rows show a power cap: their long kernels (at least :data:`_LONG_MS`) run slower,
    against ``predicted`` at one share per GPU, than their short ones (0.1-1 ms) by more than
    :data:`_CAP_SIGNATURE` in log time. A cap binds under sustained load only: a kernel timed alone
    after an idle gap starts at the boost clock, and the clock falls as the card reaches its power
    limit. On the shared data: the T4 (0.45) and the P4 (0.57), the two GPUs the power model caps,
    not the P100 (0.11), the V100 (0.04) or the A100 (0.00)."""
    error = np.log(predicted / rows.ms)
    found = []
    for gpu in rows.gpus:
        mine = rows.devices == gpu
        short = mine & (predicted >= 0.1) & (predicted <= 1.0)
        long = mine & (predicted >= _LONG_MS)
        if not short.any() or not long.any():
            continue
        if float(np.median(error[short]) - np.median(error[long])) > _CAP_SIGNATURE:
            found.append(gpu)
    return found


def _mape_by(rows: GemmRows, fit: GemmFit) -> dict[str, dict[str, float]]:
    """MAPE (%) per op and GPU (and over all rows, ``"all"``) of ``fit``'s predictions of ``rows``."""
    shares = np.array([fit.share(get_device(g)) for g in rows.gpus])[rows.gpu_index]
    error = np.abs(predict_rows(rows, fit.tiling, shares) / rows.ms - 1) * 100
    result: dict[str, dict[str, float]] = {}
    for op in sorted(set(rows.ops)):
        mine = rows.ops == op
        per = {g: float(error[mine & (rows.devices == g)].mean()) for g in rows.gpus
               if (mine & (rows.devices == g)).any()}  # fmt: skip
        per["all"] = float(error[mine].mean())
        result[str(op)] = per
    return result
