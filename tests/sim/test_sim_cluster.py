from __future__ import annotations

import pytest
import yaml

from fxcost.gpus import get_device
from fxcost.sim.cluster import COLLECTIVES, Cluster, Link, link_sharing
from fxcost.sim.nccl import collective_ms

# Round numbers so that every expected value below can be worked by hand:
# 100 GB/s = 1e8 bytes per ms inside a node, 25 GB/s = 2.5e7 bytes per ms per NIC.
INTRA = Link(100.0, 2.0, "test-nvlink")
INTER = Link(25.0, 5.0, "test-nic")
S = 1e8  # bytes


def make(nodes: int = 1, gpus: int = 4, nics: int = 1, intra: Link = INTRA) -> Cluster:
    return Cluster(nodes, gpus, get_device("A100-SXM4-40GB"), intra, INTER, nics)


@pytest.mark.parametrize("kind", COLLECTIVES)
def test_a_group_of_one_rank_costs_nothing(kind: str) -> None:
    assert collective_ms(kind, S, [3], make()) == 0.0
    assert collective_ms(kind, S, [3, 3], make()) == 0.0  # duplicates count once


@pytest.mark.parametrize("kind", COLLECTIVES)
def test_a_group_spanning_two_nodes_is_slower_than_inside_one(kind: str) -> None:
    c = make(nodes=2, gpus=8)
    inside, across = ([0, 1], [7, 8]) if kind == "send_recv" else ([0, 1, 2, 3], [6, 7, 8, 9])
    assert collective_ms(kind, S, across, c) > 1.5 * collective_ms(kind, S, inside, c)


def test_link_sharing_figure_5_on_one_node() -> None:
    groups = [[0, 4], [1, 5], [2, 6], [3, 7]]
    # NVSwitch: each GPU has its own port, disjoint pairs do not compete
    assert link_sharing(groups, Cluster.parse("8xA100-SXM4-40GB")) == [1.0] * 4
    # PCIe (no NVLink): all four pairs go through the node's host bridge
    assert link_sharing(groups, Cluster.parse("8xT4")) == [4.0] * 4


def test_link_sharing_on_nvswitch_counts_groups_through_the_same_gpu() -> None:
    c = Cluster.parse("8xA100-SXM4-40GB")
    assert link_sharing([[0, 1, 2, 3], [0, 4], [5, 6], [7]], c) == [2.0, 2.0, 1.0, 1.0]


@pytest.mark.parametrize(("nics", "expected"), [(1, 8.0), (4, 2.0), (8, 1.0)])
def test_link_sharing_groups_crossing_the_nics(nics: int, expected: float) -> None:
    c = Cluster.parse("2x8xA100-SXM4-40GB", nics_per_node=nics)
    dp_groups = [[i, i + 8] for i in range(8)]
    assert link_sharing(dp_groups, c) == [expected] * 8


def test_link_sharing_keeps_nic_and_nvswitch_sharing_apart() -> None:
    c = Cluster.parse("2x8xA100-SXM4-40GB", nics_per_node=1)
    factors = link_sharing([[0, 8], [1, 9], [2, 3, 4, 5]], c)
    assert factors == [2.0, 2.0, 1.0]


def test_defaults_from_the_device_database() -> None:
    a100 = Cluster.parse("2x8xA100-SXM4-40GB")
    assert (a100.nodes, a100.gpus_per_node, a100.world_size) == (2, 8, 16)
    assert a100.intra.bandwidth_gbps == pytest.approx(231.0)  # 600 / 2 * 0.77
    assert not a100.intra.shared
    # DGX A100: eight 200 Gb/s HDR compute NICs; DGX H100: eight 400 Gb/s NDR ports (DGX user guides)
    assert (a100.inter.name, a100.inter.bandwidth_gbps, a100.inter.latency_us) == (
        "InfiniBand HDR",
        25.0,
        2.7,
    )
    assert a100.nics_per_node == 8
    h100 = Cluster.parse("2x8xH100-SXM")
    assert (h100.inter.name, h100.inter.bandwidth_gbps, h100.nics_per_node) == ("InfiniBand NDR", 50.0, 8)
    roce = Cluster.parse("2x8xH100-SXM", network="RoCE 200GbE")
    assert (roce.inter.name, roce.inter.bandwidth_gbps) == ("RoCE 200GbE", 25.0)
    assert Cluster.parse("2x8xA10").nics_per_node == 1  # a PCIe server: one NIC
    t4 = Cluster.parse("T4")
    assert (t4.nodes, t4.gpus_per_node, t4.intra.bandwidth_gbps, t4.intra.shared) == (1, 1, 12.0, True)
    assert Cluster.parse("4xL40S").intra.bandwidth_gbps == 24.0  # PCIe gen4


