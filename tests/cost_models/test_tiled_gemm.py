"""The tiled GEMM model on CUDA cores: monotone in every dim, in GPU order, and its sustained shares."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

import fxcost
from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads import default_heads
from fxcost.cost_models.heads.sustained import GemmFit, clock_share, kernel_family, shipped_gemm_fit
from fxcost.cost_models.heads.tensor_core import TiledGemms
from fxcost.cost_models.heads.tiling import TENSOR_TILING, Tiling, gemm_kernel_ms
from fxcost.cost_models.interface import NodeBatch
from fxcost.gpus import get_device
from fxcost.gpus.order import comparable, weaker_than
from fxcost.lowering.nodes import gemm_node

GPUS = ("P4", "T4", "V100-PCIE-32GB", "A100-PCIE-40GB", "L4", "H100-SXM", "MI250")


def _fp32_ms(dims: list[tuple[int, int, int, int]], gpu: str) -> np.ndarray:
    nodes = [gemm_node("bmm" if b > 1 else "linear", b, m, n, k) for b, m, n, k in dims]
    return default_heads().predict(NodeBatch.of(nodes), get_device(gpu))


@pytest.mark.parametrize("gpu", GPUS)
def test_more_work_never_takes_less_time_along_any_dim(gpu: str) -> None:
    """Doubling any of B, M, N or K of an fp32 GEMM never gives a shorter prediction: the tiles and
    waves are ceilings of the dims and the fastest of fixed candidates (a weight gradient carries the
    batch in K, which the MLP heads' batch tables did not cover)."""
    sizes = (1, 3, 16, 100, 768, 3000)
    base = list(itertools.product((1, 4), sizes, sizes, sizes))
    ms = _fp32_ms(base, gpu)
    assert np.all(np.isfinite(ms))
    for axis in range(4):
        doubled = [tuple(d * 2 if i == axis else d for i, d in enumerate(dims)) for dims in base]
        grown = _fp32_ms(doubled, gpu)  # type: ignore[arg-type]
        assert np.all(grown >= ms * (1 - 1e-12)), (gpu, "BMNK"[axis])


def test_a_stronger_gpu_is_never_slower_on_fp32_gemms() -> None:
    dims = [(b, m, n, k) for b in (1, 8) for m in (1, 64, 4096) for n in (64, 1000, 8192) for k in (32, 4096)]
    ms = {gpu: _fp32_ms(dims, gpu.name) for gpu in comparable()}
    for gpu, mine in ms.items():
        for weak in weaker_than(gpu):
            assert np.all(mine <= ms[weak] * (1 + 1e-12)), (gpu.name, weak.name)


def test_nothing_runs_faster_than_the_fp32_peak_allows() -> None:
    for name in GPUS:
        gpu = get_device(name)
        dims = [(1, m, n, k) for m in (128, 4096, 16384) for n in (128, 8192) for k in (64, 8192)]
        kernel = _fp32_ms(dims, name) - hidden_overhead_ms(gpu)
        flops = np.array([2.0 * math.prod(d) for d in dims])
        assert np.all(kernel >= flops / (gpu.fp32_tflops * 1e9) * (1 - 1e-9)), name


def test_the_clock_under_the_power_cap() -> None:
    fit = shipped_gemm_fit()
    names = ("T4", "V100-PCIE-32GB", "L4", "H100-SXM", "A100-SXM4-80GB")
    t4, v100, l4, h100, a100 = (get_device(g) for g in names)
    assert 10 < fit.watts < 30
    assert clock_share(t4, fit.watts) < 0.7  # a 70 W card: capped
    assert clock_share(v100, fit.watts) == 1.0  # 250 W: the boost clock
    # A 72 W L4 sustains less than half the 30 TFLOP/s its boost clock gives on large fp32 GEMMs,
    # below the 16 of an A100, whose 19.5 take 400 W.
    assert fit.share(l4) < 0.5 and fit.share(l4) * l4.fp32_tflops < fit.share(a100) * a100.fp32_tflops
    assert clock_share(h100, fit.watts) == 1.0 and clock_share(a100, fit.watts) == 1.0


def test_tensor_core_work_runs_at_the_tensor_clock_where_a_source_gives_it() -> None:
    fit = shipped_gemm_fit()
    gemms = TiledGemms(fit)
    h100, capped, l4 = (get_device(g) for g in ("H100-SXM", "H100-SXM-96GB-HBM2e", "L4"))
    family = fit.family_share("ampere")
    assert fit.share(h100, tensor=True) == pytest.approx(family)  # its peaks are quoted at its tensor clock
    assert fit.share(capped) == pytest.approx(family)  # fp32 CUDA-core GEMMs: the FP32 power cap, none
    assert fit.share(capped, tensor=True) == pytest.approx(family * 500 / 700)  # the H100 SXM's watts
    assert gemms.sustained_tflops(capped, "tf32") == pytest.approx(494.7 * family * 500 / 700)
    # No tensor clock known: tensor work at the FP32 clock share, as before.
    assert fit.share(l4, tensor=True) == fit.share(l4)


def test_kernel_families_and_their_fallback() -> None:
    assert [kernel_family(get_device(g)) for g in ("P100-PCIE-16GB", "T4", "A100-PCIE-40GB", "H100-SXM")] == [
        "maxwell", "volta", "ampere", "ampere"
    ]  # fmt: skip
    assert kernel_family(get_device("MI250")) is None
    # A device file's architecture-specific capability ("9.0a") is Hopper's, not a crash.
    assert kernel_family(dataclasses.replace(get_device("H100-SXM"), compute_capability="9.0a")) == "ampere"
    tiling = Tiling(((128, 128),), (1.0,))
    fit = GemmFit(tiling, 1.5, {"volta": 0.9, "ampere": 0.8})
    assert fit.family_share("maxwell") == 0.9  # nothing older measured: the oldest after it
    assert fit.family_share("ampere") == 0.8
    assert GemmFit(tiling, 1.5, {"maxwell": 0.6, "volta": 0.9}).family_share("ampere") == 0.9  # newest before
    assert fit.family_share(None) == 0.8  # an unknown family: the newest measured


def test_a_gpu_measured_in_the_fit_keeps_its_own_share() -> None:
    fit = shipped_gemm_fit()
    for name, share in fit.measured_shares.items():
        assert fit.share(get_device(name)) == share
    assert set(fit.devices) == set(fit.measured_shares)
    assert not {"H100-SXM", "L4", "A100-PCIE-80GB", "A100-SXM4-80GB"} & set(fit.devices)  # held out


def test_the_fit_round_trips_through_its_file(tmp_path) -> None:
    fit = shipped_gemm_fit()
    path = fit.save(tmp_path)
    from fxcost.cost_models.heads.sustained import load_gemm_fit

    again = load_gemm_fit(tmp_path)
    assert path.name == "gemm.json"
    assert again.tiling == fit.tiling and again.watts == fit.watts
    assert dict(again.family_shares) == dict(fit.family_shares)
    with pytest.raises(FileNotFoundError, match="fxcost train"):
        load_gemm_fit(tmp_path / "nothing")


def test_a_tiling_refuses_shares_outside_its_range() -> None:
    with pytest.raises(ValueError, match="shares"):
        Tiling(((128, 128),), (1.5,))
    with pytest.raises(ValueError, match="tiles"):
        Tiling(((128, 128), (64, 64)), (1.0,))


def test_the_smooth_minimum_approaches_the_fastest_candidate() -> None:
    dims = np.array([[1, 4096, 4096, 4096], [1, 100, 3000, 64], [16, 64, 64, 64]], dtype=float)
    nbytes = np.array([2.0e8, 1.3e6, 4.0e5])
    args = (dims, nbytes, np.full(3, 100.0), 100.0, 2000.0, TENSOR_TILING)
    hard = gemm_kernel_ms(*args)
    assert np.all(gemm_kernel_ms(*args, sharpness=5.0) <= hard)
    assert gemm_kernel_ms(*args, sharpness=500.0) == pytest.approx(hard, rel=0.02)


def test_a_72_watt_l4_never_beats_an_a100_on_a_large_fp32_training_step() -> None:
    """The L4's datasheet gives it 30 TFLOP/s at a 2040 MHz boost clock, which 72 W cannot feed: a
    2048-wide MLP training step at batch 256 had been priced 1.6x faster on it than on an A100."""
    mlp = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048))
    x = torch.randn(256, 2048)
    l4, a100 = (fxcost.cost(mlp, (x,), device=d).ms for d in ("L4", "A100-SXM4-80GB"))
    assert l4 > 1.2 * a100
