"""A collective as the plan issues it (:mod:`fxcost.sim.plan`) and the simulator prices it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Comm"]


@dataclass(frozen=True)
class Comm:
    """A collective: ``kind``, the full buffer in bytes, the group (``"tp"``, ``"dp"``, ``"pp"``)."""

    kind: str
    nbytes: float
    group: str
    stream: str  # "feature" (blocks compute), "gradient" (asynchronous) or "param" (prefetched gathers)
    steps: int = 1  # issued this many times in a row (a ring's send/recv steps)
    hidden_ms: float = 0.0  # compute each step overlaps: only the transfer beyond it is exposed
