"""How sure the heads are on a GPU they were not fit on: prediction intervals from held-out GPUs' errors.

``benchmarks/generalization.py`` retrains the heads with each training GPU left out and records, per
op class, how far the left-out GPU's measurements fell from the predictions (``log(measured /
predicted)``). Quantiles of those errors make an interval around any origin-free prediction of that
class: ``[predicted * e^low, predicted * e^high]``. Most of a new GPU's error is one shift shared by
all its ops (its sustained clock, its achieved bandwidth), so the central 80% of errors pooled over
GPUs covers a GPU left out less than 80% of the time; :meth:`Intervals.calibrated` widens each
class's share until, GPU by GPU, the interval built from the *other* GPUs' errors covers the nominal
share. The shipped file, ``cost_models/weights/intervals.json``, comes from the shared data only.

The classes are the heads', but for one split (:func:`interval_class`): a GEMM reducing over
:data:`LONG_REDUCTION` elements or more is a class of its own, ``linear_long``: the measured ones ran
up to three times slower than their price on some GPUs (the P100's most; :mod:`fxcost.train.gemm`
reads them as TLB misses over long rows), an upper tail that, pooled with the rest, had widened every
GEMM's interval to 3.4 times its price.

A step's interval (a report's totals, :class:`~fxcost.estimator.Cost`'s ``low_ms`` and ``high_ms``,
the simulator's compute) is not the sum of these bounds: :mod:`~fxcost.cost_models.heads.step_intervals`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from fxcost._io import atomic_write
from fxcost.cost_models.heads.features import LOWERED, head_of
from fxcost.cost_models.heads.model import default_heads
from fxcost.gpus import Device
from fxcost.lowering.attention import ATTENTION_OPS
from fxcost.lowering.composite import COMPOSITE_OPS, composite_head
from fxcost.lowering.nodes import gemm_dims
from fxcost.records import NodeCost

__all__ = ["LONG_REDUCTION", "NOMINAL", "Intervals", "attention_high", "interval_class", "node_bounds",
           "node_classes", "shipped_intervals", "write_intervals"]  # fmt: skip

NOMINAL = 0.8
"""The share of a GPU nobody measured's rows an interval is meant to hold."""

LONG_REDUCTION = 8192
"""Reduction length (elements) from which a GEMM node's interval is ``linear_long``'s: where the
measured GEMMs' pace starts to fall on the GPUs that show it. Those are fp32 forward products, whose
operands' rows run along the reduction (32 KB rows here); that a weight gradient reducing over as
many tokens, or a bf16 GEMM, shares their tail is an extrapolation."""

_GEMM_OPS = frozenset({"aten.mm.default", "aten.addmm.default"})


def interval_class(node: NodeCost, head: str) -> str:
    """The class whose errors bound ``node``, which ``head`` predicts: ``head``, or ``linear_long`` for
    a GEMM (``mm``, ``addmm``) reducing over :data:`LONG_REDUCTION` elements or more. Work lowered to
    GEMMs (an RNN, MoE experts) keeps its head's."""
    if head != "linear" or node.op not in _GEMM_OPS:
        return head
    try:
        reduction = gemm_dims(node)[3]
    except (IndexError, KeyError, TypeError, ValueError):  # shapes this reading does not know
        return head
    return "linear_long" if reduction >= LONG_REDUCTION else head


