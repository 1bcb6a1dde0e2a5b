"""The power headroom a GPU's spec sheet and process give it (``fxcost.gpus.power``)."""

from __future__ import annotations

import dataclasses

import pytest

from fxcost.gpus import all_devices, get_device
from fxcost.gpus.power import die_of, power_headroom, process_energy, process_source, tensor_clock


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


def test_the_gpu_stating_its_tensor_clock_sustains_its_peaks_there() -> None:
    """989.4 TFLOP/s are 132 SMs x 4096 FLOPs a clock at 1.83 GHz: the peak is quoted at that clock."""
    h100 = get_device("H100-SXM")
    assert h100.bf16_tflops == pytest.approx(132 * 4096 * 1830e6 / 1e12, rel=1e-3)
    assert tensor_clock(h100) == (1.0, 1830, h100)
    assert "gpu_specs_notes.md" in h100.source_of("tensor_clock_mhz")
    assert tensor_clock(get_device("H200")) == (1.0, 1830, h100)  # same die, peaks, SMs and TDP


def test_a_gpu_of_the_same_die_sustains_what_its_power_feeds_at_the_same_watts_per_tflops() -> None:
    capped, pcie = get_device("H100-SXM-96GB-HBM2e"), get_device("H100-PCIE")
    watts_per_tflops = 700 / 989.4
    share = 500 / (watts_per_tflops * 989.4)
    assert tensor_clock(capped)[:2] == pytest.approx((share, share * 1830))  # type: ignore[index]
    assert tensor_clock(capped).stated.name == "H100-SXM"  # type: ignore[union-attr]
    share = 350 / (watts_per_tflops * 756)
    per_sm_and_mhz = 989.4 / (132 * 1830)  # the die's
    assert tensor_clock(pcie)[:2] == pytest.approx((share, share * 756 / (114 * per_sm_and_mhz)))  # type: ignore[index]
    # More power than the die needs at its peak: the peak.
    assert tensor_clock(dataclasses.replace(capped, tdp_w=1000)).share == 1.0  # type: ignore[union-attr]


def test_a_device_file_copy_with_another_tdp_is_capped_by_the_shipped_gpu_of_its_die(
    tmp_path, fresh_database
) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("Capped-H100:\n  base: H100-SXM\n  tdp_w: 500\n")
    fresh_database.load_devices(path)
    copy = fresh_database.get_device("Capped-H100")
    assert copy.tensor_clock_mhz == 1830  # inherited, yet the shipped H100 SXM is the die's statement
    assert tensor_clock(copy).share == pytest.approx(500 / 700)  # type: ignore[union-attr]


def test_a_database_change_is_seen_by_what_is_kept_per_database(tmp_path, fresh_database) -> None:
    """A tensor clock kept per database state is found again once a device file changes the table,
    each time (the kept state holds its GPUs, so a freed one's address cannot pass for it)."""
    path = tmp_path / "gpus.yaml"
    for mhz in (1500, 1000, 1900, 1500):
        path.write_text(f"H100-SXM:\n  tensor_clock_mhz: {mhz}\n")
        fresh_database.load_devices(path)
        assert tensor_clock(fresh_database.get_device("H200")).mhz == pytest.approx(mhz)  # type: ignore[union-attr]


def test_no_source_on_the_die_no_tensor_clock() -> None:
    assert tensor_clock(get_device("A100-SXM4-80GB")) is None
    assert tensor_clock(get_device("L4")) is None
    h200 = get_device("H200")
    assert tensor_clock(dataclasses.replace(h200, tdp_w=None)) is None
    assert tensor_clock(dataclasses.replace(h200, architecture="Hopper")) is None  # no die named
