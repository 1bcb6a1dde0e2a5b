"""The ranked plans of a search (:func:`fxcost.sim.search.plan`): each candidate's iteration, rates,
MFU and memory, printed as a table and written as CSV.

MFU is model FLOPs (:meth:`fxcost.zoo.decoders.Decoder.model_flops`: PaLM's ``6N + 12 L h s`` per
token, Chowdhery et al. 2022, appendix B) per second over the GPUs' dense tensor peak in the step's
precision (:func:`peak_tflops`).
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxcost._io import atomic_write
from fxcost.cost_models.heads.tensor_core import tensor_peak_tflops
from fxcost.gpus import Device
from fxcost.precision import Precision
from fxcost.sim.cluster import Cluster
from fxcost.sim.strategy import Strategy
from fxcost.zoo.decoders import Decoder

__all__ = ["Candidate", "PlanSearch", "peak_tflops", "spearman"]


def peak_tflops(device: Device, precision: Precision | None) -> float:
    """The GPU's dense peak in ``precision`` as the tensor-core model reads it
    (:func:`~fxcost.cost_models.heads.tensor_core.tensor_peak_tflops`); fp32 if None.

    Raises:
        ValueError: the device database has no peak for it.
    """
    kind = "tf32" if precision and precision.tf32 else precision.dtype if precision else "float32"
    peak = device.fp32_tflops if kind == "float32" else tensor_peak_tflops(device, kind)
    if not peak:
        name = precision.name if precision else "fp32"
        raise ValueError(f"{device.name} has no {name} peak in the device database (needed for MFU)")
    return peak


@dataclass(frozen=True)
class Candidate:
    """One plan: its strategy, micro-batch size, iteration (exact where ``exact``), memory and rates."""

    strategy: Strategy
    micro_batch: int
    analytic_ms: float
    iteration_ms: float
    exact: bool
    memory_gib: float
    capacity_gib: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu_pct: float

    @property
    def oom(self) -> bool:
        return self.memory_gib > self.capacity_gib


_COLUMNS = (
    "rank",
    "strategy",
    "dp",
    "tp",
    "pp",
    "micro_batch",
    "micro_batches",
    "zero",
    "recompute",
    "sp",
    "vpp",
    "cp",
    "ep",
    "iteration_ms",
    "exact",
    "analytic_ms",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu_pct",
    "memory_gib",
    "capacity_gib",
    "oom",
)


@dataclass
class PlanSearch:
    """The ranked candidates of a search and what it took."""

    model: Decoder
    cluster: Cluster
    batch: int
    seq: int
    candidates: list[Candidate]
    skipped: Counter[str] = field(default_factory=Counter)
    capture_s: float = 0.0
    search_s: float = 0.0
    rank_correlation: float = math.nan
    max_gap: float = math.nan

    @property
    def best(self) -> Candidate:
        """The fastest plan that fits (the fastest at all if none fits)."""
        return self.candidates[0]

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for rank, c in enumerate(self.candidates, 1):
            s = c.strategy
            values = [
                rank,
                str(s),
                s.dp,
                s.tp,
                s.pp,
                c.micro_batch,
                s.micro_batches,
                s.zero,
                s.recompute,
                int(s.sp),
                s.vpp,
                s.cp,
                s.ep,
                round(c.iteration_ms, 3),
                int(c.exact),
                round(c.analytic_ms, 3),
                round(c.tokens_per_s, 1),
                round(c.tokens_per_s_per_gpu, 2),
                round(c.mfu_pct, 2),
                round(c.memory_gib, 2),
                round(c.capacity_gib, 1),
                int(c.oom),
            ]
            rows.append(dict(zip(_COLUMNS, values, strict=True)))
        return rows

    def to_csv(self, path: str | Path) -> Path:
        """Write every candidate, ranked, as CSV."""
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows())
        return atomic_write(Path(path), out.getvalue().encode())

    def table(self, top: int = 10) -> str:
        """The ``top`` plans as a text table, with the search's counts and times under it."""
        head = (
            f"{'#':>3} {'plan':72} {'iter ms':>10} {'tokens/s':>10} {'/GPU':>8} {'MFU %':>6} "
            f"{'GiB/GPU':>8}  verdict"
        )
        lines = [
            f"{self.model.name} ({self.model.params_b:.1f}B) on {self.cluster}, batch {self.batch} x "
            f"{self.seq} tokens",
            head,
        ]
        for rank, c in enumerate(self.candidates[:top], 1):
            plan = f"{c.strategy},mbs={c.micro_batch}"
            verdict = ("OUT OF MEMORY" if c.oom else "fits") + ("" if c.exact else " (analytic)")
            lines.append(
                f"{rank:3d} {plan[:72]:72} {c.iteration_ms:10.1f} {c.tokens_per_s:10.0f} "
                f"{c.tokens_per_s_per_gpu:8.1f} {c.mfu_pct:6.1f} {c.memory_gib:8.1f}  {verdict}"
            )
        fits = sum(not c.oom for c in self.candidates)
        skipped = ", ".join(f"{n} {why}" for why, n in self.skipped.most_common()) or "none"
        lines.append(f"{len(self.candidates)} plans ({fits} fit in memory); skipped: {skipped}")
        lines.append(
            f"capture (trace and price) {self.capture_s:.1f} s, search {self.search_s:.1f} s; analytic vs "
            f"simulated on the simulated plans: rank correlation {self.rank_correlation:.2f}, max gap "
            f"{self.max_gap * 100:.1f}%"
        )
        return "\n".join(lines)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (ties broken by order); nan for fewer than two values."""
    if len(a) < 2:
        return math.nan

    def ranks(x: Sequence[float]) -> list[int]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        out = [0] * len(x)
        for r, i in enumerate(order):
            out[i] = r
        return out

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))
