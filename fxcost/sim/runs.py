"""A published run's model and cluster from what its report states: dimensions, GPU, system, network.

Used by ``benchmarks/published_runs.py``, which builds each model from its dimensions as a
:class:`fxcost.zoo.decoders.Decoder`:

- :func:`attention_of`: the attention kernel the report states (fused or not);
  :func:`sequence_parallel_of`: sequence parallelism the framework runs by default;
  :func:`mixture_of`: the experts and experts per token the report states.
- :func:`read_gpu`: the database entry a report's GPU string names, reading a parenthesized system
  (``"V100-SXM3-32GB (DGX-2H)"``) or power cap (``"(500W)"``) where the whole string is not an entry.
- :func:`cluster_for`: the run's cluster. GPUs per node and NICs from the system where the text names
  one (:data:`SYSTEMS`), else nodes of 8 (DGX/HGX). Between nodes, the network the text states
  (``"1600 Gbps RoCE"``: that many Gb/s per node, spread over one NIC per GPU), else the fabric of
  the GPU generation's DGX: Volta EDR 100 Gb/s, Ampere HDR 200 Gb/s (Selene, Narayanan et al. SC'21
  §5.1: "eight NVIDIA Mellanox 200Gbps HDR Infiniband HCAs"), Hopper and later NDR 400 Gb/s
  (ConnectX-7). Each assumption is returned as a flag.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fxcost.gpus import Device, UnknownDeviceError, get_device
from fxcost.sim.cluster import Cluster, default_inter_link
from fxcost.sim.simulator import OPTIMIZER_STEP, SimResult
from fxcost.sim.strategy import Recompute

__all__ = [
    "BREAKDOWN_PARTS",
    "SYSTEMS",
    "System",
    "attention_of",
    "breakdown",
    "cluster_for",
    "mixture_of",
    "read_gpu",
    "recompute_of",
    "sequence_parallel_of",
]

GPUS_PER_NODE = 8


@dataclass(frozen=True)
class System:
    """A machine named in a report: GPUs per node, its NICs for the cluster fabric and their rate."""

    gpus_per_node: int
    nics_per_node: int
    nic_gbps: float
    source: str


# Shoeybi et al. 2019 (arXiv 1909.08053) §5: DGX-2H servers of 16 V100 32GB, "300 GB/sec bandwidth
# between GPUs inside a server via NVSwitch and 100 GB/sec of interconnect bandwidth between servers
# using 8 InfiniBand adapters per server" (12.5 GB/s each: EDR). The DGX-2 has the same fabric.
_DGX2 = System(16, 8, 12.5, "Shoeybi et al. 2019 §5: 16 GPUs, NVSwitch, 8 x 100 Gb/s IB per node")
SYSTEMS = {"DGX-2H": _DGX2, "DGX-2": _DGX2}

_NETWORK = re.compile(r"(\d+(?:\.\d+)?)\s*(Gbps|Gb/s)\s*(RoCE|InfiniBand|IB|Ethernet)", re.IGNORECASE)
_PARENS = re.compile(r"\s*\(([^)]*)\)")
_WATTS = re.compile(r"^(\d+(?:\.\d+)?)\s*W$", re.IGNORECASE)


def sequence_parallel_of(text: str) -> tuple[bool, str]:
    """(whether a run whose report leaves sequence parallelism unstated ran it, how that was read):
    torchtitan's tensor-parallel plan shards the norms along the sequence (``SequenceParallel`` in
    torchtitan/models/llama3/infra/parallelize.py), so its runs with ``tp > 1`` do."""
    if "torchtitan" in text.lower():
        return True, "sp: torchtitan's tensor-parallel plan (SequenceParallel norms)"
    return False, ""


_PER = r"\s*(?:per|a|/)\s*(?:token|gpu|rank|device|node|group)"  # "experts per token": no layer's count
_EXPERTS = re.compile(rf"(\d+)[\s-]+(?:routed\s+)?experts?\b(?!{_PER})", re.IGNORECASE)
_TOP_K = re.compile(
    r"\btop[-\s_]?(?:k\s*=\s*)?(\d+)\b|(\d+)\s+(?:activ(?:e|ated)\s+)?(?:routed\s+)?experts?\s*(?:per|a|/)\s*token"
    r"|\b(\d+)\s+of\s+\d+\s+(?:routed\s+)?experts",
    re.IGNORECASE,
)


def mixture_of(text: str) -> tuple[int | None, int | None]:
    """(the experts per layer, the experts each token runs) a report's text states (``"8 experts"``,
    ``"64-expert"``; ``"top-2"``, ``"2 experts per token"``, ``"2 of 8 experts"``), None for what it
    does not state (an expert count below 2 is none)."""
    experts, top = _EXPERTS.search(text), _TOP_K.search(text)
    count = int(experts.group(1)) if experts else None
    return (
        count if count is not None and count >= 2 else None,
        int(next(g for g in top.groups() if g)) if top else None,
    )


def attention_of(text: str) -> tuple[str, str]:
    """(the attention a run's report states it ran, how that was read): ``"sdpa"`` (one fused kernel)
    where the text names FlashAttention or SDPA, or the run is torchtitan's (its models call
    ``F.scaled_dot_product_attention``: torchtitan/models/llama3/model.py); else ``"eager"``, the
    attention as matmuls and softmax apart, as Megatron-LM ran it before FlashAttention (2022)."""
    low = text.lower()
    for name in ("flashattention", "flash attention", "flash-attention", "sdpa", "torchtitan"):
        if name in low:
            return "sdpa", f"attention: fused (the report names {name})"
    return "eager", "attention: unfused (no fused kernel named)"


def recompute_of(stated: str, text: str) -> tuple[Recompute, str | None]:
    """(the recompute policy of a run whose report states ``stated`` — none, selective or full — how
    ``selective`` was read): torchtitan's selective checkpointing where the text names torchtitan (its
    configs' default ``selective_ac_option = "op"``: the per-op policy), else Megatron-LM's (the core
    attention).

    Raises:
        ValueError: ``stated`` is none of the three.
    """
    if stated not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be none, selective or full, got {stated!r}")
    if stated != "selective":
        return stated, None  # type: ignore[return-value]
    if "torchtitan" in text.lower():
        return "ops", "recompute: selective read as torchtitan's per-op policy (the report names torchtitan)"
    return "selective", "recompute: selective read as Megatron-LM's (the core attention)"


def read_gpu(text: str) -> tuple[Device, System | None, list[str]]:
    """The device a report's GPU string names, the system it names in parentheses, and flags.

    The whole string is looked up first (an alias may hold it); else the name before the parentheses,
    each parenthesized part read as a system of :data:`SYSTEMS` or a power cap (``500W``).

    Raises:
        UnknownDeviceError: neither the string nor its name before the parentheses is in the database.
    """
    text = text.strip()
    parts = _PARENS.findall(text)
    system = next((SYSTEMS[p.strip()] for p in parts if p.strip() in SYSTEMS), None)
    try:
        return get_device(text), system, []
    except UnknownDeviceError:
        name = _PARENS.sub("", text).strip()
        if not parts or not name:
            raise
    device, flags = get_device(name), []
    for part in (p.strip() for p in parts):
        watts = _WATTS.match(part)
        if watts and device.tdp_w != float(watts.group(1)):
            flags.append(f"power cap {part}: priced at {device.name}'s clocks (TDP {device.tdp_w} W)")
        elif not watts and part not in SYSTEMS:
            flags.append(f"gpu note ({part}) not modelled")
    return device, system, flags


def cluster_for(
    device: Device, gpus: int, system: System | None = None, text: str = ""
) -> tuple[Cluster, list[str]]:
    """The run's cluster and how it was read (flags): nodes from ``system`` (else of 8 GPUs, fewer if
    the count does not split so), the network from ``text`` (the row's source and notes) where it
    states one, else the system's, else the GPU generation's DGX fabric; one NIC per GPU."""
    per_node = math.gcd(gpus, system.gpus_per_node if system else GPUS_PER_NODE)
    flags = []
    stated = _NETWORK.search(text)
    if stated:
        node_gbps = float(stated.group(1)) / 8  # Gb/s to GB/s
        nics = per_node
        nic = node_gbps / nics
        flags.append(f"network: {stated.group(0)} per node as stated ({nics} x {nic:.1f} GB/s)")
    elif system is not None:
        nics, nic = min(system.nics_per_node, per_node), system.nic_gbps
        flags.append(f"network: {system.source}")
    else:
        link = default_inter_link(device)  # the GPU generation's DGX fabric, one NIC per GPU
        nics, nic = per_node, link.bandwidth_gbps
        if gpus > per_node:
            flags.append(f"network: not stated; the DGX fabric of its generation, {nics} x {link.name}")
    cluster = Cluster.parse(
        f"{gpus // per_node}x{per_node}x{device.name}", inter_gbps=nic, nics_per_node=nics
    )
    return cluster, flags


BREAKDOWN_PARTS = ("compute", "tp", "p2p", "dp_exposed", "optimizer", "idle")
"""The parts of :func:`breakdown` that add up to the iteration."""

# Who an instant of the iteration belongs to when several of a rank's streams run in it.
_PRIORITY = ("compute", "tp", "p2p", "optimizer", "dp_exposed")


def breakdown(result: SimResult, stage: int = 0) -> dict[str, float]:
    """Where the simulated rank of ``stage`` spends the iteration, in ms, each instant counted once:
    ``compute`` (its kernels, recomputed forwards included, each as long as it ran: slowed beside
    gradient and parameter collectives, :data:`~fxcost.sim.engine.GAMMA`), then what runs while no
    kernel does: ``tp`` (tensor-parallel collectives), ``p2p`` (pipeline sends), ``optimizer`` (its
    step), ``dp_exposed`` (data-parallel and ZeRO collectives), in that order where they overlap,
    and ``idle`` (nothing of the rank's running: the pipeline bubble, waiting for other stages).
    The parts add up to the iteration. Each kind of collective's whole time, hidden time included,
    is also given: ``tp_total``, ``p2p_total`` and ``dp``."""
    spans: dict[str, list[tuple[float, float]]] = {part: [] for part in _PRIORITY}
    totals = {"tp": 0.0, "p2p": 0.0, "dp": 0.0}
    for t in result.tasks:
        if t.stage != stage:
            continue
        if t.name == OPTIMIZER_STEP:
            part = "optimizer"
        elif t.stream == "compute":
            part = "compute"
        else:
            group = {"tp": "tp", "pp": "p2p"}.get(t.args.get("group", "dp"), "dp")
            totals[group] += t.duration_ms
            part = "dp_exposed" if group == "dp" else group
        spans[part].append((t.start_ms, t.end_ms))
    parts = {"iteration": result.iteration_ms, **_exposed(spans), "dp": totals["dp"],
             "tp_total": totals["tp"], "p2p_total": totals["p2p"]}  # fmt: skip
    parts["idle"] = max(result.iteration_ms - sum(parts[k] for k in _PRIORITY), 0.0)
    return parts


def _exposed(spans: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """The time each part holds when every instant goes to the first of :data:`_PRIORITY` running."""
    events = sorted((time, rank, +1 if edge == 0 else -1)
                    for rank, part in enumerate(_PRIORITY) for span in spans[part]
                    for edge, time in enumerate(span))  # fmt: skip
    running = [0] * len(_PRIORITY)
    held = dict.fromkeys(_PRIORITY, 0.0)
    last = 0.0
    for time, rank, step in events:
        owner = next((i for i, n in enumerate(running) if n > 0), None)
        if owner is not None:
            held[_PRIORITY[owner]] += time - last
        running[rank] += step
        last = time
    return held
