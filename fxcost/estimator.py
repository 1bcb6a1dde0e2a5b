"""A cost function for search loops: capture a model once, price it for any GPU, batch and precision.

An AutoML or architecture search asks for the cost of thousands of candidates. Tracing a model
(Dynamo and AOTAutograd) takes seconds; pricing a traced step takes milliseconds. So
:class:`Estimator` traces each model structure once, without running it, with the batch dimension
symbolic (:mod:`fxcost.symbolic`), and keeps the step as its distinct nodes: a transformer's twelve
identical layers are priced once and counted twelve times. A new GPU is one vectorized prediction
over those nodes; a new batch size evaluates their size polynomials first; a new precision retypes
their float32 tensors. Nothing is traced again unless the structure or the input shapes change, or
Dynamo's guards say the traced graph does not hold at the requested batch.

Example:
    >>> est = fxcost.Estimator(devices=["H100-SXM", "L4"])  # doctest: +SKIP
    >>> est.cost(model, (x,), device="L4").ms  # doctest: +SKIP
    >>> est.cost(model, (x,), device="H100-SXM", batch_size=256, precision="bf16")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from fxcost import cost_models
from fxcost.backend import DEFAULT_DEVICES, FxcostBackend
from fxcost.capture import (
    Cost,
    LossFn,
    as_call,
    batch_of,
    batch_of_leaves,
    captured_report,
    default_loss,
    map_batched,
    trace_without_running,
)
from fxcost.devices import Device, get_device
from fxcost.lowering import is_matmul_class, itemsize
from fxcost.records import META_KEY, PHASES, NodeCost
from fxcost.report import Report
from fxcost.symbolic import BatchSymbols, NodeSizes, NotPolynomial, Poly, node_sizes

__all__ = [
    "PRECISIONS",
    "Captured",
    "Estimator",
    "Precision",
    "check_precision",
    "default_estimator",
    "inputs_key",
    "model_key",
]

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
PRECISIONS: dict[str, str] = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class Estimator:
    """Predicted step times of models, each captured once per structure and input shapes.

    Args:
        devices: GPUs :meth:`costs` prices, and :meth:`cost` when given no device.
        cost_model: the prediction policy or model (see :mod:`fxcost.cost_models`); nothing is
            measured, so ``"auto"`` is the origin-free policy (MLP heads, roofline for the rest).
        max_models: captured structures kept (least recently used ones are dropped).

    Safe to use from several threads: captures run one at a time, pricing runs in parallel.
    A model is identified by its module tree, parameter and buffer shapes, its modules' plain
    attributes (``num_heads``, ``p``), the input shapes apart from the batch, ``train`` and the loss.
    The model's part is computed once per model object (and train/eval mode): a model changed in
    place between calls needs :meth:`clear`.
    """

    def __init__(
        self,
        devices: Sequence[str | Device] = DEFAULT_DEVICES,
        *,
        cost_model: str = "auto",
        max_models: int = 64,
    ) -> None:
        if isinstance(devices, (str, Device)):
            devices = [devices]
        self.devices = [get_device(d).name for d in devices]
        if not self.devices:
            raise ValueError("an Estimator needs at least one device; fxcost.devices() lists them")
        self.chain = cost_models.model_chain(cost_model)  # unknown names fail here
        self.cost_model = cost_model
        self.max_models = max_models
        self.captures = 0
        self.hits = 0
        self._captured: OrderedDict[str, Captured] = OrderedDict()
        self._model_keys: weakref.WeakKeyDictionary[torch.nn.Module, tuple[bool, str]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._capture_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"fxcost.Estimator(devices={self.devices!r}, cost_model={self.cost_model!r})"

    def cost(
        self,
        model: torch.nn.Module | Callable[..., Any],
        example_inputs: Any,
        train: bool = True,
        batch_size: int | None = None,
        device: str | Device | None = None,
        precision: Precision | None = None,
        *,
        loss_fn: LossFn = default_loss,
    ) -> Cost:
        """Predicted time of one step of ``model`` on ``device`` (the first of ``devices`` if None).

        Args:
            model: a module (or any callable), called as ``model(*example_inputs)``.
            example_inputs: a tensor, a tuple of positional arguments or a dict of keyword arguments;
                only their shapes and dtypes matter (meta tensors are fine).
            train: forward, loss and backward (True), or a forward without grad (False).
            batch_size: price the step at this batch instead of the inputs' own (leading dimension).
            precision: ``"fp32"``, ``"tf32"`` (fp32 with TF32 matmuls), ``"fp16"`` or ``"bf16"`` (every
                float32 tensor in half precision); None keeps the captured dtypes and TF32 flags.
            loss_fn: turns the model's output into the scalar to backpropagate.
        """
        target = get_device(device) if device is not None else get_device(self.devices[0])
        check_precision(precision)  # bad arguments fail before anything is traced
        captured, batch = self._captured_at(model, example_inputs, train, loss_fn, batch_size)
        return captured.cost(target, batch, precision)

    def costs(
        self,
        model: torch.nn.Module | Callable[..., Any],
        example_inputs: Any,
        train: bool = True,
        batch_size: int | None = None,
        precision: Precision | None = None,
        *,
        loss_fn: LossFn = default_loss,
    ) -> dict[str, Cost]:
        """:meth:`cost` on every device of the estimator, by canonical name."""
        check_precision(precision)
        captured, batch = self._captured_at(model, example_inputs, train, loss_fn, batch_size)
        return {d: captured.cost(d, batch, precision) for d in self.devices}

    def capture(
        self,
        model: torch.nn.Module | Callable[..., Any],
        example_inputs: Any,
        train: bool = True,
        *,
        loss_fn: LossFn = default_loss,
        batch_size: int | None = None,
    ) -> Captured:
        """The captured step of ``model`` on inputs shaped like ``example_inputs``, traced on the
        first call for this structure and served from the cache after. ``batch_size``: the batch it
        will be priced at; a capture whose graph does not hold there is traced again at it."""
        return self._captured_at(model, example_inputs, train, loss_fn, batch_size)[0]

    def _captured_at(
        self, model: Any, example_inputs: Any, train: bool, loss_fn: LossFn, batch_size: int | None
    ) -> tuple[Captured, int | None]:
        """The capture that holds at ``batch_size`` (else at the inputs' own batch), and that batch."""
        _check_batch(batch_size)
        args, kwargs = as_call(example_inputs)
        leaves, spec = tree_flatten((args, kwargs))  # once: this is every call's path
        batch = batch_of_leaves(leaves)
        priced = batch_size if batch_size is not None else batch
        key = self._model_key(model) + _inputs_key(leaves, spec, train, loss_fn, batch, self._model_key)
        captured = self._lookup(key) or self._trace(key, model, args, kwargs, train, loss_fn)
        if priced is None or batch is None or captured.holds_at(priced):
            return captured, priced
        # The symbolic graph does not hold there: trace at that batch itself, under its own key.
        args, kwargs = _resized(args, kwargs, batch, priced)
        key = f"{key}@{priced}"
        return self._lookup(key) or self._trace(key, model, args, kwargs, train, loss_fn), priced

    def _trace(
        self,
        key: str,
        model: torch.nn.Module | Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        train: bool,
        loss_fn: LossFn,
    ) -> Captured:
        with self._capture_lock:
            captured = self._lookup(key)  # another thread may have traced it meanwhile
            if captured is None:
                captured = Captured.trace(model, args, kwargs, train, loss_fn, self.chain)
                with self._lock:
                    self.captures += 1
                    self._captured[key] = captured
                    while len(self._captured) > self.max_models:
                        self._captured.popitem(last=False)
        return captured

    def cache_info(self) -> dict[str, int]:
        """Cache counters: ``captures`` traced, ``hits`` served from the cache, ``models`` kept."""
        with self._lock:
            return {"captures": self.captures, "hits": self.hits, "models": len(self._captured)}

    def clear(self) -> None:
        """Forget every captured model (after changing a model in place)."""
        with self._lock:
            self._captured.clear()
            self._model_keys.clear()

    def _model_key(self, model: Any) -> str:
        """:func:`model_key`, memoized per model object (hashing ResNet-50's tree takes milliseconds,
        pricing it less); switching the model between train and eval mode is seen."""
        if not isinstance(model, torch.nn.Module):
            return model_key(model, self._model_key)
        with self._lock:
            known = self._model_keys.get(model)
        if known is not None and known[0] == model.training:
            return known[1]
        key = model_key(model)
        with self._lock:
            self._model_keys[model] = (model.training, key)
        return key

    def _lookup(self, key: str) -> Captured | None:
        with self._lock:
            captured = self._captured.get(key)
            if captured is not None:
                self.hits += 1
                self._captured.move_to_end(key)
            return captured


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
        chain: Sequence[cost_models.CostModel],
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
        self.graph_hash = hashlib.sha256(repr(sorted(distinct.items())).encode()).hexdigest()[:16]
        self._polys = _PolyTable(kept)
        self._batches: OrderedDict[tuple[int | None, str | None], cost_models.NodeBatch] = OrderedDict()
        self._costs: dict[tuple[int | None, str | None, str], Cost] = {}
        self._lock = threading.Lock()

    @classmethod
    def trace(
        cls,
        model: torch.nn.Module | Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        train: bool,
        loss_fn: LossFn,
        chain: Sequence[cost_models.CostModel],
    ) -> Captured:
        """Trace one step of ``model`` without running it, its batch dimension symbolic."""
        batch = batch_of(args, kwargs)
        # A batch of 1 is traced as a constant by Dynamo (0/1 specialization): nothing to gain.
        dynamic = batch if batch is not None and batch > 1 else None
        backend, shape_envs = trace_without_running(
            model, args, kwargs, lambda run: FxcostBackend([], measure=False, run_graphs=run),
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
        self, device: str | Device, batch_size: int | None = None, precision: Precision | None = None
    ) -> Cost:
        """The step's predicted time on ``device`` at ``batch_size`` (the traced batch if None)."""
        target = get_device(device)
        batch_size = self._relative(batch_size)
        key = (batch_size, precision, target.name)
        with self._lock:
            known = self._costs.get(key)
        if known is not None:
            return known
        batch = self.node_batch(batch_size, precision)
        ms, _ = cost_models.predict_batch(batch, self.chain, target)
        per_phase = np.nan_to_num(ms) @ self.counts  # a node no model predicts adds nothing
        fw, bw, opt = (float(x) for x in per_phase)
        result = Cost(ms=fw + bw + opt, fw_ms=fw, bw_ms=bw, device=target.name)
        with self._lock:
            self._costs[key] = result
        return result

    def _relative(self, batch_size: int | None) -> int | None:
        """None for the traced batch: one cache entry, and no polynomials to evaluate there."""
        return None if batch_size == self.batch else batch_size

    def node_batch(
        self, batch_size: int | None = None, precision: Precision | None = None
    ) -> cost_models.NodeBatch:
        """The distinct nodes at ``batch_size`` in ``precision``, as the columns cost models read."""
        check_precision(precision)
        batch_size = self._relative(batch_size)
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
        batch = cost_models.NodeBatch.of(nodes)
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

    def nodes_at(self, nodes: Sequence[NodeCost], batch: int, precision: str | None = None) -> list[NodeCost]:
        """``nodes`` at ``batch``; in ``precision``, their float32 tensors retyped (and fp32 matmuls
        on TF32 for ``"tf32"``)."""
        dtype = PRECISIONS[precision] if precision is not None else "float32"
        scale = itemsize(dtype) / 4
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
                changes["tf32"] = (
                    precision == "tf32" and is_matmul_class(node.op) and "float32" in node.out_dtypes
                )
            out.append(node.replace(**changes))
        return out


def check_precision(precision: str | None) -> None:
    """Raise ``ValueError`` naming the accepted precisions unless ``precision`` is one of them or None."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; accepted: {', '.join(PRECISIONS)} or None")


def _check_batch(batch_size: int | None) -> None:
    if batch_size is None:
        return
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")


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


def model_key(model: Any, module_key: Callable[[torch.nn.Module], str] | None = None) -> str:
    """A hash of what in a model decides its traced graph: the module tree with each module's class
    and plain settings, and the parameters' and buffers' names, shapes and dtypes. A callable that is
    no module counts by :func:`_code_identity`, the modules it calls by ``module_key`` (a memoized
    ``model_key``; this function if None)."""
    parts: list[Any] = []
    if isinstance(model, torch.nn.Module):
        for name, module in model.named_modules():
            parts.append(
                (name, type(module).__module__, type(module).__qualname__, _plain_attributes(module))
            )
        parts += [(name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in model.named_parameters()]
        parts += [(name, tuple(b.shape), b.dtype) for name, b in model.named_buffers()]
    else:
        parts.append(_code_identity(model, module_key or model_key))
    return _digest(parts)


def inputs_key(
    args: tuple[Any, ...], kwargs: dict[str, Any], train: bool, loss_fn: LossFn, batch: int | None,
    module_key: Callable[[torch.nn.Module], str] | None = None,
) -> str:  # fmt: skip
    """A hash of the step's inputs (shapes but the batch, dtypes, structure), ``train`` and loss (a
    module the loss calls counts by ``module_key``, as in :func:`model_key`)."""
    return _inputs_key(*tree_flatten((args, kwargs)), train, loss_fn, batch, module_key)


def _inputs_key(
    leaves: list[Any], spec: Any, train: bool, loss_fn: LossFn, batch: int | None,
    module_key: Callable[[torch.nn.Module], str] | None,
) -> str:  # fmt: skip
    parts: list[Any] = [train, _code_identity(loss_fn, module_key or model_key), str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            shape = ["B" if i == 0 and s == batch else s for i, s in enumerate(leaf.shape)]
            parts.append((shape, leaf.dtype, leaf.requires_grad, leaf.device.type))
        else:
            parts.append((type(leaf).__name__, leaf if isinstance(leaf, _PLAIN) else ""))
    return _digest(parts)


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


_PLAIN = (int, float, str, bool, type(None))


def _plain_attributes(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """A module's scalar settings (``num_heads``, ``eps``, ``training``, tuples of ints)."""
    return sorted(
        (k, v)
        for k, v in vars(module).items()
        if isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v))
    )


