"""The time of one NCCL collective: algorithm and protocol chosen as NCCL's tuning model does.

NCCL prices every (algorithm, protocol) pair for a collective and runs the fastest (``src/graph/tuning.cc``,
``ncclTopoTuneModel`` and ``getAlgoInfo``): ``time = latency + bytes / algorithm bandwidth``. This module
follows that model on a :class:`~fxcost.sim.cluster.Cluster`:

* **Algorithms.** ``ring`` (every collective); ``tree`` (all_reduce only: a chain inside a node, a double
  binary tree across nodes); ``nvls`` (all_reduce inside one node whose NVSwitch reduces in the switch:
  NVLink SHARP on third-generation NVSwitch, i.e. switched NVLink on compute capability >= 9.0, H100/H200
  SXM). NVLS all_gather/reduce_scatter move the same bytes per GPU as the ring (NCCL uses them to free
  SMs), so the ring prices them; NVLS-tree across nodes and CollNet are not modeled.
* **Protocols.** ``LL`` (8-byte lines of 4 data bytes and a flag: lowest latency, a quarter of the link's
  bandwidth in NCCL's model), ``LL128`` (128-byte lines of 120 data bytes; NCCL enables it by default on
  NVLink systems only), ``Simple`` (full bandwidth, highest latency).
* **Bandwidth.** The link bandwidth ``B`` of the group's bottleneck (``fxcost.sim.cluster``: the intra
  link inside a node; ``min(ranks on a node, NICs) * NIC`` across nodes, capped by the intra link),
  divided by ``sharing``, is the *bus bandwidth* of a ring with the Simple protocol. NCCL's protocol
  factors scale it: ring LL 1/4; ring LL128 0.92 (0.7 with one rank per node); tree 0.92, tree LL a further
  1/3.8, tree LL128 a further 7/9 in one node and 120/128 across nodes. Bus to algorithm bandwidth: ring
  ``n / steps`` (all_reduce ``n / (2 (n - 1))``), tree 1/2. NVLS all_reduce: each GPU sends its buffer to
  the switch once and receives it reduced once, plus one chunk each way for its own slice, i.e.
  ``S (n + 1) / n`` per direction: algorithm bandwidth ``B n / (n + 1)``.
* **Latency (us).** NCCL's base latency per algorithm and protocol plus per-hop latencies by link type
  (NVLink, PCIe, network): ring ``(steps - inter steps) * intra hop + inter steps * network hop`` with
  ``2 (n - 1)`` steps for all_reduce (``2 * nodes`` of them across nodes) and ``n - 1`` for
  all_gather/reduce_scatter (``nodes - 1`` across); tree ``2 ((ranks per node - 1) * intra hop +
  log2(nodes) * network hop)``; NVLS a flat 25 us. A :class:`~fxcost.sim.cluster.Link`'s ``latency_us``
  is its hop latency under ring/LL; other (algorithm, protocol) pairs scale it by NCCL's table, so the
  defaults reproduce the table and an override scales the whole row.
* **all_to_all and send_recv** are grouped point-to-point operations in NCCL (no tuning table): Simple
  protocol, ring base latency and one hop per link type crossed (peers are served concurrently on
  separate channels); all_to_all's bandwidth as in ``fxcost.sim.cluster`` (each rank's off-node share
  through the node's NICs).

Constants: NCCL 2.18 ``src/graph/tuning.cc`` (``baseLat``, ``hwLat``, the protocol factors in
``ncclTopoTuneModel``), as recalled from that source; NVLS's flat latency is its ``hwLat`` entry.
No constant is fitted to a measurement in ``shared/data``.

Example:
    >>> from fxcost.sim.cluster import Cluster
    >>> c = Cluster.parse("8xA100-SXM4-80GB")
    >>> best_algorithm("all_reduce", 8, range(8), c)  # 8 bytes: latency-bound
    ('ring', 'LL')
    >>> best_algorithm("all_reduce", 2**30, range(8), c)
    ('ring', 'Simple')
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

from fxcost.gpus.occupancy import sm_version
from fxcost.sim.cluster import COLLECTIVES, Cluster, Link
from fxcost.sim.comm import Comm

__all__ = ["PROTOCOLS", "best_algorithm", "bus_bandwidth_gbps", "collective_ms", "comm_ms", "nvls_capable"]

PROTOCOLS = ("LL", "LL128", "Simple")
NVLS_LATENCY_US = 25.0
NVLS_MIN_SM_VERSION = 90

# baseLat (us): per collective launch, by algorithm and protocol (LL, LL128, Simple)
_BASE_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 0.0)}
# hwLat (us): per hop, by link type, algorithm and protocol (LL, LL128, Simple)
_HOP_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0)},
    "pcie": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 6.0)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0)},
}
_RING_LL = 0.25
_RING_LL128, _RING_LL128_ONE_PER_NODE = 0.92, 0.7
_TREE, _TREE_LL, _TREE_LL128_NODE, _TREE_LL128_NET = 0.92, 1 / 3.8, 7 / 9, 120 / 128


def nvls_capable(cluster: Cluster) -> bool:
    """Whether the node's NVSwitch reduces in the switch (NVLink SHARP: switched NVLink, sm_90 or later)."""
    device = cluster.device
    return (
        cluster.intra.name == "NVLink"
        and not cluster.intra.shared
        and device.nvlink_domain is None
        and (sm_version(device) or 0) >= NVLS_MIN_SM_VERSION
    )


