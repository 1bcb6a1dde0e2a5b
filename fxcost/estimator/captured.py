"""One traced step kept as its distinct nodes, priced at any GPU, batch and precision.

A transformer's twelve identical layers are priced once and counted twelve times: :class:`Captured`
keeps each distinct kernel node with its count per phase and its sizes as polynomials in the batch
(:mod:`fxcost.estimator.symbolic`). A new GPU is one vectorized prediction over those nodes; a new
batch size evaluates their size polynomials first; a new precision retypes their float32 tensors.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fxcost.capture import FxcostBackend, LossFn, batch_of, captured_report, trace_without_running
from fxcost.capture.options import CaptureOptions
from fxcost.cost_models import CostModel, NodeBatch, predict_batch
from fxcost.cost_models.eager import HOST_MS, kernel_times
from fxcost.cost_models.heads import spec_sheet_caveat
from fxcost.cost_models.heads.intervals import node_classes
from fxcost.cost_models.heads.step_intervals import step_bounds, step_sums
from fxcost.cost_models.heads.tensor_work import layout_works
from fxcost.estimator.symbolic import BatchSymbols, NodeSizes, NotPolynomial, Poly, node_sizes
from fxcost.gpus import Device, get_device
from fxcost.lowering import is_matmul_class
from fxcost.lowering.fusion import FusedKernel, fuse
from fxcost.lowering.fusion_layout import channels_last
from fxcost.precision import Precision, PrecisionArg, itemsize, parse_precision
from fxcost.propagate import check_execution, fused_kernel_ms, phase_totals, replay_ends
from fxcost.propagate.compiled import kernel_work, without_layout_transposes
from fxcost.records import META_KEY, PHASES, NodeCost
from fxcost.report import Report

__all__ = ["Captured", "Cost"]


@dataclass(frozen=True)
class Cost:
    """Predicted time of one step on one device. ``float(cost)`` is ``cost.ms``.

    ``ms`` is the step in ``execution``, as ``Report.step_ms_in`` of the same step (forward, loss,
    backward): ``"eager"`` the kernels back to back, the host issuing them (``Report.eager_ms``);
    ``"compiled"`` Inductor's fused kernels; ``"cudagraphs"`` no host time. ``fw_ms`` and ``bw_ms``
    split it where each phase's last kernel ends (the optimizer's share is the rest). ``isolated_ms``
    is the sum of the nodes' isolated times (``Report.total_ms``).

    ``low_ms`` and ``high_ms`` bound ``ms`` by the nominal 80% interval of its origin-free predictions
    (:mod:`fxcost.cost_models.heads.step_intervals`); equal to ``ms`` where no interval is known.
    ``caveat`` says where the prediction rests on spec sheets alone (empty otherwise).
    """

    ms: float
    fw_ms: float
    bw_ms: float
    device: str
    low_ms: float = math.nan
    high_ms: float = math.nan
    caveat: str = ""
    isolated_ms: float = math.nan
    execution: str = "eager"

    def __float__(self) -> float:
        return self.ms


class Captured:
    """One traced step, kept as its distinct nodes with their counts per phase and size polynomials.

    Attributes:
        report: the step as traced (nodes at the traced batch, no predictions).
        batch: the traced batch (leading dimension of the first input), None if there is none.
        graph_hash: a stable hash of the traced graphs (ops, dtypes, arguments, symbolic sizes): equal
            for two models that run the same ATen graph.
        nodes: the distinct nodes that launch kernels, at the traced batch.
        index: for each node of ``report``, the position of its distinct node (None: no kernel).
        counts: how often each distinct node runs in each phase, shape ``(len(nodes), 3)`` for
            ``fw``, ``bw``, ``opt``.
    """

    _MEMO = 256  # priced (batch, precision) node sets kept per capture

    def __init__(
        self,
        report: Report,
        sizes: list[NodeSizes | None],
        symbols: BatchSymbols,
        chain: Sequence[CostModel],
    ) -> None:
        self.report = report
        self.batch = report.batch
        self.symbols = symbols
        self.chain = list(chain)
        distinct: dict[tuple[Any, ...], int] = {}
        counts: list[list[int]] = []
        self.nodes: list[NodeCost] = []
        self.index: list[int | None] = []  # per report node, its distinct node (None: no kernel)
        kept: list[NodeSizes] = []  # the distinct nodes' sizes
        for node, size in zip(report.nodes, sizes, strict=True):
            if size is None:  # views and tuple access cost nothing anywhere
                self.index.append(None)
                continue
            signature = _signature(node, size)
            if signature not in distinct:
                distinct[signature] = len(self.nodes)
                self.nodes.append(node)
                kept.append(size)
                counts.append([0, 0, 0])
            counts[distinct[signature]][PHASES.index(node.phase)] += 1
            self.index.append(distinct[signature])
        self.counts = np.asarray(counts, dtype=np.float64).reshape(-1, len(PHASES))
        # The distinct node of each kernel the step issues, in issue order (phase by phase), and its phase.
        issued = [(i, PHASES.index(n.phase)) for i, n in zip(self.index, report.nodes, strict=True)
                  if i is not None]  # fmt: skip
        self._issued = np.array([i for i, _ in issued], dtype=np.intp)
        self._issued_phase = np.array([p for _, p in issued], dtype=np.intp)
        self.graph_hash = hashlib.sha256(repr(sorted(distinct.items())).encode()).hexdigest()[:16]
        self._polys = _PolyTable(kept)
        self._batches: OrderedDict[tuple[int | None, Precision | None], NodeBatch] = OrderedDict()
        self._costs: dict[tuple[int | None, Precision | None, Device, str], Cost] = {}
        self._fused: tuple[list[FusedKernel], np.ndarray, bool] | None = None  # kernels, phases, layout
        self._lock = threading.Lock()

    @classmethod
    def trace(
        cls,
        model: torch.nn.Module | Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        train: bool,
        loss_fn: LossFn,
        chain: Sequence[CostModel],
    ) -> Captured:
        """Trace one step of ``model`` without running it, its batch dimension symbolic."""
        batch = batch_of(args, kwargs)
        # A batch of 1 is traced as a constant by Dynamo (0/1 specialization): nothing to gain.
        dynamic = batch if batch is not None and batch > 1 else None
        trace_only = CaptureOptions(devices=(), measure=False)  # predicts for no device
        backend, shape_envs = trace_without_running(
            model, args, kwargs, lambda run: FxcostBackend(trace_only, run_graphs=run),
            train=train, loss_fn=loss_fn, dynamic_batch=dynamic,
        )  # fmt: skip
        report = captured_report(backend, args, kwargs)
        # Each Dynamo frame (graph break) has its own symbols; the batch is tracked in one frame only.
        symbols = BatchSymbols(shape_envs[0] if len(shape_envs) == 1 else None)
        try:
            sizes = _sizes_of(backend, report, symbols)
        except NotPolynomial:
            symbols = BatchSymbols(None)
            sizes = _sizes_of(backend, report, symbols)
        return cls(report, sizes, symbols, chain)

    def holds_at(self, batch: int) -> bool:
        """Whether the traced graph is the step's graph at ``batch``."""
        return batch == self.batch or self.symbols.valid_at(batch)

    def cost(
        self, device: str | Device, batch_size: int | None = None, precision: PrecisionArg | str = None,
        execution: str = "eager",
    ) -> Cost:  # fmt: skip
        """The step's predicted time on ``device`` at ``batch_size`` (the traced batch if None), in
        ``precision`` (None: the captured dtypes), run in ``execution`` (``"eager"``, ``"compiled"``,
        ``"cudagraphs"``)."""
        target = get_device(device)
        precision = parse_precision(precision)
        check_execution(execution)
        batch_size = self._relative(batch_size)
        key = (batch_size, precision, target, execution)  # the Device: a GPU changed in place is priced anew
        with self._lock:
            known = self._costs.get(key)
        if known is not None:
            return known
        batch = self._node_batch(batch_size, precision)
        ms, sources = predict_batch(batch, self.chain, target)
        isolated = sum(phase_totals(ms, self.counts).values())
        # The step (Report.step_ms_in), split where each phase's last kernel ends.
        per_node = kernel_times(batch, ms, sources, target)
        launches = np.ones(len(self._issued))  # each kernel's launches, each costing the host HOST_MS
        if execution == "compiled":
            kernels, issued_phase, launches = self._compiled(batch, per_node, sources, target)
        else:
            kernels, issued_phase = per_node[self._issued], self._issued_phase
        known = np.isfinite(kernels)
        host = (0.0 if execution == "cudagraphs" else HOST_MS) * launches[known]
        ends, phases = replay_ends(kernels[known], host), issued_phase[known]
        phase_end = [float(ends[phases <= p].max(initial=0.0)) for p in range(len(PHASES))]
        step = phase_end[-1]
        # The interval of the isolated sum, scaled as the eager step scales it (Report.eager_interval_ms).
        scale = step / isolated if isolated > 0 else 1.0
        heads = np.asarray(sources) == "mlp"  # the classes depend on which nodes the heads priced alone
        classes = batch.derived(
            ("interval.classes", heads.tobytes()), lambda: node_classes(batch.nodes, sources)
        )
        sums = step_sums(batch.nodes, ms, sources, self.counts.sum(axis=1), target, classes=classes)
        bounds = step_bounds(sums)
        low, high = (scale * b for b in bounds)
        result = Cost(ms=step, fw_ms=phase_end[0], bw_ms=phase_end[1] - phase_end[0], device=target.name,
                      low_ms=low, high_ms=high, caveat=spec_sheet_caveat(target),
                      isolated_ms=isolated, execution=execution)  # fmt: skip
        with self._lock:
            self._costs[key] = result
        return result

    def _compiled(
        self, batch: NodeBatch, per_node: np.ndarray, sources: np.ndarray, device: Device
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The compiled step's kernel times in run order, each kernel's phase and its launches:
        Inductor's fusion of the traced step, its kernels priced at the sizes of ``batch``."""
        if self._fused is None:  # the step's structure: the same at every batch and precision
            kernels = fuse(self.report.nodes)
            # The phase of the step's own node: a distinct node stands for equal nodes of every phase.
            opened = [PHASES.index(self.report.nodes[k.members[0]].phase) for k in kernels]
            self._fused = kernels, np.array(opened, dtype=np.intp), channels_last(self.report.nodes)
        kernels, phases, layout = self._fused
        nodes = [
            n if i is None else batch.nodes[i] for n, i in zip(self.report.nodes, self.index, strict=True)
        ]
        if layout:
            works = batch.derived("compiled.layout", lambda: layout_works(batch.nodes))  # on every GPU
            per_node = without_layout_transposes(batch.nodes, per_node, device, sources=list(sources),
                                                 works=works)  # fmt: skip
        eager = np.array([np.nan if i is None else per_node[i] for i in self.index], dtype=np.float64)
        work = batch.derived("compiled.work", lambda: kernel_work(nodes, kernels))  # the same on every GPU
        times = fused_kernel_ms(nodes, kernels, eager, device, self.chain, channels_last=layout, work=work)
        return times, phases, work.launches

    def _relative(self, batch_size: int | None) -> int | None:
        """None for the traced batch: one cache entry, and no polynomials to evaluate there."""
        return None if batch_size == self.batch else batch_size

    def node_batch(self, batch_size: int | None = None, precision: PrecisionArg | str = None) -> NodeBatch:
        """The distinct nodes at ``batch_size`` in ``precision``, as the columns cost models read."""
        return self._node_batch(self._relative(batch_size), parse_precision(precision))

    def _node_batch(self, batch_size: int | None, precision: Precision | None) -> NodeBatch:
        """:meth:`node_batch` of a parsed precision and a batch relative to the traced one."""
        if batch_size is not None and not self.holds_at(batch_size):
            raise ValueError(
                f"the step traced at batch {self.batch} does not hold at batch {batch_size}; "
                "Estimator.cost traces it again there"
            )
        key = (batch_size, precision)
        with self._lock:
            batch = self._batches.get(key)
            if batch is not None:
                self._batches.move_to_end(key)
                return batch
        if batch_size is None and precision is None:
            nodes = self.nodes
        else:  # at the traced batch the polynomials give the traced sizes (constants if static)
            at = batch_size if batch_size is not None else (self.batch or 0)
            nodes = self._polys.nodes_at(self.nodes, at, precision)
        batch = NodeBatch.of(nodes)
        with self._lock:
            self._batches[key] = batch
            while len(self._batches) > self._MEMO:
                self._batches.popitem(last=False)
        return batch


class _PolyTable:
    """The size polynomials of the distinct nodes as arrays, evaluated at a batch in one go."""

    def __init__(self, sizes: Sequence[NodeSizes]) -> None:
        dims: list[Poly] = []
        # Per node, where each of its input and output shapes lies in the flat list of dimensions.
        self.layout: list[tuple[list[slice], list[slice]]] = []
        for size in sizes:
            spans = []
            for shape in (*size.in_shapes, *size.out_shapes):
                spans.append(slice(len(dims), len(dims) + len(shape)))
                dims.extend(shape)
            self.layout.append((spans[: len(size.in_shapes)], spans[len(size.in_shapes) :]))
        self.dims = _matrix(dims)
        self.flops = _matrix([s.flops or (0,) for s in sizes])
        self.flops_known = [s.flops is not None for s in sizes]
        # Traffic of float32 tensors and of the rest, apart: a precision rescales the first.
        self.read = [_matrix([s.bytes_read[part] for s in sizes]) for part in (0, 1)]
        self.written = [_matrix([s.bytes_written[part] for s in sizes]) for part in (0, 1)]

    def nodes_at(
        self, nodes: Sequence[NodeCost], batch: int, precision: Precision | None = None
    ) -> list[NodeCost]:
        """``nodes`` at ``batch``; in ``precision``, their float32 tensors retyped (and fp32 matmuls
        on TF32 for ``"tf32"``)."""
        dtype = precision.dtype if precision is not None else "float32"
        scale = itemsize(dtype) / itemsize("float32")
        dims = _at(self.dims, batch).tolist()
        flops = _at(self.flops, batch).tolist()
        read, written = (np.rint(_at(fp32, batch) * scale + _at(other, batch)).astype(np.int64).tolist()
                         for fp32, other in (self.read, self.written))  # fmt: skip
        out = []
        for i, (node, (ins, outs)) in enumerate(zip(nodes, self.layout, strict=True)):
            changes: dict[str, Any] = {
                "in_shapes": [tuple(dims[span]) for span in ins],
                "out_shapes": [tuple(dims[span]) for span in outs],
                "flops": flops[i] if self.flops_known[i] else None,
                "bytes_read": read[i],
                "bytes_written": written[i],
            }
            if precision is not None:
                changes["in_dtypes"] = [dtype if d == "float32" else d for d in node.in_dtypes]
                changes["out_dtypes"] = [dtype if d == "float32" else d for d in node.out_dtypes]
                changes["tf32"] = precision.tf32 and is_matmul_class(node.op) and "float32" in node.out_dtypes
            out.append(node.replace(**changes))
        return out


def _sizes_of(backend: FxcostBackend, report: Report, symbols: BatchSymbols) -> list[NodeSizes | None]:
    """Size polynomials of the report's kernel nodes (None for nodes that launch none)."""
    nodes = [n for gm in backend.graph_modules() for n in gm.graph.nodes if META_KEY in n.meta]
    return [
        node_sizes(n, symbols, flops_known=record.flops is not None) if record.has_kernel else None
        for n, record in zip(nodes, report.nodes, strict=True)
    ]


def _signature(node: NodeCost, size: NodeSizes) -> tuple[Any, ...]:
    """What a node's cost depends on: two nodes with the same signature cost the same everywhere."""
    return (
        *(node.op, tuple(node.in_dtypes), tuple(node.out_dtypes), repr(node.args), node.has_kernel),
        *(node.tf32, size.in_shapes, size.out_shapes, size.flops, size.bytes_read, size.bytes_written),
    )


def _matrix(polys: Sequence[Poly]) -> np.ndarray:
    """Polynomials as rows of coefficients (lowest power first), zero-padded to one width."""
    width = max((len(p) for p in polys), default=1)
    out = np.zeros((len(polys), width), dtype=np.int64)
    for i, p in enumerate(polys):
        out[i, : len(p)] = p
    return out


def _at(matrix: np.ndarray, batch: int) -> np.ndarray:
    return matrix @ (batch ** np.arange(matrix.shape[1], dtype=np.int64))
