"""How sure a step's prediction is: its nodes' intervals summed, and drawn in as a step's errors are.

Each origin-free node has an interval (:mod:`~fxcost.cost_models.heads.intervals`). Summed, they put
every node at its class's end at once, as if all of a step's errors leaned the same way. They lean
that way only in part: a GPU's sustained clock moves them together, a shape's kernel choice moves one
node. On the Hugging Face runs of each training GPU, predicted with heads fit without it, the summed
bounds spanned x0.64 to x2.26 of the prediction (medians) where the runs came out within x0.85 to
x1.19.

So the nodes of the classes those runs hold (:attr:`Intervals.drawn_classes`: GEMMs, batched GEMMs,
softmax, layer norm, elementwise) have their summed ends drawn in towards their predicted time, to
:attr:`Intervals.step_scale` of the log distance (:meth:`StepSums.bounds`). The scale is calibrated
as the node intervals are, on GPUs left out (:func:`step_scale_for`): the smallest at which each
left-out GPU's runs, against the scale the other GPUs' runs give, lie inside for the nominal share of
them on average over GPUs. The rest keep their summed bounds: convolution nodes and fused attention,
which no run holds, so nothing says how their errors cancel in a step. A conv net's other nodes
(batch norms, activations) are drawn in at the transformers' scale, an extrapolation.

A phase's interval is drawn in on its own, so the forward's and the backward's do not add up to the
step's.
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

__all__ = ["StepSums", "drawn_nodes", "step_bounds", "step_scale_for", "step_sums"]


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

    def covers(self, ratio: float, scale: float) -> bool:
        """Whether a step measured at ``ratio`` times its predicted time lies inside :meth:`bounds`."""
        low, high = self.bounds(scale)
        return low <= ratio * self.total <= high


def drawn_nodes(
    nodes: Sequence[NodeCost], classes: Sequence[str | None], drawn_classes: Sequence[str]
) -> np.ndarray:
    """Which nodes, of interval ``classes`` (:func:`node_classes`), a step's interval draws in: those
    of ``drawn_classes``, fused attention aside."""
    wanted = set(drawn_classes)
    pairs = zip(nodes, classes, strict=True)
    return np.array([c in wanted and n.op not in ATTENTION_OPS for n, c in pairs], dtype=bool)


def step_sums(
    nodes: Sequence[NodeCost],
    ms: np.ndarray,
    sources: Sequence[str | None] | np.ndarray,
    weights: np.ndarray | None = None,
    device: Device | None = None,
    intervals: Intervals | None = None,
    classes: Sequence[str | None] | None = None,
) -> StepSums:
    """The :class:`StepSums` of nodes predicted at ``ms`` by ``sources`` (each counted ``weights``
    times; a node without a prediction, NaN, counts for nothing), with the shipped intervals (or
    ``intervals``); ``classes``: the nodes' :func:`node_classes`, where the caller keeps them."""
    intervals = intervals or shipped_intervals()
    ms = np.nan_to_num(np.asarray(ms, dtype=np.float64))
    classes = node_classes(nodes, sources) if classes is None else classes
    low, high = (np.nan_to_num(b) for b in node_bounds(nodes, ms, sources, intervals, device, classes))
    w = np.ones(len(ms)) if weights is None else np.asarray(weights, dtype=np.float64)
    drawn = drawn_nodes(nodes, classes, intervals.drawn_classes if intervals is not None else ())

    def part(mask: np.ndarray) -> tuple[float, float, float]:
        return float(ms[mask] @ w[mask]), float(low[mask] @ w[mask]), float(high[mask] @ w[mask])

    return StepSums(part(drawn), part(~drawn))


def step_bounds(sums: StepSums) -> tuple[float, float]:
    """The nominal 80% interval of a step: its :func:`step_sums` (with the shipped intervals) drawn in
    by their :attr:`~Intervals.step_scale`."""
    intervals = shipped_intervals()
    return sums.bounds(intervals.step_scale if intervals is not None else 1.0)


_SCALES = np.linspace(0.01, 1.0, 100)
_TARGETS = np.linspace(0.5, 0.999, 200)


def step_scale_for(runs: Mapping[str, Sequence[tuple[float, StepSums]]], nominal: float = NOMINAL) -> float:
    """The step scale that covers ``nominal`` of a left-out GPU's runs: ``runs`` maps each GPU to its
    runs as (measured over predicted time, :class:`StepSums`), each predicted with heads and node
    intervals fit without that GPU.

    As :meth:`Intervals.calibrated` widens a class's share: the scale is the smallest (on a grid of
    0.01 to 1) that covers a share of the runs, on average over GPUs, and that share the smallest (at
    or above ``nominal``) at which each GPU's runs, against the scale the other GPUs' runs give, lie
    inside for ``nominal`` of them on average. With one GPU, nothing to leave out: ``nominal`` itself.
    1 (the summed bounds) where no scale reaches it.
    """
    by_gpu = {gpu: list(r) for gpu, r in runs.items() if len(r)}
    if len(by_gpu) < 2:
        return _smallest_scale(by_gpu, nominal)
    for target in _TARGETS[nominal <= _TARGETS]:
        nested = []
        for gpu, mine in by_gpu.items():
            scale = _smallest_scale({g: r for g, r in by_gpu.items() if g != gpu}, float(target))
            nested.append(np.mean([sums.covers(ratio, scale) for ratio, sums in mine]))
        if np.mean(nested) >= nominal:
            return _smallest_scale(by_gpu, float(target))
    return 1.0


def _smallest_scale(by_gpu: Mapping[str, Sequence[tuple[float, StepSums]]], target: float) -> float:
    """The smallest scale at which the runs lie inside for ``target`` of them, on average over GPUs."""
    if not by_gpu:
        return 1.0
    for scale in _SCALES:
        shares = [np.mean([s.covers(ratio, float(scale)) for ratio, s in r]) for r in by_gpu.values()]
        if np.mean(shares) >= target:
            return float(scale)
    return 1.0
