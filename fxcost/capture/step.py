"""Capture a step: compile it with the fxcost backend, run it once (or only trace it), restore the model.

:func:`profile` captures one step and returns its report. Both it and the estimator compile a small
step function (forward, then the loss) with an :class:`~fxcost.capture.backend.FxcostBackend`, run
it once and backpropagate, and leave the model as they found it: parameter gradients, buffers
(batch-norm running statistics) and the random-number state are restored, and the compiled code is
dropped from Dynamo's caches so repeated calls neither pile up nor hit its recompile limit.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from fxcost.bench.timing import bench_ms
from fxcost.capture.backend import FxcostBackend
from fxcost.capture.inputs import as_call, batch_of, map_batched, seqlen_of
from fxcost.capture.options import CaptureOptions
from fxcost.passes.measure import NODE_REPS
from fxcost.report import Report

__all__ = ["LossFn", "captured_report", "default_loss", "profile", "trace_step", "trace_without_running"]

log = logging.getLogger(__name__)

LossFn = Callable[[Any], torch.Tensor]


def default_loss(output: Any) -> torch.Tensor:
    """The loss to backpropagate from a model's output.

    A ``.loss`` attribute (Hugging Face outputs given labels) or a lone scalar output is used as is;
    otherwise the sum of every floating-point output tensor that requires grad.
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
    if len(leaves) == 1 and leaves[0].dim() == 0:
        return leaves[0]  # already the loss: a user's step backpropagates it as it is
    total = leaves[0].sum()
    for t in leaves[1:]:
        total = total + t.sum()
    return total


def profile(
    model: torch.nn.Module | Callable[..., Any],
    example_inputs: Any,
    *,
    train: bool = True,
    loss_fn: LossFn = default_loss,
    **options: Any,
) -> Report:
    """Capture one step of ``model`` on ``example_inputs`` and return its report.

    Args:
        model: a module (or any callable) to run as ``model(*example_inputs)``.
        example_inputs: a tensor, a tuple of positional arguments, or a dict of keyword arguments.
        train: forward, loss and backward (True), or a forward under ``torch.no_grad`` (False).
        loss_fn: turns the model's output into the scalar to backpropagate.
        options: :class:`~fxcost.capture.options.CaptureOptions`: ``devices``, ``measure`` (time each
            node on the device the inputs live on, and the whole eager step), ``cost_model``,
            ``overrides``, ``budget_ms``, ``profile_kernels``, ``progress``, ``execution``
            (``"eager"``, ``"compiled"`` or ``"cudagraphs"``: how the report's step runs).
    """
    settings = CaptureOptions.of(**options)
    measure, budget_ms = settings.measure, settings.budget_ms
    args, kwargs = as_call(example_inputs)

    def backend_of(run_graphs: bool) -> FxcostBackend:
        return FxcostBackend(settings, run_graphs=run_graphs)

    if measure:
        backend = backend_of(run_graphs=True)
        trace_step(model, args, kwargs, backend, train=train, loss_fn=loss_fn)
    else:
        backend, _ = trace_without_running(model, args, kwargs, backend_of, train=train, loss_fn=loss_fn)
    report = captured_report(backend, args, kwargs)
    named = isinstance(model, torch.nn.Module)
    report.name = type(model).__name__ if named else getattr(model, "__name__", "")
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
    here), with the step's batch and sequence length.

    Raises:
        RuntimeError: nothing was captured; the message says what Dynamo reported.
    """
    report = backend.report(copy_nodes=False)
    report.batch, report.seqlen = batch_of(args, kwargs), seqlen_of(args, kwargs)
    if not report.nodes:
        failures = "; ".join(backend.failures) or "Dynamo produced no graph"
        raise RuntimeError(f"fxcost captured nothing from the step: {failures}")
    return report


def _run_step(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], train: bool) -> None:
    if train:
        fn(*args, **kwargs).backward()
    else:
        with torch.no_grad():
            fn(*args, **kwargs)


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
