"""Fitting the tiled GEMM model: it recovers a known model from its own times, and the GPU step."""

from __future__ import annotations

import numpy as np
import pytest

from fxcost.cost_models.heads.sustained import clock_share
from fxcost.cost_models.heads.tiling import Tiling
from fxcost.cost_models.roofline import LAUNCH_FLOOR_MS
from fxcost.gpus import get_device
from fxcost.train.gemm import FP32_TILES, GemmRows, fit_gemm, fit_sustained, power_capped, predict_rows

pytest.importorskip("scipy")


def _rows(devices: list[str], seed: int = 0, count: int = 150) -> GemmRows:
    rng = np.random.default_rng(seed)
    dims = np.c_[rng.integers(1, 32, count), rng.integers(1, 4096, (count, 3))].astype(float)
    per = [(d, row) for d in devices for row in dims]
    dims = np.array([row for _, row in per])
    nbytes = 4.0 * dims[:, 0] * (dims[:, 1] * dims[:, 3] + dims[:, 3] * dims[:, 2] + dims[:, 1] * dims[:, 2])
    names = np.array([d for d, _ in per], dtype=object)
    return GemmRows(dims, nbytes, np.ones(len(dims)), np.full(len(dims), "bmm", dtype=object), names)


def test_the_fit_recovers_a_model_from_its_own_times() -> None:
    shares = (1.0, 0.7, 0.9, 0.6, 0.35, 0.55, 0.3, 0.35, 0.2)
    truth = Tiling(FP32_TILES, shares, 8, 12.0, (1, 2, 4, 8, 16, 32), LAUNCH_FLOOR_MS)
    rows = _rows(["P4", "T4", "V100-PCIE-32GB"])
    gpu_share = {"P4": 0.6, "T4": 0.5, "V100-PCIE-32GB": 0.9}
    rows.ms = predict_rows(rows, truth, np.array([gpu_share[g] for g in rows.gpus])[rows.gpu_index])
    fit = fit_gemm(rows)
    shares_of = np.array([fit.measured_shares[g] for g in rows.gpus])[rows.gpu_index]
    again = predict_rows(rows, fit.tiling, shares_of)
    assert np.median(np.abs(again / rows.ms - 1)) < 0.02
    assert max(fit.tiling.shares) == pytest.approx(1.0)
    for gpu, share in gpu_share.items():
        assert fit.measured_shares[gpu] == pytest.approx(share, rel=0.1)
    assert fit.metrics["train_mape"]["bmm"]["all"] < 5


def test_the_gpu_step_explains_a_capped_clock_and_a_family() -> None:
    """A T4 at half its peak beside a V100 at 95%: the same kernels (volta), so the T4's clock is capped
    and kappa says by how much; no family is credited with more than its peak."""
    t4, v100 = get_device("T4"), get_device("V100-PCIE-32GB")
    measured = {"T4": 0.95 * clock_share(t4, 1.6), "V100-PCIE-32GB": 0.95, "A100-PCIE-40GB": 1.2}
    kappa, families = fit_sustained(measured, capped={"T4"})
    assert kappa == pytest.approx(1.6, abs=0.03)
    assert families["volta"] == pytest.approx(0.95, rel=0.02)
    assert families["ampere"] == 1.0  # 1.2 measured: a family's share is at most its peak
    assert clock_share(v100, kappa) == 1.0
    # A GPU whose rows show no cap keeps its share as its kernels', whatever its base clock says.
    _, families = fit_sustained({**measured, "A100-PCIE-40GB": 0.8}, capped={"T4"})
    assert families["ampere"] == pytest.approx(0.8)
    _, capped_too = fit_sustained({**measured, "A100-PCIE-40GB": 0.8}, capped={"T4", "A100-PCIE-40GB"})
    assert capped_too["ampere"] > 0.9  # read as capped at 0.87 of its boost clock (kappa 1.6)


def test_a_power_cap_shows_as_long_kernels_slower_than_short_ones() -> None:
    rows = _rows(["T4", "V100-PCIE-32GB"], count=400)
    tiling = Tiling(FP32_TILES, (1.0,) * len(FP32_TILES), 8, 10.0, (1,), 0.02)
    predicted = predict_rows(rows, tiling, np.full(len(rows), 0.8))
    capped = (rows.devices == "T4") & (predicted >= 10.0)
    rows.ms = np.where(capped, 1.6 * predicted, predicted)  # the T4's long kernels at 0.62 of its pace
    assert power_capped(rows, predicted) == ["T4"]
    # Below the base clock (the T4's is 0.37 of its boost clock) a slowdown is heat, not the cap.
    rows.ms = np.where(capped, 3.0 * predicted, predicted)
    assert power_capped(rows, predicted) == []


def test_with_no_capped_gpu_kappa_leaves_the_uncapped_ones_at_their_boost_clock() -> None:
    measured = {"V100-PCIE-32GB": 0.93, "A100-PCIE-40GB": 0.83, "P100-PCIE-16GB": 0.75}
    kappa, _ = fit_sustained(measured, capped=())
    a100 = get_device("A100-PCIE-40GB")
    assert clock_share(a100, kappa) == 1.0
    assert kappa == pytest.approx(a100.boost_clock_mhz / a100.base_clock_mhz, abs=0.03)
