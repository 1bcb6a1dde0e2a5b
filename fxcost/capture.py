"""Capture a training step programmatically: ``profile`` for a full report, ``cost`` for one number.

Both compile a small step function (forward, then the loss) with the fxcost backend, run it once and
backpropagate, and leave the model as they found it: parameter gradients, buffers (batch-norm running
statistics) and the random-number state are restored, and the compiled code is dropped from Dynamo's
caches so repeated calls neither pile up nor hit its recompile limit.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from fxcost.backend import DEFAULT_DEVICES, FxcostBackend
from fxcost.devices import Device
from fxcost.passes.measure import NODE_REPS
from fxcost.records import Phase
from fxcost.report import Report
from fxcost.timing import bench_ms

if TYPE_CHECKING:
    from fxcost.estimator import Precision

__all__ = [
    "Cost",
    "as_call",
    "batch_of",
    "batch_of_leaves",
    "captured_report",
    "cost",
    "default_loss",
    "map_batched",
    "profile",
    "trace_step",
    "trace_without_running",
]

log = logging.getLogger(__name__)

LossFn = Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class Cost:
    """Predicted time of one step on one device. ``float(cost)`` is ``cost.ms``."""

    ms: float
    fw_ms: float
    bw_ms: float
    device: str

    def __float__(self) -> float:
        return self.ms


def default_loss(output: Any) -> torch.Tensor:
    """The loss to backpropagate from a model's output.

    A ``.loss`` attribute (Hugging Face outputs given labels) is used as is; otherwise the sum of every
    floating-point output tensor that requires grad.
    """
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    leaves = [
        t
        for t in tree_leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not leaves:
        raise ValueError(
            "the model's output has no floating-point tensor that requires grad, so there is nothing "
            "to backpropagate; pass loss_fn=..., or train=False for an inference step"
        )
    total = leaves[0].sum()
    for t in leaves[1:]:
        total = total + t.sum()
    return total


def profile(
    model: torch.nn.Module | Callable[..., Any],
    example_inputs: Any,
    *,
    devices: Sequence[str | Device] = DEFAULT_DEVICES,
    train: bool = True,
    measure: bool = True,
    loss_fn: LossFn = default_loss,
    cost_model: str = "auto",
    overrides: Mapping[str, str] | None = None,
    budget_ms: float = 10.0,
    progress: Callable[[Phase, int, int], None] | None = None,
) -> Report:
    """Capture one step of ``model`` on ``example_inputs`` and return its report.

    Args:
        model: a module (or any callable) to run as ``model(*example_inputs)``.
        example_inputs: a tensor, a tuple of positional arguments, or a dict of keyword arguments.
        devices: GPUs to predict for.
        train: forward, loss and backward (True), or a forward under ``torch.no_grad`` (False).
        measure: time each node on the device the inputs live on, and the whole eager step.
        loss_fn: turns the model's output into the scalar to backpropagate.
        cost_model: ``"auto"`` (the prediction policy), a cost model name or a fallback chain.
        overrides: op name -> model or chain for those ops.
        budget_ms: measurement time budget per node.
        progress: called as ``progress(phase, nodes_done, nodes_total)`` while a graph is measured.
    """
    args, kwargs = as_call(example_inputs)

    def backend_of(run_graphs: bool) -> FxcostBackend:
        return FxcostBackend(devices, measure=measure, model=cost_model, overrides=overrides,
                             budget_ms=budget_ms, progress=progress, run_graphs=run_graphs)  # fmt: skip

    if measure:
        backend = backend_of(run_graphs=True)
        trace_step(model, args, kwargs, backend, train=train, loss_fn=loss_fn)
    else:
        backend, _ = trace_without_running(model, args, kwargs, backend_of, train=train, loss_fn=loss_fn)
    report = captured_report(backend, args, kwargs)
    if measure:
        params = _grad_leaves(model, args, kwargs)

        step = _step_of(model, loss_fn, train)

        def eager_step() -> None:
            for p in params:  # as in the first step: gradients are assigned, not accumulated
                p.grad = None
            _run_step(step, args, kwargs, train)

        with _preserved(model, args, kwargs):
            device = _device_of(model, args, kwargs)
            report.step_ms = bench_ms(eager_step, device, budget_ms=20 * budget_ms, **NODE_REPS)
    return report


def cost(
    model: torch.nn.Module | Callable[..., Any],
    example_inputs: Any,
    device: str | Device = DEFAULT_DEVICES[0],
    train: bool = True,
    *,
    batch_size: int | None = None,
    precision: Precision | None = None,
    loss_fn: LossFn = default_loss,
    cost_model: str = "auto",
) -> Cost:
    """Predicted time of one step of ``model`` on ``device``, without measuring or running anything.

    A process-wide :class:`~fxcost.estimator.Estimator` traces each model structure once; later calls
    for other devices, batch sizes (``batch_size``) or precisions (``"fp32"``, ``"tf32"``, ``"fp16"``,
    ``"bf16"``) take milliseconds. Safe to call from threads.

    Example:
        >>> c = fxcost.cost(model, (x,), device="A100-SXM4-80GB")  # doctest: +SKIP
        >>> c.ms, c.fw_ms, c.bw_ms  # doctest: +SKIP
    """
    from fxcost.estimator import default_estimator

    estimator = default_estimator(cost_model)
    return estimator.cost(model, example_inputs, train, batch_size, device, precision, loss_fn=loss_fn)


def trace_step(
    model: torch.nn.Module | Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    backend: FxcostBackend,
    *,
    train: bool,
    loss_fn: LossFn = default_loss,
    dynamic_batch: int | None = None,
) -> list[Any]:
    """Compile one step of ``model`` with ``backend`` and run it (and its backward when ``train``),
    leaving the model, its gradients and the RNG state as they were.

    With ``dynamic_batch``, the leading dimension of every input tensor of that size is traced as
    a symbol (and nothing else is), so the graphs' sizes are expressions in the batch.

    Returns:
        The ``ShapeEnv`` of each Dynamo frame compiled (one per frame; none for a frame with fake
        tensors of its own).
    """
    shape_envs: list[Any] = []

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        fake_mode = torch._guards.detect_fake_mode(example_inputs)
        if fake_mode is not None and fake_mode.shape_env is not None:
            shape_envs.append(fake_mode.shape_env)
        return backend(gm, example_inputs)

    # Dynamo counts compiles per code object and stops at its accumulated recompile limit (256),
    # which a search loop tracing thousands of models would reach: each trace gets its own copy.
    step = _step_of(model, loss_fn, train)
    step = types.FunctionType(
        step.__code__.replace(), step.__globals__, step.__name__, None, step.__closure__
    )

    # allow_rnn: without it Dynamo skips every frame holding an nn.LSTM/GRU/RNN, capturing nothing.
    config: dict[str, Any] = {"allow_rnn": True}
    if dynamic_batch is not None:
        args, kwargs = _batch_marked(args, kwargs, dynamic_batch)
        config |= {"automatic_dynamic_shapes": False, "assume_static_by_default": True}
    compiled = torch.compile(
        step, backend=compile_graph, dynamic=None if dynamic_batch is not None else False
    )
    try:
        with _preserved(model, args, kwargs), torch._dynamo.config.patch(**config):
            _run_step(compiled, args, kwargs, train)
    finally:
        _forget_compiled_code(backend)
    return shape_envs


def trace_without_running(
    model: torch.nn.Module | Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    backend_of: Callable[[bool], FxcostBackend],
    *,
    train: bool,
    loss_fn: LossFn = default_loss,
    dynamic_batch: int | None = None,
) -> tuple[FxcostBackend, list[Any]]:
    """:func:`trace_step` with a backend that runs nothing (``backend_of(run_graphs)`` builds it).

    A step whose Python code reads tensor values between graphs (a graph break on ``.item()``) sees
    garbage then, and may fail: it is traced again running its graphs, with static shapes. If that
    captures nothing either, the first error is the one raised.

    Returns:
        The backend that captured the step, and the shape environments of its frames.
    """
    backend = backend_of(False)
    try:
        return backend, trace_step(model, args, kwargs, backend, train=train, loss_fn=loss_fn,
                                   dynamic_batch=dynamic_batch)  # fmt: skip
    except Exception as first:
        log.info("capture without running failed (%s); capturing again, running the step", first)
        backend = backend_of(True)
        try:
            shape_envs = trace_step(model, args, kwargs, backend, train=train, loss_fn=loss_fn)
        except Exception:
            raise first from None
        if not backend.graph_modules():
            raise first from None
        return backend, shape_envs


def _step_of(model: Any, loss_fn: LossFn, train: bool) -> Callable[..., Any]:
    """The step fxcost captures: the model's forward, and its loss when training."""

    def step(*a: Any, **kw: Any) -> Any:
        out = model(*a, **kw)
        return loss_fn(out) if train else out

    return step


