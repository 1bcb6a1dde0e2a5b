"""The power headroom a GPU's spec sheet and process give it (``fxcost.gpus.power``)."""

from __future__ import annotations

import dataclasses

import pytest

from fxcost.gpus import all_devices, get_device
from fxcost.gpus.power import die_of, power_headroom, process_energy, process_source


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
