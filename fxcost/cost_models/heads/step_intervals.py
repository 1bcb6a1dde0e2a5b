"""How sure a step's prediction is: its nodes' intervals summed, and drawn in as a step's errors are.

Each origin-free node has an interval (:mod:`~fxcost.cost_models.heads.intervals`). Summed, they put
every node at its class's end at once, as if all of a step's errors leaned the same way. They lean
that way only in part: a GPU's sustained clock moves them together, a shape's kernel choice moves one
node. On the Hugging Face runs of each training GPU, predicted with heads fit without it, the summed
bounds spanned x0.64 to x2.26 of the prediction (medians) where the runs came out within x0.85 to
x1.19.

So the part of a step whose classes those runs hold (:attr:`Intervals.step_classes`: GEMMs, batched
GEMMs, softmax, layer norm, elementwise) is drawn in towards the prediction: its summed ends' log
distances from its predicted time times :attr:`Intervals.step_scale`, the smallest scale at which,
GPU by GPU, the runs of a left-out GPU fall inside their intervals for the nominal share of them
(:func:`step_scale_for`; ``benchmarks/generalization.py`` calibrates it, nested: each GPU's runs
against the scale the others' give). The rest keeps its summed bounds: no run measured a
convolution net, and no fused attention kernel (its interval reaches up to its kernel with nothing
overlapped), so nothing says how their errors cancel in a step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.heads.intervals import (
    NOMINAL,
    Intervals,
    node_bounds,
    node_classes,
    shipped_intervals,
)
from fxcost.gpus import Device
from fxcost.lowering.attention import ATTENTION_OPS
from fxcost.records import NodeCost

__all__ = ["StepSums", "step_bounds", "step_scale_for", "step_sums"]


@dataclass(frozen=True)
class StepSums:
    """A step's predicted time and its nodes' bounds, summed (``(predicted, low, high)``) apart for
    the nodes the step scale draws in (``drawn``) and the rest."""

    drawn: tuple[float, float, float]
    rest: tuple[float, float, float]

    @property
    def total(self) -> float:
        return self.drawn[0] + self.rest[0]

    def bounds(self, scale: float) -> tuple[float, float]:
        """The step's interval: the drawn part's ends at ``scale`` of their log distance from its
        predicted time, plus the rest's summed bounds."""
        total, low, high = self.drawn
        if total > 0 and low > 0 and high > 0:
            low, high = total * (low / total) ** scale, total * (high / total) ** scale
        return low + self.rest[1], high + self.rest[2]


def step_sums(
    nodes: Sequence[NodeCost],
    ms: np.ndarray,
    sources: Sequence[str | None] | np.ndarray,
    weights: np.ndarray | None = None,
    device: Device | None = None,
    intervals: Intervals | None = None,
) -> StepSums:
    """The :class:`StepSums` of nodes predicted at ``ms`` by ``sources`` (each counted ``weights``
    times), with the shipped intervals (or ``intervals``)."""
    intervals = intervals or shipped_intervals()
    ms = np.asarray(ms, dtype=np.float64)
    low, high = node_bounds(nodes, ms, sources, intervals, device)
    w = np.ones(len(ms)) if weights is None else np.asarray(weights, dtype=np.float64)
    classes = set(intervals.step_classes) if intervals is not None else set()
    drawn = np.array(
        [
            c in classes and n.op not in ATTENTION_OPS
            for n, c in zip(nodes, node_classes(nodes, sources), strict=True)
        ],
        dtype=bool,
    )

    def part(mask: np.ndarray) -> tuple[float, float, float]:
        return float(ms[mask] @ w[mask]), float(low[mask] @ w[mask]), float(high[mask] @ w[mask])

    return StepSums(part(drawn), part(~drawn))


def step_bounds(
    nodes: Sequence[NodeCost],
    ms: np.ndarray,
    sources: Sequence[str | None] | np.ndarray,
    weights: np.ndarray | None = None,
    device: Device | None = None,
    intervals: Intervals | None = None,
) -> tuple[float, float]:
    """The nominal 80% interval of the step the nodes make up (:func:`step_sums`, drawn in by the
    intervals' :attr:`~Intervals.step_scale`)."""
    intervals = intervals or shipped_intervals()
    sums = step_sums(nodes, ms, sources, weights, device, intervals)
    return sums.bounds(intervals.step_scale if intervals is not None else 1.0)


_STEP_SCALES = np.linspace(0.01, 1.0, 100)


def step_scale_for(runs: Mapping[str, Sequence[tuple[float, StepSums]]], nominal: float = NOMINAL) -> float:
    """The smallest step scale (on a grid of 0.01 to 1) at which each GPU's runs lie inside their
    intervals for ``nominal`` of them, on average over GPUs: ``runs`` maps each GPU to its runs as
    (measured over predicted time, :class:`StepSums`), each predicted with heads and node intervals
    fit without that GPU. 1 (the summed bounds) where no scale reaches it."""
    by_gpu = [list(r) for r in runs.values() if len(r)]
    if not by_gpu:
        return 1.0
    for scale in _STEP_SCALES:
        if (
            np.mean([np.mean([_inside(ratio, sums, float(scale)) for ratio, sums in r]) for r in by_gpu])
            >= nominal
        ):
            return float(scale)
    return 1.0


def _inside(ratio: float, sums: StepSums, scale: float) -> bool:
    low, high = sums.bounds(scale)
    return low <= ratio * sums.total <= high