def map_batched(
    args: tuple[Any, ...], kwargs: dict[str, Any], batch: int, fn: Callable[[torch.Tensor], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs with ``fn`` applied to every tensor whose leading dimension is ``batch``."""

    def apply(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != batch:
            return t
        return fn(t)

    return tree_map(apply, args), tree_map(apply, kwargs)


def _batch_marked(
    args: tuple[Any, ...], kwargs: dict[str, Any], batch: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs, with each tensor whose leading dimension is ``batch`` replaced by an alias whose
    leading dimension Dynamo traces as a symbol (the caller's tensors stay unmarked)."""

    def mark(t: torch.Tensor) -> torch.Tensor:
        alias = t.detach().requires_grad_(t.requires_grad)
        torch._dynamo.maybe_mark_dynamic(alias, 0)
        return alias

    return map_batched(args, kwargs, batch, mark)


def captured_report(backend: FxcostBackend, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Report:
    """The report of a step a backend of our own traced (its nodes not copied: the backend ends
    here), with the step's batch.

    Raises:
        RuntimeError: nothing was captured; the message says what Dynamo reported.
    """
    report = backend.report(copy_nodes=False)
    report.batch = batch_of(args, kwargs)
    if not report.nodes:
        failures = "; ".join(backend.failures) or "Dynamo produced no graph"
        raise RuntimeError(f"fxcost captured nothing from the step: {failures}")
    return report


def as_call(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of a step from example inputs: a tensor, a tuple or list of positional
    arguments, or a dict of keyword arguments."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise TypeError(
        "example_inputs must be a tensor, a tuple/list of positional arguments or a dict of keyword "
        f"arguments, got {type(example_inputs).__name__}"
    )


def _run_step(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], train: bool) -> None:
    if train:
        fn(*args, **kwargs).backward()
    else:
        with torch.no_grad():
            fn(*args, **kwargs)


def batch_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The leading dimension of the step's first tensor input: its batch size, by convention."""
    return batch_of_leaves(tree_leaves((args, kwargs)))


def batch_of_leaves(leaves: Iterable[Any]) -> int | None:
    """:func:`batch_of` from the inputs' flattened leaves."""
    first = next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim()), None)
    return int(first.shape[0]) if first is not None else None