def _link_type(link: Link, inter: bool) -> str:
    return "net" if inter else "pcie" if link.shared else "nvlink"


def _hop_us(link: Link, inter: bool, algorithm: str, protocol: str) -> float:
    """NCCL's hop latency for the link type, scaled so that ring/LL is the link's ``latency_us``."""
    row = _HOP_US[_link_type(link, inter)]
    return link.latency_us * row[algorithm][PROTOCOLS.index(protocol)] / row["ring"][0]


def _ranks_per_node(ranks: Iterable[int], cluster: Cluster) -> tuple[int, ...]:
    return tuple(sorted(Counter(cluster.node_of(r) for r in set(ranks)).values()))


def collective_ms(
    kind: str, nbytes: float, ranks: Sequence[int], cluster: Cluster, *, sharing: float = 1.0
) -> float:
    """Time of one collective over ``ranks``, in ms: NCCL's fastest algorithm and protocol.

    Args:
        kind: one of :data:`~fxcost.sim.cluster.COLLECTIVES`.
        nbytes: the full buffer for all_reduce and broadcast, the gathered output of all_gather and the
            input of reduce_scatter (NCCL-tests' convention), the bytes sent for send_recv, and the bytes
            each rank holds for all_to_all.
        ranks: the group; duplicates are ignored. A group of one rank, or 0 bytes, costs 0.
        cluster: where the ranks live.
        sharing: how many groups share the group's bottleneck link at the same time (fair share).

    Example:
        >>> from fxcost.sim.cluster import Cluster
        >>> c = Cluster.parse("8xA100-SXM4-80GB")
        >>> round(collective_ms("all_reduce", 8, range(8), c) * 1e3, 1)  # us: 6.6 + 14 hops of 0.6
        15.0
    """
    return _best(kind, nbytes, ranks, cluster, sharing)[0]


def comm_ms(c: Comm, ranks: Sequence[int], cluster: Cluster, *, sharing: float = 1.0) -> float:
    """:func:`collective_ms` of the plan's collective ``c`` on ``ranks``; a ring's ``c.steps`` steps
    (context parallelism) each expose what the compute beside it (``c.hidden_ms``) does not hide."""
    step_ms = collective_ms(c.kind, c.nbytes, ranks, cluster, sharing=sharing)
    return c.steps * max(step_ms - c.hidden_ms, 0.0) if c.steps > 1 else step_ms


def best_algorithm(
    kind: str, nbytes: float, ranks: Sequence[int], cluster: Cluster, *, sharing: float = 1.0
) -> tuple[str, str]:
    """The (algorithm, protocol) NCCL's model picks; point-to-point kinds report ``("p2p", "Simple")``."""
    return _best(kind, nbytes, ranks, cluster, sharing)[1]


def bus_bandwidth_gbps(kind: str, nbytes: float, ranks: Sequence[int], cluster: Cluster) -> float:
    """NCCL-tests' bus bandwidth of the modeled collective (GB/s): its algorithm bandwidth times
    ``2 (n - 1) / n`` for all_reduce, ``(n - 1) / n`` for all_gather, reduce_scatter and all_to_all."""
    n = len(set(ranks))
    factor = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0, "send_recv": 1.0}.get(kind, (n - 1) / n)
    return nbytes / (collective_ms(kind, nbytes, ranks, cluster) * 1e6) * factor


def _best(
    kind: str, nbytes: float, ranks: Sequence[int], cluster: Cluster, sharing: float
) -> tuple[float, tuple[str, str]]:
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; expected one of {list(COLLECTIVES)}")
    if not nbytes >= 0:
        raise ValueError(f"{kind}: nbytes must be >= 0, got {nbytes}")
    if not sharing >= 1:
        raise ValueError(f"{kind}: sharing must be >= 1 (groups on the link), got {sharing}")
    per_node = _ranks_per_node(ranks, cluster)
    if kind == "send_recv" and sum(per_node) > 2:
        raise ValueError(f"send_recv takes two ranks (source, destination), got {sorted(set(ranks))}")
    if sum(per_node) < 2 or nbytes == 0:  # NCCL returns at once for a zero-count operation
        return 0.0, ("none", "none")
    nvls = kind == "all_reduce" and len(per_node) == 1 and nvls_capable(cluster)
    return _priced(kind, float(nbytes), per_node, cluster.intra, cluster.inter, cluster.nics_per_node,
                   float(sharing), nvls)  # fmt: skip


