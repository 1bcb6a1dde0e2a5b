"""The report: every node of a captured training step with its measured and predicted cost.

A :class:`Report` is also the trace format: ``save`` writes it as versioned JSON (gzip when the path
ends in ``.gz``) and ``load`` reads it back on any machine, so a trace recorded on a GPU can be
predicted for other GPUs on a CPU-only laptop.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from fxcost import propagate
from fxcost._io import atomic_write
from fxcost._version import __version__
from fxcost.cost_models import CostModel, spec_name
from fxcost.cost_models import predict as predict_nodes
from fxcost.cost_models.heads.step_intervals import step_bounds, step_sums
from fxcost.gpus import Device, UnknownDeviceError, get_device
from fxcost.lowering.fusion import FusedKernel, fuse
from fxcost.lowering.fusion_layout import channels_last
from fxcost.propagate import Execution, KernelSpan, Pipeline, Span, check_execution
from fxcost.records import PHASES, GraphRecord, NodeCost, Phase
from fxcost.report.exports import chrome_trace, csv_text, dataframe

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SCHEMA_VERSION", "Report", "TraceFormatError"]

SCHEMA_VERSION = 1


class TraceFormatError(ValueError):
    """A trace file that is not a readable fxcost trace of this schema version."""


@dataclass
class Report:
    """Per-node costs of one captured step, and their totals.

    Attributes:
        nodes: one record per call node, graph after graph.
        graphs: the captured graphs (forward, backward, optimizer; several after graph breaks).
        devices: canonical names of the GPUs predicted.
        origin: the device the step was captured (and measured) on: ``"cpu"`` or a CUDA device name.
        model: the cost model that made the predictions.
        step_ms: measured time of the whole eager step on the origin, when it was timed.
        torch_version: PyTorch version the trace was captured with.
        batch: the batch size of the step (the leading dimension of its first tensor input), if known.
        seqlen: tokens per sequence of a step whose first input is token ids, else None.
        name: what was captured, for printouts: the model's class name (``fxcost.profile``) or what
            the command line was given (``resnet50``); may be empty.
        apart: graphs captured but not run in the reported step (a branch it did not take); their
            nodes are not in ``nodes``.
        execution: how the step is to run, for :meth:`step_ms_in` and printouts: ``"eager"``,
            ``"compiled"`` (``torch.compile`` with Inductor) or ``"cudagraphs"``.
        routing: the routing a mixture-of-experts model was captured under, in words (``HFStep.routing``:
            meta tensors carry no token values); "" for a model without experts or with real routing.
    """

    nodes: list[NodeCost] = field(default_factory=list)
    graphs: list[GraphRecord] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    origin: str = "cpu"
    model: str = "auto"
    step_ms: float | None = None
    torch_version: str = ""
    batch: int | None = None
    seqlen: int | None = None
    name: str = ""
    apart: list[GraphRecord] = field(default_factory=list)
    execution: Execution = "eager"
    routing: str = ""

    def __post_init__(self) -> None:
        check_execution(self.execution)

    # -- totals ----------------------------------------------------------------------------------

    def total_ms(self, device: str | Device, phase: Phase | None = None) -> float:
        """Predicted milliseconds on ``device`` (all nodes, or one phase: ``"fw"``, ``"bw"``, ``"opt"``).

        Nodes without a prediction are left out; ``coverage(device)`` says how many there are.
        """
        return propagate.total_ms(self._phase(phase), self._predicted_name(device))

    def eager_ms(
        self, device: str | Device, phase: Phase | None = None, host_ms: float | None = None
    ) -> float:
        """Predicted ms of the step run eagerly on ``device``: the nodes' kernels back to back, without
        the per-op overhead of timing each alone, and waiting for the host where it issues them slower
        than they run (see :mod:`fxcost.propagate.eager`). ``total_ms`` is the sum of isolated times.
        ``host_ms`` per op defaults to what the origin's measured step implies, else 10 us."""
        spans = self.timeline(device, phase, host_ms)
        return spans[-1].end_ms if spans else 0.0

    def step_ms_in(self, device: str | Device, phase: Phase | None = None, execution: str | None = None,
                   host_ms: float | None = None) -> float:  # fmt: skip
        """Predicted ms of the step on ``device`` run in ``execution`` (default: the report's own):
        :meth:`eager_ms`, :meth:`compiled_ms`, or ``"cudagraphs"``: the eager step without host time."""
        mode = check_execution(execution or self.execution)
        if mode == "compiled":
            return self.compiled_ms(device, phase, host_ms)
        return self.eager_ms(device, phase, 0.0 if mode == "cudagraphs" else host_ms)

    def compiled_ms(self, device: str | Device, phase: Phase | None = None,
                    host_ms: float | None = None) -> float:  # fmt: skip
        """Predicted ms of the step compiled with Inductor on ``device``: its fused kernels back to back,
        the host issuing each (see :mod:`fxcost.propagate.compiled`)."""
        spans = self.compiled_timeline(device, phase, host_ms)
        return spans[-1].end_ms if spans else 0.0

    def fused_kernels(self) -> list[FusedKernel]:
        """The kernels Inductor runs for the step (:func:`fxcost.lowering.fusion.fuse`); their
        ``members`` index ``nodes``."""
        return fuse(self.nodes)

    def compiled_timeline(
        self, device: str | Device, phase: Phase | None = None, host_ms: float | None = None
    ) -> list[KernelSpan]:
        """The compiled step's kernels (of one phase) on ``device``'s timeline, in order."""
        target, origin = get_device(self._predicted_name(device)), self.origin_device()
        kernels = [k for k in self.fused_kernels() if phase in (None, self.nodes[k.members[0]].phase)]
        layout = channels_last(self.nodes)
        eager = propagate.node_kernel_ms(self.nodes, target, on_origin=origin == target, channels_last=layout)
        ms = propagate.fused_kernel_ms(self.nodes, kernels, eager, target, self.model, origin,
                                       channels_last=layout)  # fmt: skip
        return propagate.compiled_timeline(self.nodes, kernels, ms, self.pipeline(), host_ms=host_ms)

    def interval_ms(self, device: str | Device, phase: Phase | None = None) -> tuple[float, float]:
        """The nominal 80% interval of :meth:`total_ms` on ``device``: each origin-free node's interval
        from the heads' errors on GPUs they were not fit on, added up and drawn in as a step's errors
        are (:mod:`~fxcost.cost_models.heads.step_intervals`); nodes of other models add their
        prediction to both ends."""
        name = self._predicted_name(device)
        nodes = self._phase(phase)
        ms = np.array([n.pred_ms.get(name) or 0.0 for n in nodes])
        sources = [n.pred_source.get(name) for n in nodes]
        return step_bounds(step_sums(nodes, ms, sources, device=get_device(name)))

    def eager_interval_ms(
        self, device: str | Device, phase: Phase | None = None, eager_ms: float | None = None
    ) -> tuple[float, float]:
        """The interval of :meth:`eager_ms` (pass it as ``eager_ms`` where already computed):
        :meth:`interval_ms` scaled as the eager step scales the sum."""
        total = self.total_ms(device, phase)
        eager = self.eager_ms(device, phase) if eager_ms is None else eager_ms
        low, high = self.interval_ms(device, phase)
        scale = eager / total if total > 0 else 1.0
        return low * scale, high * scale

    def timeline(
        self, device: str | Device, phase: Phase | None = None, host_ms: float | None = None
    ) -> list[Span]:
        """The kernel nodes (of one phase) on ``device``'s predicted eager timeline, in order; the
        host time per op is ``host_ms``, else the one :meth:`pipeline` finds."""
        target = get_device(self._predicted_name(device))  # a device never predicted is an error
        on_origin = self.origin_device() == target
        return propagate.timeline(self._phase(phase), target, self.pipeline(), host_ms=host_ms,
                                  on_origin=on_origin)  # fmt: skip

    def pipeline(self) -> Pipeline:
        """The host time per op and in-step kernel scale the origin's measured step implies
        (:func:`fxcost.propagate.origin_pipeline`; the defaults without a GPU origin or a step)."""
        return propagate.origin_pipeline(self.nodes, self.origin_device(), self.step_ms)

    def to_chrome_trace(self, path: str | os.PathLike[str], device: str | Device) -> Path:
        """Write the predicted eager step on ``device`` as a Chrome trace JSON (Perfetto,
        chrome://tracing): the host issuing each op and the GPU stream running it."""
        payload = json.dumps(chrome_trace(self, self._predicted_name(device))).encode()
        return atomic_write(path, payload)

    def critical_path_ms(
        self, device: str | Device, phase: Phase | None = None, host_ms: float | None = None
    ) -> float:
        """The eager step of :meth:`eager_ms` with every kernel started as soon as the host has issued
        it and its inputs are ready, on as many streams as it takes (graph after graph): the bound
        multi-stream execution meets, never above :meth:`eager_ms`. Nodes without recorded inputs
        wait only for the host."""
        target = get_device(self._predicted_name(device))
        return propagate.critical_path_ms(self._phase(phase), target, self.pipeline(), host_ms=host_ms,
                                          on_origin=self.origin_device() == target)  # fmt: skip

    def origin_ms(self, phase: Phase | None = None) -> float | None:
        """Sum of the measured node times on the origin device, or None if nothing was measured."""
        times = [n.origin_ms for n in self._phase(phase) if n.origin_ms is not None]
        return sum(times) if times else None

    def coverage(self, device: str | Device) -> float:
        """Fraction of kernel-launching nodes a model of their op predicts on ``device``: a node only the
        roofline fallback priced is not covered (:func:`fxcost.propagate.coverage`)."""
        return propagate.coverage(self.nodes, self._predicted_name(device))

    @property
    def measured_ms(self) -> float | None:
        """The reference time of the whole step: the eager step if timed, else the graphs timed whole."""
        if self.step_ms is not None:
            return self.step_ms
        times = [g.measured_ms for g in self.graphs]
        return sum(times) if times and None not in times else None  # type: ignore[arg-type]

    @property
    def capture_fidelity(self) -> float | None:
        """Sum of the isolated node times over the measured time of the whole step (1.0 is perfect)."""
        nodes, whole = self.origin_ms(), self.measured_ms
        if nodes is None or not whole:
            return None
        return nodes / whole

    def by_module(self, device: str | Device, depth: int | None = None) -> dict[str, dict[str, float]]:
        """Predicted ms on ``device`` rolled up by module path: ``{module: {"fw": ms, "bw": ms, ...}}``.

        ``depth`` truncates paths to their first ``depth`` components (``depth=2``: ``"transformer.h"``),
        so repeated blocks add up; nodes outside any module are under ``""``. Backward nodes count for
        the module whose forward they differentiate. Sorted by total time, largest first.
        """
        return propagate.by_module(self.nodes, self._predicted_name(device), depth)

    def phases(self) -> list[Phase]:
        """The phases present, in fw, bw, opt order."""
        present = {n.phase for n in self.nodes}
        return [p for p in PHASES if p in present]

    # -- re-prediction ---------------------------------------------------------------------------

    def predict(
        self,
        devices: Iterable[str | Device],
        cost_model: str | CostModel | None = None,
        overrides: Mapping[str, str | CostModel] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Report:
        """A copy of this report with predictions for ``devices`` (replacing the previous ones).

        ``cost_model`` is ``"auto"`` (the policy of :mod:`fxcost.cost_models.policy`), a cost model,
        its name, or a comma-separated fallback chain; by default the report's own (``model``).
        ``overrides`` maps op names to the chain their nodes use instead. ``progress(done, total)``
        is called after each device is predicted.
        """
        names = [get_device(d).name for d in devices]
        spec = cost_model or self.model
        out = copy.deepcopy(self)
        for n in out.nodes:
            n.pred_ms, n.pred_source = {}, {}
        if progress is None:  # all devices in one call: the nodes are batched once
            predict_nodes(out.nodes, names, spec, origin=self.origin, overrides=overrides)
        else:
            for done, name in enumerate(names, 1):
                predict_nodes(out.nodes, [name], spec, origin=self.origin, overrides=overrides)
                progress(done, len(names))
        out.devices = names
        out.model = spec_name(spec)
        return out

    def to_device(self, device: str | Device) -> Report:
        """Runtime-based prediction on ``device`` (Habitat's Figure 1): each kernel-alike node's measured
        time wave-scaled to ``device``; kernel-varying nodes (matmul, convolution) from the roofline.

        Raises:
            ValueError: the report was not measured on a GPU of the database.
        """
        if self.origin_device() is None:
            raise ValueError(
                f"wave scaling scales measurements from a GPU, and this trace was measured on "
                f"{self.origin!r}; use report.predict([...]) for predictions without an origin GPU"
            )
        return self.predict([device], cost_model="wave_scaling,roofline")

    # -- presentation ----------------------------------------------------------------------------

    def print(self, top: int | None = None, file: TextIO | None = None) -> None:
        """Print a header (model, batch, precision, where predictions come from), the per-node table
        (``top``: only the N nodes slowest on the first GPU predicted), then the totals. Tables fit the
        terminal's width, or 120 columns in a file or a pipe."""
        from fxcost.report.table import print_report

        print_report(self, top=top, file=file)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per node: its record's fields, with one ``pred_ms[<device>]`` column per device."""
        return dataframe(self)

    def to_csv(self, path: str | os.PathLike[str], devices: Iterable[str | Device] | None = None) -> Path:
        """Write the rows of :meth:`to_dataframe` as CSV (no pandas needed), with ``pred_ms[<device>]``
        columns for ``devices`` (default: all predicted). Lists and dicts (shapes, ``args``) are JSON;
        unknown values are empty cells."""
        return atomic_write(path, csv_text(self, self._predicted_names(devices)).encode())

    def to_onnx(self, path: str | os.PathLike[str], devices: Iterable[str | Device] | None = None) -> Path:
        """Write the captured graphs as an ONNX model to view in Netron: one node per record, edges
        from its inputs, costs and ``pred_ms[<device>]`` for ``devices`` (default: all predicted) as
        node attributes. See :mod:`fxcost.report.onnx_export`."""
        from fxcost.report.onnx_export import onnx_model

        return atomic_write(path, onnx_model(self, self._predicted_names(devices)).SerializeToString())

    # -- trace files -----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "fxcost_version": __version__,
            "torch_version": self.torch_version, "origin": self.origin, "model": self.model,
            "devices": self.devices, "step_ms": self.step_ms,
            "batch": self.batch, "seqlen": self.seqlen, "name": self.name, "routing": self.routing,
            "graphs": [g.to_json() for g in self.graphs],
            "nodes": [n.to_json() for n in self.nodes],
            "apart": [g.to_json() for g in self.apart],
            "execution": self.execution,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        if not isinstance(data, dict) or "schema_version" not in data:
            raise TraceFormatError("not an fxcost trace: no schema_version field")
        if data["schema_version"] != SCHEMA_VERSION:
            raise TraceFormatError(
                f"trace schema version {data['schema_version']!r} is not supported; "
                f"this fxcost reads version {SCHEMA_VERSION}"
            )
        try:
            return cls(
                nodes=[NodeCost.from_json(n) for n in data["nodes"]],
                graphs=[GraphRecord.from_json(g) for g in data["graphs"]],
                devices=list(data["devices"]),
                origin=str(data["origin"]),
                model=str(data["model"]),
                step_ms=data.get("step_ms"),
                torch_version=str(data.get("torch_version", "")),
                batch=data.get("batch"),
                seqlen=data.get("seqlen"),
                name=str(data.get("name") or ""),
                routing=str(data.get("routing") or ""),
                apart=[GraphRecord.from_json(g) for g in data.get("apart", [])],
                execution=data.get("execution", "eager"),  # traces before execution modes: eager
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TraceFormatError(f"malformed fxcost trace: {e!r}") from e

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the trace as JSON (gzip-compressed if ``path`` ends in ``.gz``), atomically."""
        payload = json.dumps(self.to_json(), separators=(",", ":")).encode()
        if Path(path).suffix == ".gz":
            payload = gzip.compress(payload, mtime=0)
        return atomic_write(path, payload)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        """Read a trace written by :meth:`save`.

        Raises:
            TraceFormatError: the file is not a complete fxcost trace of a supported schema version.
        """
        raw = Path(path).read_bytes()
        try:
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            data = json.loads(raw)
        except (OSError, EOFError, ValueError) as e:
            raise TraceFormatError(f"{path}: not a readable fxcost trace ({e})") from e
        return cls.from_json(data)

    # -- helpers ---------------------------------------------------------------------------------

    def _phase(self, phase: Phase | None) -> Sequence[NodeCost]:
        if phase is None:
            return self.nodes
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; accepted: {', '.join(PHASES)} or None")
        return [n for n in self.nodes if n.phase == phase]

    def origin_device(self) -> Device | None:
        """The GPU the step was captured on, if it is one of the database (None for a CPU)."""
        try:
            return get_device(self.origin)
        except UnknownDeviceError:
            return None

    def _predicted_names(self, devices: Iterable[str | Device] | None) -> list[str]:
        return list(self.devices) if devices is None else [self._predicted_name(d) for d in devices]

    def _predicted_name(self, device: str | Device) -> str:
        name = get_device(device).name
        if name not in self.devices:
            raise ValueError(
                f"{name} was not predicted in this report (predicted: {', '.join(self.devices)}); "
                f"use report.predict([...]) to add it"
            )
        return name
