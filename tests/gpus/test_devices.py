from __future__ import annotations

import json

import pytest

import fxcost
from fxcost.gpus import UnknownDeviceError, device_names, get_device
from fxcost.gpus.fallbacks import BANDWIDTH_FRACTIONS


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("H100-SXM", "H100-SXM"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA_H100_80GB_HBM3", "H100-SXM"),
        ("Tesla T4", "T4"),
        ("tesla_t4", "T4"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
        ("A100-80GB", "A100-PCIE-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_lookup_accepts_canonical_alias_and_cuda_names(name: str, canonical: str) -> None:
    assert get_device(name).name == canonical


def test_issue_gpus_are_in_the_database() -> None:
    names = set(fxcost.devices())
    trained_on = {"P4", "P100-PCIE-16GB", "T4", "V100-PCIE-32GB", "A100-PCIE-40GB", "A100-SXM4-40GB"}
    held_out = {"A100-PCIE-80GB", "L4", "H100-SXM"}
    others = {"H200", "A100-SXM4-80GB", "L40S", "A10G", "RTX4090"}
    wanted = trained_on | held_out | others
    assert wanted <= names


def test_every_neusight_device_config_resolves(data_dir) -> None:
    configs = sorted((data_dir / "neusight" / "device_configs").glob("*.json"))
    assert configs
    for path in configs:
        by_file = get_device(path.stem)  # underscore form of the CUDA name
        by_name = get_device(json.loads(path.read_text())["Device"])
        assert by_file is by_name


def test_unknown_device_names_close_matches() -> None:
    with pytest.raises(UnknownDeviceError) as excinfo:
        get_device("H10O")
    message = str(excinfo.value)
    assert "unknown device 'H10O'" in message
    assert "closest: H100" in message
    assert "T4" in message  # the list of known devices follows


def test_unknown_device_is_a_value_and_key_error() -> None:
    with pytest.raises(ValueError):
        get_device("no such gpu")
    with pytest.raises(KeyError):
        get_device("no such gpu")


def test_non_string_device_is_rejected() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        get_device(3)  # type: ignore[arg-type]


def test_unconfirmed_values_are_flagged() -> None:
    p100 = get_device("P100-PCIE-16GB")
    assert p100.boost_clock_mhz == 1303
    assert "boost_clock_mhz" in p100.uncertain
    assert "num_sms" not in p100.uncertain


def test_spec_values_parse_with_units() -> None:
    h100 = get_device("H100-SXM")
    assert (h100.num_sms, h100.mem_bandwidth_gbps, h100.fp32_tflops) == (132, 3350.0, 67.0)
    assert h100.bf16_tflops == pytest.approx(989.4)
    assert h100.price_usd_per_hr is not None and h100.price_usd_per_hr > 0
    assert get_device("P4").fp16_tflops is None  # Pascal: no tensor cores
    assert get_device("MI300X").compute_capability is None


def test_device_names_are_unique_and_ordered() -> None:
    names = device_names()
    assert len(names) == len(set(names)) == 28
    assert names[0] == "P4"


def test_yaml_overrides_and_adds_devices(tmp_path, fresh_database) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "H100-SXM:\n"
        "  achieved_bandwidth_gbps: 3000\n"
        "  price_usd_per_hr: 2.5\n"
        "MyCloud-H100:\n"
        "  base: NVIDIA H100 80GB HBM3\n"
        "  aliases: [H100 (MyCloud)]\n"
        "  price_usd_per_hr: 1.9\n"
    )
    assert fresh_database.load_devices(path) == ["H100-SXM", "MyCloud-H100"]
    h100 = get_device("H100-SXM")
    assert h100.bandwidth_gbps == 3000 and h100.price_usd_per_hr == 2.5
    assert str(path) in h100.source_of("bandwidth_gbps")
    assert str(path) in h100.source_of("price_usd_per_hr")
    mine = get_device("h100 (mycloud)")
    assert mine.name == "MyCloud-H100" and mine.num_sms == 132 and mine.price_usd_per_hr == 1.9
    assert "MyCloud-H100" in fxcost.devices()


def test_json_device_file_from_the_environment(tmp_path, monkeypatch, fresh_database) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"T4": {"launch_floor_ms": 0.012}}))
    monkeypatch.setenv("FXCOST_DEVICES", str(path))
    fresh_database._database.cache_clear()
    assert get_device("T4").floor_ms == 0.012


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("T4:\n  sms: 40\n", "unknown fields ['sms']"),
        ("T4:\n  num_sms: many\n", "num_sms must be a non-negative number"),
        ("Z9:\n  num_sms: 10\n", "not a known device; give 'base:"),
        ("Z9:\n  base: nothing\n", "unknown base device 'nothing'"),
        ("- T4\n", "expected a mapping of device names"),
        ("T4: [1, 2\n", "not valid YAML"),
    ],
)
def test_bad_device_files_are_refused(tmp_path, content, message, fresh_database) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(content)
    with pytest.raises(fresh_database.DeviceFileError, match=message.replace("[", r"\[")):
        fresh_database.load_devices(path)


def test_every_value_has_a_source() -> None:
    t4, h100 = get_device("T4"), get_device("H100-SXM")
    assert "calibrate_devices.py" in t4.source_of("achieved_bandwidth_gbps")
    hbm = BANDWIDTH_FRACTIONS["HBM"]
    source = h100.source_of("bandwidth_gbps")
    assert source.startswith(f"default: {hbm:.3f} x spec bandwidth (mean achieved/spec")
    assert "calibrated HBM GPUs" in h100.source_of("bandwidth_gbps")
    assert "compute capability 9.0" in h100.source_of("smem_alloc_unit_bytes")
    assert "(unconfirmed)" in get_device("P100-PCIE-16GB").source_of("boost_clock_mhz")
    with pytest.raises(ValueError, match="no field"):
        t4.source_of("colour")


def test_an_mi250_is_the_one_die_pytorch_sees() -> None:
    die = get_device("AMD Instinct MI250X / MI250")
    assert die.name == "MI250" and die.num_sms == 104 and die.memory_gb == 64
    assert die.fp32_tflops == pytest.approx(45.3 / 2) and die.mem_bandwidth_gbps == pytest.approx(3276.8 / 2)
    assert "tdp_w" in die.uncertain


def test_gpus_an_origin_free_prediction_never_finds_slower_than_weaker_ones() -> None:
    from fxcost.gpus.order import weaker_than

    weaker = {d.name for d in weaker_than(get_device("H100-SXM"))}
    assert {"V100-PCIE-32GB", "A100-PCIE-40GB", "T4"} <= weaker
    assert "H100-SXM" not in weaker and "L4" not in weaker  # an L4 clocks higher than an H100
    assert weaker_than(get_device("P4")) == []


def test_published_runs_gpus_are_in_the_database() -> None:
    """The GPUs of published runs: the DGX-2H's 450 W V100 (Megatron-LM 2019: 39 TF is 30% of its peak)
    and Meta's 96 GB HBM2e H100 (torchtitan), whose unknown figures are marked unconfirmed."""
    dgx2h = get_device("V100-SXM3-32GB (DGX-2H)")
    assert dgx2h.name == "V100-SXM3-32GB-H" and dgx2h.memory_gb == 32 and dgx2h.tdp_w == 450
    assert 39 / dgx2h.fp16_tflops == pytest.approx(0.30, abs=0.005)
    meta = get_device("H100-SXM-96GB-HBM2e")
    assert meta.num_sms == get_device("H100-SXM").num_sms and meta.memory_gb == 96
    assert {"mem_bandwidth_gbps", "bf16_tflops", "tdp_w"} <= meta.uncertain
