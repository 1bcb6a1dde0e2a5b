"""Cluster topology: nodes, their links, and how concurrent groups share them (Proteus §VI-B, §VI-C).

A :class:`Cluster` is ``nodes`` machines of ``gpus_per_node`` identical GPUs. GPUs inside a node talk over
the ``intra`` link (NVLink/NVSwitch, or PCIe); nodes talk through ``nics_per_node`` NICs of the ``inter``
link each. Ranks are numbered node by node: rank ``r`` lives on node ``r // gpus_per_node``.
:func:`link_sharing` says how many concurrent groups share each group's bottleneck link, so that a
simulator can pass ``sharing=`` to :func:`fxcost.sim.nccl.collective_ms`, which prices a collective as
NCCL's tuning model does (algorithm and protocol; see that module).

Assumptions:

* Bandwidths are per GPU per direction, in GB/s with GB = 1e9 bytes (NCCL-tests' unit). A link's
  bandwidth is what a ring all_reduce with NCCL's Simple protocol reaches over it (its bus bandwidth).
  ``latency_us`` is its per-hop latency under NCCL's ring/LL (the lowest of NCCL's latency table).
* A node with NVLink is switched (NVSwitch): every GPU has its own full-bandwidth port, so groups on
  disjoint GPUs do not share. PCIe cards joined by NVLink *bridges* (the database's ``nvlink_domain``:
  pairs of A100-PCIE, H100-PCIE, RTX 3090; fours of MI100/MI210) use the bridge only in nodes no
  larger than one bridged domain; in larger nodes a ring must cross PCIe between domains, so PCIe is
  the node's link. DGX-1's hybrid cube mesh is treated as switched; pass ``intra_gbps`` to correct it.
  A PCIe node is modeled as one link shared by the whole node (``Link.shared``): peer traffic goes
  through the host bridge, so every concurrent group on the node shares it.
* Groups spanning nodes cross them through NICs: a ring crosses a node boundary on one edge per channel,
  and NCCL spreads channels over the NICs, so a node's crossing capacity is ``min(ranks of the group on
  the node, nics_per_node) * inter.bandwidth_gbps`` (one GPU drives at most one NIC).

Defaults and where they come from:

* ``NVLINK_EFFICIENCY = 0.77``: NCCL-tests all_reduce_perf on a DGX A100 (8x A100-SXM4, NVSwitch,
  NVLink 3 600 GB/s total = 300 GB/s per direction) reaches a bus bandwidth of about 230 GB/s for large
  messages; 230 / 300 = 0.77. Intra bandwidth = ``nvlink_bandwidth_gbps / 2 * 0.77`` (NVLink 4 on
  H100: 900 GB/s total, 346.5 GB/s).
* ``PCIE_GEN3_GBPS = 12.0``, doubling per generation (gen4 24, gen5 48): achievable per-direction
  throughput of an x16 link (gen3 peak 15.75 GB/s, about 12-13 GB/s in practice with TLP overheads;
  NCCL's topology model also takes 12 GB/s for a gen3 x16 link, ``src/graph/topo.h`` ``PCI_BW``).
* Hop latencies (ring/LL, NCCL 2.18 ``src/graph/tuning.cc`` ``hwLat``): NVLink 0.6 us, PCIe 1.0 us,
  network 2.7 us.
* Networks (:data:`NETWORKS`, line rates in GB/s): InfiniBand EDR 100 Gb/s, HDR 200 Gb/s, NDR 400 Gb/s
  (InfiniBand Trade Association roadmap), RoCE at 100/200/400 GbE (the Ethernet rates). The default NIC
  follows the GPU generation's DGX system: DGX-1/DGX-2 (Volta) EDR, DGX A100 (Ampere, DGX A100 User Guide:
  eight ConnectX-6 200 Gb/s HDR compute NICs) HDR, DGX H100/B200 (Hopper, Blackwell: eight ConnectX-7
  400 Gb/s NDR compute ports, DGX H100 User Guide) NDR, anything else HDR. A node of switched-NVLink SXM GPUs
  has one NIC per GPU (the DGX/HGX design above); any other node one NIC.

No default is fitted to any measurement in ``shared/data``.

Example:
    >>> c = Cluster.parse("2x8xA100-SXM4-40GB")
    >>> c.world_size, c.intra.bandwidth_gbps, c.inter.name, c.nics_per_node
    (16, 231.0, 'InfiniBand HDR', 8)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from fxcost.gpus import Device, UnknownDeviceError, get_device

__all__ = [
    "COLLECTIVES",
    "NETWORKS",
    "Cluster",
    "Link",
    "default_inter_link",
    "default_intra_link",
    "default_nics_per_node",
    "link_sharing",
    "ring_hop",
]

NVLINK_EFFICIENCY = 0.77
NVLINK_LATENCY_US = 0.6
PCIE_GEN3_GBPS = 12.0
PCIE_LATENCY_US = 1.0
IB_EDR_GBPS, IB_HDR_GBPS, IB_NDR_GBPS = 12.5, 25.0, 50.0
NET_LATENCY_US = 2.7
NETWORKS = {
    "InfiniBand EDR": IB_EDR_GBPS,
    "InfiniBand HDR": IB_HDR_GBPS,
    "InfiniBand NDR": IB_NDR_GBPS,
    "RoCE 100GbE": 12.5,
    "RoCE 200GbE": 25.0,
    "RoCE 400GbE": 50.0,
}
_NETWORK_OF_FAMILY = {"Volta": "InfiniBand EDR", "Ampere": "InfiniBand HDR", "Hopper": "InfiniBand NDR",
                      "Blackwell": "InfiniBand NDR"}  # fmt: skip

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")

_SPEC_FORM = (
    "expected NODESxGPUSxDEVICE, GPUSxDEVICE or DEVICE, e.g. '2x8xA100-SXM4-80GB', '8xH100-SXM', 'T4'"
)
_SPEC_RE = re.compile(r"^(?:(\d+)[x×])?(?:(\d+)[x×])?(.*)$", re.IGNORECASE)
_OVERRIDES = (
    "intra_gbps",
    "intra_latency_us",
    "intra_shared",
    "inter_gbps",
    "inter_latency_us",
    "nics_per_node",
    "network",
)
_CLUSTER_KEYS = ("nodes", "gpus_per_node", "device", "intra", "inter", "nics_per_node")


@dataclass(frozen=True)
class Link:
    """One kind of physical link: bandwidth per GPU per direction (GB/s) and per-hop latency (us).

    ``shared`` marks a link that all GPUs of a node share (PCIe peer traffic through the host bridge)
    rather than a port of their own (NVSwitch); it only matters for the intra-node link.
    """

    bandwidth_gbps: float
    latency_us: float
    name: str = ""
    shared: bool = False

    def __post_init__(self) -> None:
        if not self.bandwidth_gbps > 0:
            raise ValueError(f"link {self.name!r}: bandwidth_gbps must be > 0, got {self.bandwidth_gbps}")
        if not self.latency_us >= 0:
            raise ValueError(f"link {self.name!r}: latency_us must be >= 0, got {self.latency_us}")


_LINK_KEYS = tuple(f.name for f in fields(Link))


def default_intra_link(device: Device, gpus_per_node: int | None = None) -> Link:
    """The GPU-GPU link inside a node of ``gpus_per_node`` GPUs: NVLink if the GPU has it and the node
    fits in one NVLink domain (switched NVLink: any size), else PCIe."""
    bridged_beyond = device.nvlink_domain is not None and (gpus_per_node or 1) > device.nvlink_domain
    if device.nvlink_bandwidth_gbps and not bridged_beyond:
        return Link(device.nvlink_bandwidth_gbps / 2 * NVLINK_EFFICIENCY, NVLINK_LATENCY_US, "NVLink")
    if device.pcie_gen:
        gbps = PCIE_GEN3_GBPS * 2.0 ** (device.pcie_gen - 3)
        return Link(gbps, PCIE_LATENCY_US, f"PCIe gen{device.pcie_gen}", shared=True)
    raise ValueError(f"{device.name}: neither NVLink bandwidth nor PCIe generation is known; pass intra_gbps")


def default_inter_link(device: Device | None = None, network: str | None = None) -> Link:
    """One NIC of ``network`` (a key of :data:`NETWORKS`), by default the one of the GPU generation's DGX
    system (see the module docstring); HDR without a device."""
    if network is None:
        family = (device.architecture or "").split()[0] if device is not None and device.architecture else ""
        network = _NETWORK_OF_FAMILY.get(family, "InfiniBand HDR")
    if network not in NETWORKS:
        raise ValueError(f"unknown network {network!r}; accepted: {list(NETWORKS)}")
    return Link(NETWORKS[network], NET_LATENCY_US, network)


def default_nics_per_node(device: Device, gpus_per_node: int) -> int:
    """One NIC per GPU in a node of switched-NVLink GPUs (DGX/HGX), else one."""
    return gpus_per_node if device.nvlink_bandwidth_gbps and device.nvlink_domain is None else 1


@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``gpus_per_node`` GPUs each, with their intra- and inter-node links.

    Example:
        >>> c = Cluster.parse("2x4xV100-SXM2-16GB", inter_gbps=12.5)
        >>> str(c), c.node_of(5), c.inter.bandwidth_gbps
        ('2x4xV100-SXM2-16GB', 1, 12.5)
    """

    nodes: int
    gpus_per_node: int
    device: Device
    intra: Link
    inter: Link
    nics_per_node: int = 1

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "nics_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"cluster: {name} must be a positive integer, got {value!r}")

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}x{self.device.name}"

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        """The node that ``rank`` lives on (ranks are numbered node by node)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the cluster {self} (ranks 0..{self.world_size - 1})")
        return rank // self.gpus_per_node

    @classmethod
    def parse(cls, spec: str, **overrides: Any) -> Cluster:
        """Build a cluster from ``"2x8xA100-SXM4-80GB"``, ``"8xH100-SXM"`` or ``"H100-SXM"``.

        Links default from the device (see the module docstring); ``overrides`` may set ``intra_gbps``,
        ``intra_latency_us``, ``intra_shared``, ``inter_gbps``, ``inter_latency_us``, ``nics_per_node`` and
        ``network`` (a key of :data:`NETWORKS`: the NIC's kind, before ``inter_gbps``).
        """
        unknown = sorted(set(overrides) - set(_OVERRIDES))
        if unknown:
            raise ValueError(
                f"cluster spec {spec!r}: unknown override(s) {unknown}; accepted: {list(_OVERRIDES)}"
            )
        match = _SPEC_RE.match(spec.strip())
        first, second, name = match.groups() if match else (None, None, "")
        if not name:
            raise ValueError(f"cluster spec {spec!r}: missing the device name; {_SPEC_FORM}")
        counts = [int(c) for c in (first, second) if c is not None]
        nodes, gpus = (counts[0], counts[1]) if len(counts) == 2 else (1, counts[0] if counts else 1)
        if nodes < 1 or gpus < 1:
            raise ValueError(f"cluster spec {spec!r}: node and GPU counts must be >= 1; {_SPEC_FORM}")
        try:
            device = get_device(name)
        except UnknownDeviceError as e:
            raise ValueError(f"cluster spec {spec!r}: bad device part {name!r} ({e}); {_SPEC_FORM}") from e

        try:
            intra = default_intra_link(device, gpus)
        except ValueError:
            if "intra_gbps" not in overrides:
                raise ValueError(
                    f"cluster spec {spec!r}: {device.name} has no known intra-node link; pass intra_gbps"
                ) from None
            intra = Link(overrides["intra_gbps"], PCIE_LATENCY_US, "intra", shared=True)
        intra = _override_link(intra, overrides, "intra")
        inter = _override_link(default_inter_link(device, overrides.get("network")), overrides, "inter")
        nics = overrides.get("nics_per_node", default_nics_per_node(device, gpus))
        return cls(nodes, gpus, device, intra, inter, nics)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cluster:
        """Build a cluster from its YAML form (see :meth:`to_dict`); missing link fields take defaults."""
        unknown = sorted(set(d) - set(_CLUSTER_KEYS))
        if unknown:
            raise ValueError(f"cluster: unknown key(s) {unknown}; accepted keys: {list(_CLUSTER_KEYS)}")
        if "device" not in d:
            raise ValueError(f"cluster: 'device' is required; accepted keys: {list(_CLUSTER_KEYS)}")
        device = get_device(d["device"])
        gpus = d.get("gpus_per_node", 1)
        intra = _link_from(d.get("intra"), "intra", lambda: default_intra_link(device, gpus))
        inter = _link_from(d.get("inter"), "inter", lambda: default_inter_link(device))
        nics = d.get("nics_per_node", default_nics_per_node(device, gpus))
        return cls(d.get("nodes", 1), gpus, device, intra, inter, nics)

    def to_dict(self) -> dict[str, Any]:
        """The YAML form: ``{nodes, gpus_per_node, device, intra: {...}, inter: {...}, nics_per_node}``."""
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "device": self.device.name,
            "intra": asdict(self.intra),
            "inter": asdict(self.inter),
            "nics_per_node": self.nics_per_node,
        }


def _override_link(link: Link, overrides: Mapping[str, Any], prefix: str) -> Link:
    keys = {
        "bandwidth_gbps": f"{prefix}_gbps",
        "latency_us": f"{prefix}_latency_us",
        "shared": f"{prefix}_shared",
    }
    return replace(link, **{field: overrides[key] for field, key in keys.items() if key in overrides})


def _link_from(d: Mapping[str, Any] | None, what: str, default: Callable[[], Link]) -> Link:
    if d is None:
        return default()
    unknown = sorted(set(d) - set(_LINK_KEYS))
    if unknown:
        raise ValueError(f"cluster {what}: unknown key(s) {unknown}; accepted keys: {list(_LINK_KEYS)}")
    try:
        base = default()
    except ValueError:  # no default for this device: the mapping must be complete
        return Link(**d)
    return replace(base, **d)


def _ranks_per_node(ranks: Iterable[int], cluster: Cluster) -> Counter[int]:
    return Counter(cluster.node_of(r) for r in set(ranks))


def link_sharing(groups: Sequence[Sequence[int]], cluster: Cluster) -> list[float]:
    """For groups communicating at the same time, how many share each group's bottleneck link (>= 1).

    Follows Proteus §VI-C, NIC first: a group spanning nodes drives ``min(its ranks there, nics_per_node)``
    NICs on each node it touches; where the groups ask for more NICs than a node has, they share them
    fairly, and a group's factor is the worst over its nodes (with one NIC per group per node this is the
    number of such groups on the node divided by ``nics_per_node``). A group inside one node shares its
    GPUs' NVSwitch ports with the other groups moving data between GPUs of that node through the same
    GPUs, or, on a shared (PCIe) intra link, with every group moving data between GPUs of that node.

    Example:
        >>> c = Cluster.parse("8xA10")  # PCIe: one host bridge per node
        >>> link_sharing([[0, 4], [1, 5], [2, 6], [3, 7]], c)
        [4.0, 4.0, 4.0, 4.0]
    """
    nics = cluster.nics_per_node
    per_node = [_ranks_per_node(g, cluster) for g in groups]
    nic_demand: Counter[int] = Counter()
    intra_users: Counter[int] = Counter()  # by node on a shared intra link, else by GPU (its NVSwitch port)
    for g, counts in zip(groups, per_node, strict=True):
        if len(counts) > 1:
            for node, m in counts.items():
                nic_demand[node] += min(m, nics)
        moving = {node for node, m in counts.items() if m > 1}
        if cluster.intra.shared:
            intra_users.update(moving)
        else:
            intra_users.update(r for r in set(g) if cluster.node_of(r) in moving)
    factors = []
    for g, counts in zip(groups, per_node, strict=True):
        if sum(counts.values()) < 2:
            factor = 1.0
        elif len(counts) > 1:
            factor = max(nic_demand[node] / nics for node in counts)
        elif cluster.intra.shared:
            factor = float(intra_users[next(iter(counts))])
        else:
            factor = float(max(intra_users[r] for r in g))
        factors.append(max(1.0, factor))
    return factors


def ring_hop(rings: Sequence[Sequence[int]], cluster: Cluster) -> tuple[list[int], float]:
    """A ring step of ``rings`` (every rank sending to the next at once): the first ring's slowest hop
    (one off the node where it has one) and how many hops share that hop's links."""
    hops = [[r[i], r[(i + 1) % len(r)]] for r in rings for i in range(len(r))]
    first = hops[: len(rings[0])]
    hop = max(first, key=lambda pair: cluster.node_of(pair[0]) != cluster.node_of(pair[1]))
    return hop, max(link_sharing(hops, cluster))