@lru_cache(maxsize=4096)
def _priced(
    kind: str,
    nbytes: float,
    per_node: tuple[int, ...],
    intra: Link,
    inter: Link,
    nics: int,
    sharing: float,
    nvls: bool,
) -> tuple[float, tuple[str, str]]:
    """(ms, (algorithm, protocol)) of the fastest choice; cached: a plan prices the same groups often."""
    n, k = sum(per_node), len(per_node)
    per_ms = 1e6  # GB/s -> bytes per ms
    if kind == "all_to_all":  # each rank sends 1/n of its bytes to every peer, off-node ones via the NICs
        intra_gbps = intra.bandwidth_gbps / (sharing if k == 1 else 1.0)
        transfer_ms = max(
            max(
                (m - 1) / n * nbytes / (intra_gbps * per_ms),
                m * (n - m) / n * nbytes / (min(m, nics) * inter.bandwidth_gbps / sharing * per_ms),
            )
            for m in per_node
        )
        return transfer_ms + _p2p_latency_us(per_node, intra, inter) / 1e3, ("p2p", "Simple")

    if k == 1:
        bandwidth_gbps = intra.bandwidth_gbps / sharing
    else:  # one ring edge per channel crosses each node boundary; channels spread over the NICs
        bandwidth_gbps = min(min(m, nics) for m in per_node) * inter.bandwidth_gbps / sharing
        if max(per_node) > 1:
            bandwidth_gbps = min(bandwidth_gbps, intra.bandwidth_gbps)
    if kind == "send_recv":
        transfer_ms = nbytes / (bandwidth_gbps * per_ms)
        return transfer_ms + _p2p_latency_us(per_node, intra, inter) / 1e3, ("p2p", "Simple")

    ppn = max(per_node)
    steps, inter_steps, bus_to_alg = {
        "all_reduce": (2 * (n - 1), 2 * k if k > 1 else 0, n / (2 * (n - 1))),
        "broadcast": (n - 1, k - 1, 1.0),
    }.get(kind, (n - 1, k - 1, n / (n - 1)))
    inter_steps = min(inter_steps, steps)
    options: list[tuple[float, tuple[str, str]]] = []
    for p, protocol in enumerate(PROTOCOLS):
        if protocol == "LL128" and intra.shared:  # NCCL enables LL128 by default on NVLink systems only
            continue
        ring_factor = {"LL": _RING_LL, "LL128": _RING_LL128 if ppn > 1 else _RING_LL128_ONE_PER_NODE}
        ring_us = (
            _BASE_US["ring"][p]
            + (steps - inter_steps) * _hop_us(intra, False, "ring", protocol)
            + inter_steps * _hop_us(inter, True, "ring", protocol)
        )
        ring_gbps = bandwidth_gbps * ring_factor.get(protocol, 1.0) * bus_to_alg
        options.append((ring_us / 1e3 + nbytes / (ring_gbps * per_ms), ("ring", protocol)))
        if kind != "all_reduce":
            continue
        tree_factor = {"LL": _TREE_LL, "LL128": _TREE_LL128_NODE if k == 1 else _TREE_LL128_NET}
        tree_us = _BASE_US["tree"][p] + 2 * (
            (ppn - 1) * _hop_us(intra, False, "tree", protocol)
            + math.ceil(math.log2(k)) * _hop_us(inter, True, "tree", protocol)
        )
        tree_gbps = bandwidth_gbps * _TREE * tree_factor.get(protocol, 1.0) * 0.5
        options.append((tree_us / 1e3 + nbytes / (tree_gbps * per_ms), ("tree", protocol)))
    if nvls:
        nvls_ms = NVLS_LATENCY_US / 1e3 + nbytes * (n + 1) / n / (bandwidth_gbps * per_ms)
        options.append((nvls_ms, ("nvls", "Simple")))
    return min(options)


def _p2p_latency_us(per_node: tuple[int, ...], intra: Link, inter: Link) -> float:
    """Grouped point-to-point: one launch, one hop per link type crossed (peers served concurrently)."""
    hops = _hop_us(intra, False, "ring", "Simple") if max(per_node) > 1 else 0.0
    if len(per_node) > 1:
        hops += _hop_us(inter, True, "ring", "Simple")
    return _BASE_US["ring"][2] + hops
