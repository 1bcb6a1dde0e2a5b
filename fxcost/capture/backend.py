"""The torch.compile backend: capture forward, backward and optimizer ATen graphs, annotate, measure, predict.

``torch.compile(model, backend=fxcost.estimate(devices=[...]))`` hands each Dynamo graph to
AOTAutograd, which splits it into a forward and a backward ATen graph (an optimizer step, run without
grad, gives one inference graph). fxcost annotates each graph when it is compiled, measures it on its
first call, and predicts it for the requested GPUs. The graphs themselves run unchanged, so outputs and
gradients are those of eager PyTorch; any failure inside fxcost is reported once as a warning and the
step goes on without it.

``torch.compile(model, backend="fxcost")`` uses a process-wide backend with default devices; the name
is registered through the ``torch_dynamo_backends`` entry point of the installed package (or
:func:`register` where the package is not installed).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import threading
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from fxcost.capture.graphs import (
    CapturedGraph,
    StepFacts,
    code_being_compiled,
    is_optimizer_graph,
    placeholder_outputs,
    size_symbols,
    step_facts,
)
from fxcost.capture.options import CaptureOptions
from fxcost.cost_models import spec_name
from fxcost.gpus import DEFAULT_DEVICES, Device
from fxcost.lowering import bound_sizes
from fxcost.passes import annotate, measure, predict
from fxcost.records import META_KEY, PHASES, GraphRecord, Phase
from fxcost.report import Report

__all__ = ["FxcostBackend", "estimate", "fxcost_backend", "last_report", "register"]

log = logging.getLogger(__name__)

_last_backend: FxcostBackend | None = None
_default_backend: FxcostBackend | None = None
_globals_lock = threading.RLock()  # re-entered: the default backend remembers itself when made


class FxcostBackend:
    """A torch.compile backend that records the cost of every ATen node it compiles.

    Build it with :func:`estimate`. Its report is the step last run: the graphs of every frame
    (graph breaks give several) that ran since the model's first frame last started; graphs of a
    branch not taken in that step are listed apart. When Dynamo recompiles a frame, its new graphs
    replace the old ones; a graph compiled for dynamic shapes is reported at the sizes it last ran.
    """

    def __init__(self, options: CaptureOptions | None = None, *, run_graphs: bool = True) -> None:
        """See :func:`estimate` and :class:`~fxcost.capture.options.CaptureOptions`. ``run_graphs=False``
        is for captures whose results are thrown away (``fxcost.cost``, ``fxcost.profile(measure=False)``):
        the compiled graphs then compute nothing and return uninitialized tensors of the right shapes,
        so capturing a big model costs the time of tracing it, not of running it. Never use it on a
        step whose results matter."""
        if options is not None and not isinstance(options, CaptureOptions):
            raise TypeError(
                f"FxcostBackend takes a CaptureOptions, got {type(options).__name__}; "
                "fxcost.estimate(devices=..., measure=...) builds one from keywords"
            )
        self.options = options or CaptureOptions()
        if not run_graphs and self.options.measure:
            raise ValueError("run_graphs=False captures without running anything: it needs measure=False")
        self.devices = self.options.device_names
        self.run_graphs = run_graphs
        self.origin = "cpu"
        self.failures: list[str] = []
        self.compiled_code: set[types.CodeType] = set()
        # The graphs of each compile of each Dynamo frame, by (frame id, compile of it).
        self._frames: dict[tuple[int, int], list[CapturedGraph]] = {}
        self._lock = threading.Lock()
        self._runs = itertools.count()  # stamps graph calls in order
        self._model_frame: int | None = None  # the frame id of the model's own (first) frame
        self._step_start = 0  # the stamp of the latest call of a graph that starts a step
        self._step_graph: CapturedGraph | None = None  # that graph
        _remember(self)

    def __repr__(self) -> str:
        return f"fxcost.estimate(devices={self.devices!r}, measure={self.options.measure})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        _remember(self)
        try:
            from torch._dynamo.backends.common import aot_autograd

            frame: list[CapturedGraph] = []
            compile_id = _compile_id()
            frame_id = None if compile_id is None else compile_id[0]
            code = code_being_compiled()
            if code is not None:
                self.compiled_code.add(code)
            with self._lock:
                # Every compile of a frame keeps its graphs (a recompile for new shapes, another for
                # eval under no_grad): Dynamo runs whichever its guards pick, and the step is what ran.
                key = compile_id if compile_id is not None else (-len(self._frames) - 1, 0)
                if self._model_frame is None:
                    self._model_frame = key[0]
                facts = step_facts(gm, example_inputs) if key[0] == self._model_frame else None
                self._frames[key] = frame
            origin = _origin_name(example_inputs)
            if origin != "cpu":  # a graph with only CPU inputs (after a break) measures nothing on the GPU
                self.origin = origin
            no_grad_phase: Phase = "opt" if is_optimizer_graph(gm) else "fw"
            compiler = aot_autograd(
                fw_compiler=self._compiler(frame, frame_id, "fw", facts),
                bw_compiler=self._compiler(frame, frame_id, "bw"),
                inference_compiler=self._compiler(frame, frame_id, no_grad_phase, facts),
            )
            return compiler(gm, example_inputs)
        except Exception as e:
            self._warn("capture", e)
            return gm.forward

    def report(self, copy_nodes: bool = True, *, all_graphs: bool = False) -> Report:
        """The report of the step last run: forward graphs, then backward, then optimizer. Graphs
        captured but not run in that step (a branch not taken) are in ``report.apart``, unless
        ``all_graphs`` puts every captured graph in the report.

        Its records are copies, so later predictions by this backend do not change it; a caller that
        owns the backend alone (``fxcost.profile``) may take the records themselves.
        """
        captured = self._captured()
        for graph in captured:
            self._annotate_at_last_sizes(graph)
        in_step = self._in_step(captured, all_graphs)
        start = self._step_graph
        facts = start.facts.at(start.sizes) if start is not None and start.facts is not None else StepFacts()
        report = Report(
            devices=list(self.devices),
            origin=self.origin,
            model=spec_name(self.options.cost_model),
            torch_version=torch.__version__,
            batch=facts.batch,
            seqlen=facts.seqlen,
            name=facts.name,
            execution=self.options.execution,
            apart=[dataclasses.replace(g.record, index=i)
                   for i, g in enumerate(g for g in captured if not (all_graphs or self._ran_in_step(g)))],
        )  # fmt: skip
        for index, graph in enumerate(in_step):
            report.graphs.append(dataclasses.replace(graph.record, index=index))
            for node in graph.gm.graph.nodes:
                if META_KEY in node.meta:
                    cost = copy.deepcopy(node.meta[META_KEY]) if copy_nodes else node.meta[META_KEY]
                    cost.graph = index
                    report.nodes.append(cost)
        return report

    def graph_modules(self, *, all_graphs: bool = False) -> list[torch.fx.GraphModule]:
        """The captured ATen graphs, in the order of ``report(all_graphs=all_graphs).graphs``."""
        return [g.gm for g in self._in_step(self._captured(), all_graphs)]

    def _in_step(self, captured: list[CapturedGraph], all_graphs: bool) -> list[CapturedGraph]:
        """The graphs of ``captured`` run since the latest step started (all of them if asked)."""
        return [g for g in captured if all_graphs or self._ran_in_step(g)]

    def _ran_in_step(self, graph: CapturedGraph) -> bool:
        return graph.last_run >= self._step_start

    def _captured(self) -> list[CapturedGraph]:
        """The latest graphs of every frame: forward graphs, then backward, then optimizer."""
        with self._lock:
            captured = [g for frame in self._frames.values() for g in frame]
        rank = {p: i for i, p in enumerate(PHASES)}
        return sorted(captured, key=lambda g: rank[g.record.phase])

    def _annotate_at_last_sizes(self, graph: CapturedGraph) -> None:
        """Annotate and predict a dynamic-shape graph again where it last ran at other sizes than its
        records hold (at report time, so training pays nothing for it; measurements of the old sizes
        go with them)."""
        if not graph.sizes or graph.sizes == graph.annotated_sizes:
            return
        try:
            with bound_sizes(graph.sizes):
                annotate.run(graph.gm, graph.record.phase)
                self._predict(graph.gm)
        except Exception as e:
            self._warn("annotate", e)
        graph.annotated_sizes = graph.sizes

    # -- compile and run -------------------------------------------------------------------------

    def _compiler(
        self, frame: list[CapturedGraph], frame_id: int | None, phase: Phase, facts: StepFacts | None = None
    ) -> Callable[..., Any]:
        """The compiler of one AOT graph of a Dynamo compile; ``facts`` where that compile is of the
        model's own frame, whose first graph then starts a step when it runs."""
        from functorch.compile import make_boxed_func

        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            try:
                annotate.run(gm, phase)
            except Exception as e:
                self._warn("annotate", e)
                return make_boxed_func(gm.forward)
            calls = sum(n.op == "call_function" for n in gm.graph.nodes)
            record = GraphRecord(index=-1, phase=phase, frame=frame_id, num_nodes=calls)
            symbols = size_symbols(gm)
            traced = {symbol: size for *_, symbol, size in symbols}
            graph = CapturedGraph(gm, record, measure_pending=self.options.measure, symbols=symbols,
                                   annotated_sizes=traced)  # fmt: skip
            with self._lock:
                if facts is not None and not frame:
                    graph.facts = facts
                frame.append(graph)
            self._predict(gm)
            return make_boxed_func(self._runner(graph))

        return compile_graph

    def _predict(self, gm: torch.fx.GraphModule) -> None:
        try:
            predict.run(gm, self.devices, self.options.cost_model, origin=self.origin,
                        overrides=self.options.overrides)  # fmt: skip
        except Exception as e:
            self._warn("predict", e)

    def _runner(self, graph: CapturedGraph) -> Callable[..., Any]:
        gm = graph.gm
        if not self.run_graphs:
            placeholder = placeholder_outputs(gm)

            def run_nothing(*args: Any) -> Any:
                self._ran(graph, args)
                return placeholder(*args)

            return run_nothing

        def run(*args: Any) -> Any:
            self._ran(graph, args)
            if graph.measure_pending:
                graph.measure_pending = False
                try:
                    measure.run(
                        gm,
                        args,
                        graph.record,
                        budget_ms=self.options.budget_ms,
                        profile_kernels=self.options.profile_kernels,
                        progress=self._progress_of(graph.record.phase),
                    )
                except Exception as e:
                    self._warn("measure", e)
                else:
                    self._predict(gm)  # models that scale origin measurements can use them now
            return gm(*args)

        return run

    def _ran(self, graph: CapturedGraph, args: Sequence[Any]) -> None:
        """Note a call of ``graph``: when, and at which sizes; a call of the first frame's first graph
        starts a step."""
        graph.last_run = next(self._runs)
        if graph.facts is not None:
            self._step_start, self._step_graph = graph.last_run, graph
        if graph.symbols:
            try:
                graph.sizes = {symbol: int(args[i] if dim is None else args[i].shape[dim])
                               for i, dim, symbol, _ in graph.symbols}  # fmt: skip
            except Exception as e:
                self._warn("sizes", e)

    def _progress_of(self, phase: Phase) -> measure.Progress | None:
        report = self.options.progress
        if report is None:
            return None
        return lambda done, total: report(phase, done, total)

    def _warn(self, stage: str, error: Exception) -> None:
        """Report a failure once per stage and error type; training goes on without fxcost there."""
        message = f"{stage}: {type(error).__name__}: {error}"
        cause = error.__cause__
        if cause is not None:
            message += f" (caused by {type(cause).__name__}: {cause})"
        log.debug("fxcost %s failed", stage, exc_info=error)
        first = not any(f.startswith(f"{stage}: {type(error).__name__}") for f in self.failures)
        self.failures.append(message)
        if first:
            warnings.warn(
                f"fxcost {message}. The graph runs unchanged; its costs are missing from the report.",
                RuntimeWarning,
                stacklevel=2,
            )