def _device_of(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if isinstance(model, torch.nn.Module):
        tensors += list(model.parameters())
    return next((t.device for t in tensors), torch.device("cpu"))


def _grad_leaves(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """Tensors whose ``.grad`` a backward pass would set: parameters and leaf inputs."""
    params: list[torch.Tensor] = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    params += [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_leaf]
    return params


@contextlib.contextmanager
def _preserved(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[None]:
    """Restore parameter and input gradients, buffers and the RNG state after the block."""
    params = _grad_leaves(model, args, kwargs)
    grads = [p.grad for p in params]
    module = isinstance(model, torch.nn.Module)
    buffers = [(b, b.detach().clone()) for b in model.buffers()] if module else []
    device = _device_of(model, args, kwargs)
    cuda = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda):
            for p in params:
                p.grad = None
            yield
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


def _forget_compiled_code(backend: FxcostBackend) -> None:
    """Drop Dynamo's cache entries for the code objects ``backend`` compiled.

    Without this every capture would add entries with a new backend to the same code objects, and
    after eight Dynamo would stop compiling them (its recompile limit).
    """
    try:
        from torch._dynamo.eval_frame import reset_code
    except ImportError:  # private API moved: fall back to a full reset
        torch._dynamo.reset()
        return
    for code in backend.compiled_code:
        reset_code(code)