@dataclass(frozen=True)
class Intervals:
    """Per interval class (:func:`interval_class`), the low and high quantiles of
    ``log(measured / predicted)`` on left-out GPUs.

    Attributes:
        quantiles: class -> (low, high) log error; a prediction ``p`` spans ``[p e^low, p e^high]``.
        nominal: the share of errors between the two quantiles.
        rows: class -> the number of left-out rows the quantiles come from.
        step_scale: how far a step's interval reaches of its nodes' summed bounds, in log distance
            from the prediction, for the nodes of ``drawn_classes``
            (:mod:`~fxcost.cost_models.heads.step_intervals`); 1, the summed bounds, where none was
            calibrated.
        drawn_classes: the classes a step's interval draws in: those of the nodes (fused attention
            aside) of the runs ``step_scale`` was calibrated on.
        step_runs: how many runs that was.
    """

    quantiles: Mapping[str, tuple[float, float]]
    nominal: float = NOMINAL
    rows: Mapping[str, int] | None = None
    step_scale: float = 1.0
    drawn_classes: tuple[str, ...] = ()
    step_runs: int = 0

    @classmethod
    def from_errors(cls, errors: Mapping[str, np.ndarray], nominal: float = NOMINAL) -> Intervals:
        """The central ``nominal`` share of each class's log errors."""
        if not 0 < nominal < 1:
            raise ValueError(f"nominal coverage must lie in (0, 1), got {nominal}")
        quantiles = {head: _central(np.asarray(e), nominal) for head, e in errors.items() if len(e)}
        return cls(quantiles, nominal, {head: len(e) for head, e in errors.items() if len(e)})

    @classmethod
    def calibrated(
        cls, errors: Mapping[str, Mapping[str, np.ndarray]], nominal: float = NOMINAL
    ) -> Intervals:
        """Intervals that cover ``nominal`` of a left-out GPU's rows: ``errors`` maps each GPU to its
        log errors per op class, each from heads fit without that GPU.

        Per class, the central share of the pooled errors is the smallest (on a grid of 200 shares
        from 50% to 99.9%, those at or above ``nominal``) whose leave-one-GPU-out coverage reaches
        ``nominal`` on average: each GPU's errors against the interval of the other GPUs' errors.
        """
        heads = sorted({h for per_gpu in errors.values() for h in per_gpu})
        quantiles, rows = {}, {}
        for head in heads:
            by_gpu = {g: np.asarray(e[head]) for g, e in errors.items() if len(e.get(head, ()))}
            if not by_gpu:
                continue
            share = _share_for(by_gpu, nominal)
            pooled = np.concatenate(list(by_gpu.values()))
            quantiles[head] = _central(pooled, share)
            rows[head] = len(pooled)
        return cls(quantiles, nominal, rows)

    def bounds(self, head: str, predicted: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """The interval of predictions of class ``head`` (NaN bounds for a class without errors)."""
        low, high = self.quantiles.get(head, (np.nan, np.nan))
        p = np.asarray(predicted, dtype=np.float64)
        return p * np.exp(low), p * np.exp(high)

    def to_json(self) -> str:
        return json.dumps({"nominal": self.nominal, "quantiles": dict(self.quantiles),
                           "rows": dict(self.rows or {}), "step_scale": self.step_scale,
                           "drawn_classes": list(self.drawn_classes), "step_runs": self.step_runs},
                          indent=1)  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Intervals:
        raw = json.loads(text)
        quantiles = {head: (float(low), float(high)) for head, (low, high) in raw["quantiles"].items()}
        return cls(quantiles, float(raw["nominal"]), {k: int(v) for k, v in raw.get("rows", {}).items()},
                   float(raw.get("step_scale", 1.0)), tuple(raw.get("drawn_classes", ())),
                   int(raw.get("step_runs", 0)))  # fmt: skip


_SHARES = np.linspace(0.5, 0.999, 200)


def _central(errors: np.ndarray, share: float) -> tuple[float, float]:
    tail = (1 - share) / 2
    return float(np.quantile(errors, tail)), float(np.quantile(errors, 1 - tail))


def _share_for(by_gpu: Mapping[str, np.ndarray], nominal: float) -> float:
    """The smallest central share whose leave-one-GPU-out coverage reaches ``nominal`` (with one GPU,
    nothing to leave out: ``nominal`` itself)."""
    if len(by_gpu) < 2:
        return nominal
    for share in _SHARES[nominal <= _SHARES]:
        covered = []
        for gpu, mine in by_gpu.items():
            low, high = _central(np.concatenate([e for g, e in by_gpu.items() if g != gpu]), share)
            covered.append(float(((mine >= low) & (mine <= high)).mean()))
        if np.mean(covered) >= nominal:
            return float(share)
    return float(_SHARES[-1])


def write_intervals(intervals: Intervals, path: str | Path) -> Path:
    """Write ``intervals`` as JSON to ``path`` (a file, or a directory to hold ``intervals.json``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "intervals.json"
    atomic_write(path, intervals.to_json().encode())
    return path


@functools.cache
def shipped_intervals() -> Intervals | None:
    """The intervals shipped with fxcost, None if there are none."""
    path = resources.files("fxcost.cost_models").joinpath("weights", "intervals.json")
    return Intervals.from_json(path.read_text()) if path.is_file() else None


def node_bounds(
    nodes: Sequence[NodeCost],
    ms: np.ndarray,
    sources: Sequence[str | None] | np.ndarray,
    intervals: Intervals | None = None,
    device: Device | None = None,
    classes: Sequence[str | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The low and high ends of each node's predicted ``ms`` (NaN where there is none); ``classes``:
    the nodes' :func:`node_classes`, where the caller has them.

    A node the heads predicted (``sources[i] == "mlp"``) spans its class's interval; a node priced
    as the work it lowers to, the GEMM one (an RNN, attention, MoE experts) or the elementwise one
    (a memory-bound op).
    Nodes other models predicted (a measured origin scaled, the roofline's fallback) add their
    prediction to both ends: no interval is known for them. ``intervals`` defaults to the shipped
    ones; without any, both ends are the prediction (but a fused attention node's high end, below).

    A fused attention kernel (priced on ``device``, where given) reaches at least to its time with
    nothing overlapped (:meth:`~fxcost.cost_models.heads.model.Heads.attention_spread_ms`, at the
    shipped heads' rates). No measurement of one is in the training data: the GEMMs' interval says
    nothing of how well its stages overlap. On the recorded H100 kernels
    (``benchmarks/attention_nodes.py``) all but one of the traces' kernels (a forward with dropout,
    3% faster) ran slower than its price; the ``bmm`` interval held 67% of the traces' nodes, this
    one 83%.
    """
    intervals = intervals or shipped_intervals()
    ms = np.asarray(ms, dtype=np.float64)
    low, high = np.ones(len(ms)), np.ones(len(ms))
    if intervals is not None:
        for i, cls in enumerate(node_classes(nodes, sources) if classes is None else classes):
            if cls is None:
                continue
            found = intervals.quantiles.get(cls) or intervals.quantiles.get(_HEAD_OF_CLASS.get(cls, cls))
            if found is not None:  # an interval file without the class: its head's
                low[i], high[i] = (math.exp(q) for q in found)
    if device is not None:
        heads = default_heads()
        for i, (node, source) in enumerate(zip(nodes, sources, strict=True)):
            if source == "mlp" and node.op in ATTENTION_OPS:
                high[i] = attention_high(high[i], ms[i], heads.attention_spread_ms(node, device))
    return ms * low, ms * high


_HEAD_OF_CLASS = {"linear_long": "linear"}


def node_classes(nodes: Sequence[NodeCost], sources: Sequence[str | None] | np.ndarray) -> list[str | None]:
    """The interval class of each node (:func:`interval_class`), None for one the heads did not
    predict (``sources[i] != "mlp"``) or that no head predicts: work lowered to GEMMs (RNNs,
    attention, MoE) takes the GEMMs' class, memory-bound ops and passes the elementwise one."""
    classes: list[str | None] = []
    for node, source in zip(nodes, sources, strict=True):
        head = head_of(node) if source == "mlp" else None
        if head == LOWERED:
            head = composite_head(node.op) if node.op in COMPOSITE_OPS else "ew"
        classes.append(None if head is None else interval_class(node, head))
    return classes


def attention_high(high: float, ms: float, spread_ms: float) -> float:
    """The high end of a fused attention kernel's predicted ``ms`` as a factor of it: its class's
    ``high``, or its time with nothing overlapped (``ms + spread_ms``), whichever is later."""
    return max(high, 1.0 + spread_ms / ms) if ms > 0 else high
