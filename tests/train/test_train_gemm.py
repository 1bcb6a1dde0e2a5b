"""Fitting the tiled GEMM model: it recovers a known model from its own times, and the GPU step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fxcost.cost_models.heads.sustained import GemmFit, clock_share, shipped_gemm_fit
from fxcost.cost_models.heads.tiling import Tiling
from fxcost.cost_models.roofline import LAUNCH_FLOOR_MS
from fxcost.gpus import get_device
from fxcost.gpus.power import power_headroom
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
    and ``watts`` says by how much; no family is credited with more than its peak."""
    t4, v100 = get_device("T4"), get_device("V100-PCIE-32GB")
    measured = {"T4": 0.95 * clock_share(t4, 20.0), "V100-PCIE-32GB": 0.95, "A100-PCIE-40GB": 1.2}
    watts, families = fit_sustained(measured)
    assert watts == pytest.approx(20.0, rel=0.01)
    assert families["volta"] == pytest.approx(0.95, rel=0.01)
    assert families["ampere"] == 1.0  # 1.2 measured: a family's share is at most its peak
    assert clock_share(v100, watts) == 1.0  # a 250 W V100 has the power for its boost clock
    # The A100 PCIe (250 W on 7 nm) has the power too: its share is its kernels'.
    _, families = fit_sustained({**measured, "A100-PCIE-40GB": 0.8})
    assert families["ampere"] == pytest.approx(0.8)


def test_a_power_headroom_below_watts_caps_the_clock_in_proportion() -> None:
    t4, p4, a100 = (get_device(g) for g in ("T4", "P4", "A100-PCIE-40GB"))
    assert power_headroom(t4) == pytest.approx(70 / (8.1 * 0.75))  # 70 W, 8.1 TFLOP/s, 12FFN
    assert clock_share(t4, 2 * power_headroom(t4)) == pytest.approx(0.5)
    assert clock_share(p4, 10.0) == 1.0  # 13.6 W per TFLOP/s: more than 10
    assert clock_share(a100, 30.0) == 1.0  # 250 W on 7 nm: 36.6
    unknown = dataclasses.replace(t4, tdp_w=None)
    assert power_headroom(unknown) is None and clock_share(unknown, 30.0) == 1.0


def test_a_gpu_left_out_takes_its_share_from_the_other_four_within_11_percent() -> None:
    """The shares the shared data gives the five training GPUs (the shipped fit's): each predicted
    from the other four (its family's share through the power model) comes out within 11% (by base
    clocks, up to 35% off: the P4's 75 W and the T4's 70 W cap their clocks, which their base clocks
    do not say)."""
    measured = dict(shipped_gemm_fit().measured_shares)
    assert len(measured) == 5
    tiling = Tiling(FP32_TILES, (1.0,) * len(FP32_TILES), 8, 10.0, (1,), 0.02)
    for gpu, share in measured.items():
        watts, families = fit_sustained({g: s for g, s in measured.items() if g != gpu})
        predicted = GemmFit(tiling, watts, families)
        assert predicted.share(get_device(gpu)) == pytest.approx(share, rel=0.11), gpu


def test_a_power_cap_shows_as_long_kernels_slower_than_short_ones() -> None:
    rows = _rows(["T4", "V100-PCIE-32GB"], count=400)
    tiling = Tiling(FP32_TILES, (1.0,) * len(FP32_TILES), 8, 10.0, (1,), 0.02)
    predicted = predict_rows(rows, tiling, np.full(len(rows), 0.8))
    capped = (rows.devices == "T4") & (predicted >= 10.0)
    rows.ms = np.where(capped, 1.6 * predicted, predicted)  # the T4's long kernels at 0.62 of its pace
    assert power_capped(rows, predicted) == ["T4"]
    rows.ms = np.where(capped, 1.2 * predicted, predicted)  # 0.18 in log time: below the signature
    assert power_capped(rows, predicted) == []


def test_a_fit_without_cuda_kernels_says_so() -> None:
    with pytest.raises(ValueError, match="no GPU with CUDA SGEMM kernels"):
        fit_sustained({"MI250": 0.8})


def test_with_no_gpu_below_the_cap_watts_is_the_least_headroom_measured() -> None:
    """No GPU's share says how deep a cap goes: ``watts`` caps none of the measured GPUs, and every GPU
    with less power for its peak than the least of theirs."""
    measured = {"V100-PCIE-32GB": 0.93, "A100-PCIE-40GB": 0.83, "P100-PCIE-16GB": 0.75}
    watts, _ = fit_sustained(measured)
    least = min(power_headroom(get_device(g)) for g in measured)  # the V100's 23.8
    assert watts == pytest.approx(least, rel=0.011) and watts <= least
    assert all(clock_share(get_device(g), watts) == 1.0 for g in measured)
    assert clock_share(get_device("T4"), watts) < 0.5
