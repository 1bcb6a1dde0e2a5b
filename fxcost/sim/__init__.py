"""Multi-GPU training simulation (Proteus): strategies, cluster and collective costs, the execution
plan compiler and the event simulator. ``fxcost.simulate`` is the entry point."""

from fxcost.sim.cluster import Cluster, Link, link_sharing
from fxcost.sim.nccl import collective_ms
from fxcost.sim.simulator import SimResult, simulate
from fxcost.sim.strategy import Strategy

__all__ = ["Cluster", "Link", "SimResult", "Strategy", "collective_ms", "link_sharing", "simulate"]
