"""From per-node predictions to a step's figures: totals by phase and module, coverage.

Every function takes node records (``report.nodes``) and a canonical device name; they read
``pred_ms`` and never change a record. A node without a prediction adds nothing to a total and
counts against :func:`coverage`, as does one only the roofline priced (:data:`FALLBACK_SOURCES`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fxcost.records import PHASES, NodeCost

__all__ = ["FALLBACK_SOURCES", "by_module", "coverage", "phase_totals", "total_ms"]

FALLBACK_SOURCES = frozenset({"roofline", "unsupported"})
"""``pred_source`` values that mean no model of the op priced it: the roofline is a bound from peak
rates that any op gets (the policy's last resort), and ``unsupported`` is no prediction at all."""


def total_ms(nodes: Sequence[NodeCost], device: str) -> float:
    """The nodes' predicted ms on ``device`` added up, one after the other."""
    return sum(n.pred_ms.get(device) or 0.0 for n in nodes)


def phase_totals(ms: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """Totals per phase of distinct nodes whose predicted ``ms`` each run ``counts[i, phase]`` times
    (phases in :data:`~fxcost.records.PHASES` order); a node no model predicts adds nothing."""
    return dict(zip(PHASES, (float(x) for x in np.nan_to_num(ms) @ counts), strict=True))


def by_module(
    nodes: Sequence[NodeCost], device: str, depth: int | None = None
) -> dict[str, dict[str, float]]:
    """Predicted ms on ``device`` rolled up by module path: ``{module: {"fw": ms, "bw": ms, ...}}``,
    largest total first; ``depth`` truncates paths to their first ``depth`` components."""
    rollup: dict[str, dict[str, float]] = {}
    for n in nodes:
        module = ".".join(n.module.split(".")[:depth]) if depth is not None else n.module
        phases = rollup.setdefault(module, {})
        phases[n.phase] = phases.get(n.phase, 0.0) + (n.pred_ms.get(device) or 0.0)
    return dict(sorted(rollup.items(), key=lambda item: -sum(item[1].values())))


def coverage(nodes: Sequence[NodeCost], device: str) -> float:
    """Fraction of kernel-launching nodes a model of their op predicts on ``device`` (1.0 if none
    launches): a node only the roofline fallback priced counts as not covered, like one unpredicted."""
    kernels = [n for n in nodes if n.has_kernel]
    if not kernels:
        return 1.0
    covered = sum(
        n.pred_ms.get(device) is not None and n.pred_source.get(device) not in FALLBACK_SOURCES
        for n in kernels
    )
    return covered / len(kernels)