def estimate(devices: Sequence[str | Device] = DEFAULT_DEVICES, **options: Any) -> FxcostBackend:
    """A torch.compile backend that predicts each node's time on ``devices``.

    Args:
        devices: GPUs to predict for: canonical names (``fxcost.devices()``), aliases, or
            ``torch.cuda.get_device_name()`` strings.
        options: the other fields of :class:`~fxcost.capture.options.CaptureOptions`: ``measure``
            (time every node on the device the model runs on, at the first call of each graph),
            ``cost_model`` (``"auto"``, the prediction policy, a model name or a fallback chain),
            ``overrides``, ``budget_ms``, ``profile_kernels``, ``progress``, ``execution`` (here
            ``"compiled"`` by default: the step as Inductor runs it, beside the eager step).

    Raises:
        UnknownDeviceError: a device name is unknown (raised here, before any training runs).

    Example:
        >>> backend = estimate(devices=["H100-SXM", "T4"])
        >>> compiled = torch.compile(model, backend=backend)  # doctest: +SKIP
        >>> compiled(x).sum().backward()  # doctest: +SKIP
        >>> fxcost.last_report().print(top=20)  # doctest: +SKIP
    """
    options.setdefault("execution", "compiled")
    return FxcostBackend(CaptureOptions.of(devices=devices, **options))


