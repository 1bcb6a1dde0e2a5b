"""The fallbacks of a GPU nobody calibrated, and leave-one-out's uncalibrated GPUs."""

from __future__ import annotations

import statistics

import pytest

from fxcost.gpus import (
    BANDWIDTH_FRACTIONS,
    all_devices,
    bandwidth_fraction,
    get_device,
    memory_family,
)
from fxcost.gpus.calibration import uncalibrated
from fxcost.gpus.fallbacks import DEFAULT_BANDWIDTH_FRACTION


def _share(device) -> float:
    return device.achieved_bandwidth_gbps / device.mem_bandwidth_gbps


def test_fractions_are_the_calibrated_gpus_means_by_memory_technology() -> None:
    calibrated = [d for d in all_devices() if d.achieved_bandwidth_gbps is not None]
    assert len(calibrated) == 5
    for family, fraction in BANDWIDTH_FRACTIONS.items():
        mine = [_share(d) for d in calibrated if memory_family(d.memory_type) == family]
        assert mine, family
        assert statistics.fmean(mine) == pytest.approx(fraction, abs=5e-4)
    assert statistics.fmean(map(_share, calibrated)) == pytest.approx(DEFAULT_BANDWIDTH_FRACTION, abs=5e-4)


@pytest.mark.parametrize(
    ("memory", "family"),
    [("HBM2", "HBM"), ("HBM3e", "HBM"), ("GDDR6X", "GDDR"), ("gddr5", "GDDR"), ("LPDDR5X", None), ("", None)],
)
def test_memory_family(memory: str, family: str | None) -> None:
    assert memory_family(memory) == family


def test_an_uncalibrated_gpu_takes_its_technology_s_share() -> None:
    h100, l4 = get_device("H100-SXM"), get_device("L4")
    assert h100.bandwidth_gbps == pytest.approx(3350 * BANDWIDTH_FRACTIONS["HBM"])
    assert l4.bandwidth_gbps == pytest.approx(300 * BANDWIDTH_FRACTIONS["GDDR"])
    assert bandwidth_fraction("LPDDR5X") == DEFAULT_BANDWIDTH_FRACTION
    assert all(memory_family(d.memory_type) for d in all_devices())  # every GPU of the table has one


def test_uncalibrated_takes_the_fallbacks_of_the_other_gpus_alone() -> None:
    v100, p4 = get_device("V100-PCIE-32GB"), get_device("P4")
    hbm = [get_device(n) for n in ("P100-PCIE-16GB", "A100-PCIE-40GB")]  # the other calibrated HBM GPUs
    gone = ("V100-PCIE-32GB", "P4")
    others = [d for d in all_devices() if d.kernel_overhead_ms is not None and d.name not in gone]
    with uncalibrated(["V100-PCIE-32GB", "Tesla P4"]) as (v, p):
        assert get_device("V100-PCIE-32GB") is v  # every lookup by name sees it
        assert v.bandwidth_gbps == pytest.approx(900 * statistics.fmean(map(_share, hbm)))
        assert p.bandwidth_gbps == pytest.approx(192 * _share(get_device("T4")))  # the one GDDR GPU left
        assert v.overhead_ms == statistics.median(d.kernel_overhead_ms for d in others)
        assert v.floor_ms == statistics.median(d.launch_floor_ms for d in others)
        assert v.bandwidth_gbps != v100.bandwidth_gbps and "uncalibrated" in v.source_of("bandwidth_gbps")
    assert get_device("V100-PCIE-32GB") is v100 and get_device("P4") is p4  # restored


def test_uncalibrated_restores_the_table_when_the_block_raises() -> None:
    t4 = get_device("T4")
    with pytest.raises(RuntimeError), uncalibrated(["T4"]):
        raise RuntimeError
    assert get_device("T4") is t4
    with uncalibrated([]) as swapped:
        assert swapped == []
