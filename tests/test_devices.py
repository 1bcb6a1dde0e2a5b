from __future__ import annotations

import json

import pytest

import fxcost
from fxcost.devices import UnknownDeviceError, device_names, get_device


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
    assert len(names) == len(set(names)) == 26
    assert names[0] == "P4"