def fxcost_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """The backend behind ``torch.compile(..., backend="fxcost")``: default devices, measuring on."""
    global _default_backend
    with _globals_lock:
        if _default_backend is None:
            _default_backend = FxcostBackend()
        backend = _default_backend
    return backend(gm, example_inputs)


def register() -> None:
    """Register ``"fxcost"`` with Dynamo by hand, for a source tree not installed with pip."""
    from torch._dynamo.backends import registry

    if "fxcost" not in registry._COMPILER_FNS:
        registry.register_backend(fxcost_backend, name="fxcost")


def last_report() -> Report:
    """The report of the step last run through the fxcost backend created or called most recently.

    Raises:
        RuntimeError: no backend yet, or the latest captured no graph (Dynamo compiled nothing of the
            model: the message gives Dynamo's reasons).
    """
    with _globals_lock:
        backend = _last_backend
    if backend is None:
        raise RuntimeError(
            "no fxcost capture yet: compile a model with backend=fxcost.estimate(...) "
            "(or backend='fxcost') and run one step first"
        )
    report = backend.report()
    if not report.graphs:
        raise RuntimeError(f"{backend!r} has captured no graph yet: {_why_nothing_captured(backend)}")
    return report


def _remember(backend: FxcostBackend) -> None:
    global _last_backend
    with _globals_lock:
        _last_backend = backend


def _why_nothing_captured(backend: FxcostBackend) -> str:
    """What to tell a user whose step ran but gave the backend nothing to capture."""
    if backend.failures:
        return "; ".join(backend.failures)
    from torch._dynamo.utils import counters

    reasons = sorted({str(r).splitlines()[0].strip() for r in counters["unimplemented"]})
    said = f" Dynamo reported: {'; '.join(reasons)}." if reasons else ""
    return (
        "run one step of the compiled model first; if it ran, Dynamo compiled nothing of it and ran it "
        f"eagerly.{said} Recurrent modules (nn.LSTM, nn.GRU, nn.RNN) need "
        "torch._dynamo.config.allow_rnn = True; torch._dynamo.explain(model)(*inputs) lists graph breaks"
    )


def _compile_id() -> tuple[int, int] | None:
    """The Dynamo frame being compiled and which compile of it this is (recompiles count up)."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    if compile_id is None or compile_id.frame_id is None:
        return None
    return compile_id.frame_id, compile_id.frame_compile_id or 0


def _origin_name(example_inputs: Sequence[Any]) -> str:
    """The measuring device: a CUDA device name, or ``"cpu"``."""
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return torch.cuda.get_device_name(t.device)
    return "cpu"
