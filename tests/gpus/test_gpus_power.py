"""The power headroom a GPU's spec sheet and process give it (``fxcost.gpus.power``)."""

from __future__ import annotations

import dataclasses

import pytest

from fxcost.gpus import all_devices, get_device
from fxcost.gpus.power import die_of, power_headroom, process_energy, process_source, tensor_clock_share


def test_every_gpu_of_the_database_has_its_die_and_process() -> None:
    """A GPU without a process would be read at its boost clock however little power it has."""
    for device in all_devices():
        assert die_of(device) is not None, device.name
        assert process_energy(device) is not None, device.name
        assert process_source(device) != "unknown", device.name


def test_the_headroom_is_board_power_over_peak_and_process_energy() -> None:
    p4, t4, a100, l4 = (get_device(g) for g in ("P4", "T4", "A100-PCIE-40GB", "L4"))
    assert [die_of(d) for d in (p4, t4, a100, l4)] == ["GP104", "TU104", "GA100", "AD104"]
    assert power_headroom(p4) == pytest.approx(75 / 5.5)  # 16FF+, the reference node
    assert power_headroom(a100) == pytest.approx(250 / (19.5 * 0.35))  # N7: 65% less power than 16nm
    assert power_headroom(l4) == pytest.approx(72 / (30.3 * 0.245))  # 4N, an N5: 30% less than N7
    assert "unconfirmed" in process_source(t4)  # 12FFN's figure is recalled
    assert "unconfirmed" not in process_source(a100)


def test_an_unknown_die_or_power_has_no_headroom() -> None:
    t4 = get_device("T4")
    assert power_headroom(dataclasses.replace(t4, architecture="Turing")) is None
    assert power_headroom(dataclasses.replace(t4, tdp_w=None)) is None
    assert power_headroom(dataclasses.replace(t4, fp32_tflops=None)) is None


def test_a_stated_tensor_clock_is_read_over_the_boost_clock() -> None:
    h100 = get_device("H100-SXM")
    assert tensor_clock_share(h100) == pytest.approx(1830 / 1980)
    assert "gpu_specs_notes.md" in h100.source_of("tensor_clock_mhz")
    # Never above the boost clock, whatever a file states.
    assert tensor_clock_share(dataclasses.replace(h100, tensor_clock_mhz=2500)) == 1.0


def test_a_gpu_of_the_same_die_sustains_what_its_power_feeds_at_the_same_watts_per_tflops() -> None:
    names = ("H100-SXM", "H200", "H100-SXM-96GB-HBM2e", "H100-PCIE")
    h100, h200, capped, pcie = (get_device(g) for g in names)
    watts_per_tflops = 700 / (1830 / 1980 * 989.4)
    assert tensor_clock_share(h200) == pytest.approx(tensor_clock_share(h100))  # same die, peak and TDP
    assert tensor_clock_share(capped) == pytest.approx(500 / (watts_per_tflops * 989.4))
    assert tensor_clock_share(pcie) == pytest.approx(350 / (watts_per_tflops * 756))
    # More power than the die needs at its boost clock: the boost clock.
    assert tensor_clock_share(dataclasses.replace(capped, tdp_w=1000)) == 1.0


def test_no_source_on_the_die_no_tensor_clock() -> None:
    assert tensor_clock_share(get_device("A100-SXM4-80GB")) is None
    assert tensor_clock_share(get_device("L4")) is None
    h200 = get_device("H200")
    assert tensor_clock_share(dataclasses.replace(h200, tdp_w=None)) is None
    assert tensor_clock_share(dataclasses.replace(h200, architecture="Hopper")) is None  # no die named
