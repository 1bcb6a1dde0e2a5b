"""The fallbacks of a GPU nobody calibrated, and leave-one-out's uncalibrated GPUs."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

import fxcost
from fxcost.gpus import Device, all_devices, get_device
from fxcost.gpus.fallbacks import (
    BANDWIDTH_FRACTIONS,
    DEFAULT_BANDWIDTH_FRACTION,
    bandwidth_fraction,
    memory_family,
)
from fxcost.gpus.holdout import uncalibrated, uncalibrated_device


def _share(device: Device) -> float:
    return device.achieved_bandwidth_gbps / device.mem_bandwidth_gbps  # type: ignore[operator]


def _calibrated(*but: str) -> list[Device]:
    return [d for d in all_devices() if d.achieved_bandwidth_gbps is not None and d.name not in but]


def test_fractions_are_the_calibrated_gpus_means_by_memory_controller() -> None:
    calibrated = _calibrated()
    assert len(calibrated) == 5
    for family, fraction in BANDWIDTH_FRACTIONS.items():
        mine = [_share(d) for d in calibrated if memory_family(d.memory_type, d.compute_capability) == family]
        assert mine, family
        assert statistics.fmean(mine) == pytest.approx(fraction, abs=5e-4)
    assert statistics.fmean(map(_share, calibrated)) == pytest.approx(DEFAULT_BANDWIDTH_FRACTION, abs=5e-4)


@pytest.mark.parametrize(
    ("memory", "capability", "family"),
    [
        ("HBM2", "7.0", "HBM"),
        ("HBM3e", "9.0a", "HBM"),
        ("HBM2", "6.0", "HBM-Pascal"),
        ("HBM2e", None, None),
        ("HBM3", "NA", None),
        ("HBM2", "", None),
        ("GDDR6X", "8.9", "GDDR"),
        ("gddr5", None, "GDDR"),
        ("LPDDR5X", "8.7", None),
        ("", None, None),
    ],
)
def test_memory_family(memory: str, capability: str | None, family: str | None) -> None:
    """HBM behind NVIDIA's controllers before Volta is its own class; another vendor's HBM (no compute
    capability, or one that does not read as a number) has none."""
    assert memory_family(memory, capability) == family


def test_a_gpu_nobody_calibrated_takes_its_controller_class_s_share() -> None:
    h100, l4 = get_device("H100-SXM"), get_device("L4")
    assert h100.bandwidth_gbps == pytest.approx(3350 * BANDWIDTH_FRACTIONS["HBM"])
    assert l4.bandwidth_gbps == pytest.approx(300 * BANDWIDTH_FRACTIONS["GDDR"])
    assert "calibrated GDDR GPUs" in l4.source_of("bandwidth_gbps")
    assert bandwidth_fraction("LPDDR5X") == DEFAULT_BANDWIDTH_FRACTION
    for d in all_devices():  # every NVIDIA GPU of the table has a class; the AMD parts take the mean
        family = memory_family(d.memory_type, d.compute_capability)
        assert (family is None) == (d.vendor != "NVIDIA"), d.name
    mi250 = get_device("MI250")
    assert mi250.bandwidth_gbps == pytest.approx(mi250.mem_bandwidth_gbps * DEFAULT_BANDWIDTH_FRACTION)
    p100_uncalibrated = dataclasses.replace(get_device("P100-PCIE-16GB"), achieved_bandwidth_gbps=None)
    assert p100_uncalibrated.bandwidth_gbps == pytest.approx(732 * BANDWIDTH_FRACTIONS["HBM-Pascal"])


def test_an_uncalibrated_gpu_has_the_other_gpus_fallbacks_alone() -> None:
    v100 = uncalibrated_device(get_device("V100-PCIE-32GB"), without=["P4"])
    p4 = uncalibrated_device(get_device("P4"), without=["V100-PCIE-32GB"])
    hbm = [get_device("A100-PCIE-40GB")]  # the other calibrated GPU of HBM behind a Volta-or-later controller
    others = _calibrated("V100-PCIE-32GB", "P4")
    assert v100.bandwidth_gbps == pytest.approx(900 * statistics.fmean(map(_share, hbm)))
    assert p4.bandwidth_gbps == pytest.approx(192 * _share(get_device("T4")))  # the one GDDR GPU left
    assert v100.overhead_ms == statistics.median(d.kernel_overhead_ms for d in others)  # type: ignore[misc]
    assert v100.floor_ms == statistics.median(d.launch_floor_ms for d in others)  # type: ignore[misc]
    assert "uncalibrated" in v100.source_of("bandwidth_gbps")
    # No other Pascal HBM GPU is calibrated: the P100 left out takes all four others' mean.
    p100 = uncalibrated_device(get_device("P100-PCIE-16GB"))
    others_mean = statistics.fmean(map(_share, _calibrated("P100-PCIE-16GB")))
    assert p100.bandwidth_gbps == pytest.approx(732 * others_mean)


def test_uncalibrated_swaps_the_table_and_restores_it() -> None:
    v100, p4 = get_device("V100-PCIE-32GB"), get_device("P4")
    with uncalibrated(["V100-PCIE-32GB", "Tesla P4"]) as (v, p):
        assert get_device("V100-PCIE-32GB") is v and get_device("P4") is p  # lookups by name see them
        assert v == uncalibrated_device(v100, ["P4"]) and v.bandwidth_gbps != v100.bandwidth_gbps
        with uncalibrated(["P100-PCIE-16GB"]) as (p100,):  # nested: from the shipped calibrations alone
            assert p100 == uncalibrated_device(get_device("P100-PCIE-16GB"))
    assert get_device("V100-PCIE-32GB") is v100 and get_device("P4") is p4
    with pytest.raises(RuntimeError), uncalibrated(["T4"]):
        raise RuntimeError
    assert get_device("T4").achieved_bandwidth_gbps is not None
    with uncalibrated([]) as swapped:
        assert swapped == []


def test_a_price_follows_the_device_not_its_name() -> None:
    """Costs are kept per Device: priced inside the block, the uncalibrated GPU; after it, the GPU again."""
    import torch

    model, x = torch.nn.Sequential(*(torch.nn.Linear(512, 512) for _ in range(4))), torch.randn(64, 512)
    before = fxcost.cost(model, (x,), "P4").ms
    with uncalibrated(["P4"]):  # the weakest GPU: its own overhead sets its eager step's
        inside = fxcost.cost(model, (x,), "P4").ms
    assert inside != before
    assert fxcost.cost(model, (x,), "P4").ms == before


def test_loaded_calibrations_are_no_donors(tmp_path, fresh_database) -> None:
    """A device file's calibration (a GPU a user measured, a lent H100's) never reaches the
    leave-one-out fallbacks: they come from the calibrations fxcost ships."""
    expected = uncalibrated_device(get_device("V100-PCIE-32GB"))
    path = tmp_path / "measured.yaml"
    path.write_text(
        "A100-SXM4-40GB:\n  achieved_bandwidth_gbps: 1000\n  kernel_overhead_ms: 0.001\n"
        "H100-SXM:\n  achieved_bandwidth_gbps: 2991\n  kernel_overhead_ms: 0.0049\n"
    )
    fresh_database.load_devices(path)
    assert fresh_database.get_device("A100-SXM4-40GB").achieved_bandwidth_gbps == 1000
    assert uncalibrated_device(fresh_database.get_device("V100-PCIE-32GB")) == expected
