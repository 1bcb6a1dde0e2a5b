"""Iteration time at batch sizes that were not captured: Habitat's extrapolation (§6.1.3).

A batch that does not fit on the origin GPU cannot be measured there. Habitat predicts the iteration
at several batch sizes that fit and extrapolates with a least-squares line, since iteration time is
close to linear in the batch size once kernels fill the GPU. :func:`at_batch` does that from reports
of the same model at two or more batch sizes. Small batches are bound by fixed costs (launches,
tiles and waves filled partly), so their line can be too flat for a batch far above them; beyond the
largest report the prediction is never below the step's roofline there (:meth:`BatchFit.floor_ms`).

Example:
    >>> reports = [fxcost.profile(model, inputs(b), devices=["A100-SXM4-80GB"]) for b in (8, 16, 32)]
    >>> fit = at_batch(reports, 256)  # doctest: +SKIP
    >>> fit.total_ms("A100-SXM4-80GB")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.roofline import Roofline
from fxcost.gpus import Device, get_device
from fxcost.records import Phase
from fxcost.report.trace import Report

__all__ = ["BatchFit", "at_batch"]


@dataclass(frozen=True)
class BatchFit:
    """Predicted totals at ``batch``, from lines fit through the reports' totals per device and phase."""

    batch: int
    reports: Mapping[int, Report]

    def total_ms(self, device: str | Device, phase: Phase | None = None) -> float:
        """Predicted ms of the iteration at :attr:`batch` on ``device`` (or of one phase): the line,
        never below :meth:`floor_ms`."""
        slope, intercept = self.line(device, phase)
        return max(intercept + slope * self.batch, self.floor_ms(device, phase))

    def floor_ms(self, device: str | Device, phase: Phase | None = None) -> float:
        """A lower bound on the iteration at :attr:`batch` when it lies above every report's batch (0
        otherwise): the step's roofline there.

        Each node's FLOPs and bytes grow linearly with the batch, so they are extended along the line
        through the two largest reports and the roofline taken at :attr:`batch`. Where the two
        reports' graphs differ node for node, the line goes through their roofline totals instead: a
        node's roofline is the larger of two lines in the batch, the step's is convex, and a line
        through two of its points stays below it beyond them.
        """
        (b1, r1), (b2, r2) = sorted(self.reports.items())[-2:]
        if self.batch <= b2:
            return 0.0
        target = get_device(device)
        n1, n2 = (NodeBatch.of([n for n in r.nodes if phase is None or n.phase == phase]) for r in (r1, r2))
        grow = (self.batch - b2) / (b2 - b1)
        if [n.op for n in n1.nodes] == [n.op for n in n2.nodes]:
            roofline = Roofline()
            flops = np.maximum(np.nan_to_num(n2.flops + (n2.flops - n1.flops) * grow), 0.0)
            nbytes = np.maximum(n2.bytes + (n2.bytes - n1.bytes) * grow, 0.0)
            ms = roofline.ms(flops, nbytes, roofline.peak_tflops(n2, target), target)
            return float(np.nansum(np.where(n2.has_kernel, ms, 0.0)))
        f1, f2 = (float(np.nansum(Roofline().predict(n, target))) for n in (n1, n2))
        return f2 + (f2 - f1) * grow

    def line(self, device: str | Device, phase: Phase | None = None) -> tuple[float, float]:
        """(ms per sample, fixed ms) of the least-squares line through the reports' totals."""
        name = get_device(device).name
        points = [(float(b), r.total_ms(name, phase)) for b, r in sorted(self.reports.items())]
        mean_b = sum(b for b, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        spread = sum((b - mean_b) ** 2 for b, _ in points)
        slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / spread
        return slope, mean_t - slope * mean_b


def at_batch(reports: Mapping[int, Report] | Iterable[Report], batch: int) -> BatchFit:
    """Predictions at ``batch`` from ``reports`` of one model at two or more other batch sizes: a
    mapping ``{batch size: report}``, or reports that record their batch (``fxcost.profile``'s do).

    Raises:
        ValueError: fewer than two distinct batch sizes, a batch size that is not positive, a report
            that records no batch size, or two reports of one batch size.
    """
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    if not isinstance(reports, Mapping):
        listed = list(reports)
        if any(r.batch is None for r in listed):
            raise ValueError(
                "at_batch needs each report's batch size; reports from fxcost.profile record it, "
                "others can set report.batch, or pass a mapping {batch: report}"
            )
        reports = {r.batch: r for r in listed if r.batch is not None}
        if len(reports) < len(listed):
            batches = [r.batch for r in listed]
            raise ValueError(f"at_batch got two reports of one batch size (batches {batches})")
    sizes = sorted(reports)
    if len(sizes) < 2 or any(not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"at_batch needs reports at two or more positive batch sizes, got {sizes}")
    return BatchFit(batch, dict(reports))