def _code_identity(fn: Any, module_key: Callable[[torch.nn.Module], str]) -> Any:
    """Where a function's code is defined, and what it closes over or is bound to: two lambdas from
    the same line are the same loss, unless they call different modules (``lambda x: m(x)`` in a loop
    over widths) or capture other values. Modules count by ``module_key``, plain values by value,
    anything else by identity (a bound method of a fresh object each call is a new key)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return (type(fn).__module__, type(fn).__qualname__, id(fn))
    captured = [getattr(fn, "__self__", None)]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            captured.append(None)
    values = [
        module_key(v) if isinstance(v, torch.nn.Module) else v if isinstance(v, _PLAIN) else id(v)
        for v in captured
    ]
    return (code.co_filename, code.co_firstlineno, code.co_qualname, *values)


def _resized(
    args: tuple[Any, ...], kwargs: dict[str, Any], batch: int, new: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs with every tensor whose leading dimension is ``batch`` grown or cut to ``new``,
    repeating its rows (token ids stay valid ids)."""

    def resize(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "meta":
            return torch.empty((new, *t.shape[1:]), dtype=t.dtype, device="meta")
        reps = -(-new // batch)
        return t.detach().repeat(reps, *([1] * (t.dim() - 1)))[:new].requires_grad_(t.requires_grad)

    return map_batched(args, kwargs, batch, resize)


def _matrix(polys: Sequence[Poly]) -> np.ndarray:
    """Polynomials as rows of coefficients (lowest power first), zero-padded to one width."""
    width = max((len(p) for p in polys), default=1)
    out = np.zeros((len(polys), width), dtype=np.int64)
    for i, p in enumerate(polys):
        out[i, : len(p)] = p
    return out


def _at(matrix: np.ndarray, batch: int) -> np.ndarray:
    return matrix @ (batch ** np.arange(matrix.shape[1], dtype=np.int64))


_default: dict[str, Estimator] = {}
_default_lock = threading.Lock()


def default_estimator(cost_model: str = "auto") -> Estimator:
    """The process-wide estimator ``fxcost.cost`` uses (one per cost model)."""
    with _default_lock:
        if cost_model not in _default:
            _default[cost_model] = Estimator(cost_model=cost_model)
        return _default[cost_model]