@pytest.mark.parametrize(
    ("spec", "link"),
    [("2xA100-PCIE-40GB", "NVLink"), ("4xA100-PCIE-40GB", "PCIe gen4"), ("8xH100-PCIE", "PCIe gen5"),
     ("2x2xRTX3090", "NVLink"), ("8xRTX3090", "PCIe gen4"), ("4xMI210", "NVLink"), ("8xMI210", "PCIe gen4"),
     ("8xH100-SXM", "NVLink")],
)  # fmt: skip
def test_nvlink_bridges_join_only_their_domain(spec: str, link: str) -> None:
    """A ring over more bridged cards than one bridge joins crosses PCIe between the domains."""
    cluster = Cluster.parse(spec)
    assert cluster.intra.name == link and cluster.intra.shared == link.startswith("PCIe")
    assert Cluster.from_dict(cluster.to_dict() | {"intra": None}).intra == cluster.intra
    four_bridged = Cluster.parse("4xA100-PCIE-40GB")
    assert collective_ms("all_reduce", 1e9, range(4), four_bridged) > 5 * collective_ms(
        "all_reduce", 1e9, range(4), Cluster.parse("4xA100-SXM4-40GB")
    )


def test_parse_forms_aliases_and_overrides() -> None:
    c = Cluster.parse("8xH100", inter_gbps=50, inter_latency_us=3, intra_gbps=400, nics_per_node=8)
    assert (c.nodes, c.gpus_per_node, c.device.name) == (1, 8, "H100-SXM")
    assert (c.intra.bandwidth_gbps, c.inter.bandwidth_gbps, c.inter.latency_us) == (400, 50, 3)
    assert c.nics_per_node == 8
    assert str(Cluster.parse("8xMI300X")) == "1x8xMI300X"  # a trailing x in the device name is not a count
    assert Cluster.parse("2x4xV100-SXM2-16GB").node_of(5) == 1


@pytest.mark.parametrize(
    ("spec", "overrides", "message"),
    [
        ("2x8x", {}, "missing the device name"),
        ("2x8xNOPE-GPU", {}, "bad device part 'NOPE-GPU'"),
        ("0x8xA100-SXM4-40GB", {}, "counts must be >= 1"),
        ("A100-SXM4-40GB", {"inter_bw": 1}, "unknown override"),
        ("A100-SXM4-40GB", {"network": "HDR"}, "unknown network 'HDR'; accepted: .*InfiniBand HDR"),
    ],
)
def test_parse_errors_name_the_problem(spec: str, overrides: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Cluster.parse(spec, **overrides)
    assert any(word in str(info.value) for word in ("NODESxGPUSxDEVICE", "inter_gbps", "RoCE"))


def test_bad_arguments_are_refused() -> None:
    c = make()
    with pytest.raises(ValueError, match="all_reduce"):
        collective_ms("allreduce", S, [0, 1], c)
    with pytest.raises(ValueError, match="rank 4 is outside"):
        collective_ms("all_reduce", S, [0, 4], c)
    with pytest.raises(ValueError, match="two ranks"):
        collective_ms("send_recv", S, [0, 1, 2], c)
    with pytest.raises(ValueError, match="sharing"):
        collective_ms("all_reduce", S, [0, 1], c, sharing=0.5)
    with pytest.raises(ValueError, match="nics_per_node"):
        make(nics=0)


def test_from_dict_round_trip_through_yaml() -> None:
    c = Cluster.parse("2x8xA100-SXM4-40GB", inter_gbps=50, nics_per_node=4)
    assert Cluster.from_dict(yaml.safe_load(yaml.safe_dump(c.to_dict()))) == c


def test_from_dict_fills_defaults_and_refuses_unknown_keys() -> None:
    c = Cluster.from_dict(
        {"nodes": 2, "gpus_per_node": 4, "device": "A100-SXM4-40GB", "inter": {"latency_us": 2}}
    )
    assert c == Cluster.parse("2x4xA100-SXM4-40GB", inter_latency_us=2)
    with pytest.raises(ValueError, match=r"accepted keys.*gpus_per_node"):
        Cluster.from_dict({"device": "T4", "gpus": 4})
    with pytest.raises(ValueError, match=r"accepted keys.*bandwidth_gbps"):
        Cluster.from_dict({"device": "T4", "intra": {"bw": 4}})
