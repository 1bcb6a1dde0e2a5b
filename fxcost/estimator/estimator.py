"""A cost function for search loops: capture a model once, price it for any GPU, batch and precision.

An AutoML or architecture search asks for the cost of thousands of candidates. Tracing a model
(Dynamo and AOTAutograd) takes seconds; pricing a traced step takes milliseconds. So
:class:`Estimator` traces each model structure once, without running it, with the batch dimension
symbolic (:mod:`fxcost.estimator.symbolic`), and keeps the step as its distinct nodes
(:class:`~fxcost.estimator.captured.Captured`). Nothing is traced again unless the structure or the
input shapes change, or Dynamo's guards say the traced graph does not hold at the requested batch.

Example:
    >>> est = fxcost.Estimator(devices=["H100-SXM", "L4"])  # doctest: +SKIP
    >>> est.cost(model, (x,), device="L4").ms  # doctest: +SKIP
    >>> est.cost(model, (x,), device="H100-SXM", batch_size=256, precision="bf16")  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from fxcost.capture import LossFn, as_call, batch_of_leaves, default_loss, map_batched
from fxcost.cost_models import model_chain
from fxcost.estimator.captured import Captured, Cost
from fxcost.estimator.keys import leaves_key, model_key
from fxcost.gpus import DEFAULT_DEVICES, Device, get_device
from fxcost.precision import PrecisionArg, parse_precision
from fxcost.propagate import check_execution

__all__ = ["Estimator", "clear_default_estimators", "cost", "default_estimator"]


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
        self.chain = model_chain(cost_model)  # unknown names fail here
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
        precision: PrecisionArg = None,
        *,
        loss_fn: LossFn = default_loss,
        execution: str = "eager",
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
            execution: ``"eager"`` (op by op), ``"compiled"`` (``torch.compile`` with Inductor: fused
                kernels) or ``"cudagraphs"`` (the eager kernels without host gaps).
        """
        target = get_device(device) if device is not None else get_device(self.devices[0])
        parsed = parse_precision(precision)  # bad arguments fail before anything is traced
        check_execution(execution)
        captured, batch = self._captured_at(model, example_inputs, train, loss_fn, batch_size)
        return captured.cost(target, batch, parsed, execution)

    def costs(
        self, model: torch.nn.Module | Callable[..., Any], example_inputs: Any, train: bool = True,
        batch_size: int | None = None, precision: PrecisionArg = None, *, loss_fn: LossFn = default_loss,
        execution: str = "eager",
    ) -> dict[str, Cost]:  # fmt: skip
        """:meth:`cost` on every device of the estimator, by canonical name."""
        parsed = parse_precision(precision)
        check_execution(execution)
        captured, batch = self._captured_at(model, example_inputs, train, loss_fn, batch_size)
        return {d: captured.cost(d, batch, parsed, execution) for d in self.devices}

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
        key = self._model_key(model) + leaves_key(leaves, spec, train, loss_fn, batch, self._model_key)
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


def cost(
    model: torch.nn.Module | Callable[..., Any],
    example_inputs: Any,
    device: str | Device = DEFAULT_DEVICES[0],
    train: bool = True,
    *,
    batch_size: int | None = None,
    precision: PrecisionArg = None,
    loss_fn: LossFn = default_loss,
    cost_model: str = "auto",
    execution: str = "eager",
) -> Cost:
    """Predicted time of one step of ``model`` on ``device``, without measuring or running anything.

    A process-wide :class:`~fxcost.estimator.Estimator` traces each model structure once; later calls
    for other devices, batch sizes (``batch_size``) or precisions (``"fp32"``, ``"tf32"``, ``"fp16"``,
    ``"bf16"``) take milliseconds. ``execution``: ``"eager"``, ``"compiled"`` (Inductor's fused
    kernels) or ``"cudagraphs"`` (no host gaps). Safe to call from threads.

    Example:
        >>> c = fxcost.cost(model, (x,), device="A100-SXM4-80GB")  # doctest: +SKIP
        >>> c.ms, c.fw_ms, c.bw_ms  # doctest: +SKIP
    """
    estimator = default_estimator(cost_model)
    return estimator.cost(model, example_inputs, train, batch_size, device, precision, loss_fn=loss_fn,
                          execution=execution)  # fmt: skip


def _check_batch(batch_size: int | None) -> None:
    if batch_size is None:
        return
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")


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


_default: dict[str, Estimator] = {}

_default_lock = threading.Lock()


def default_estimator(cost_model: str = "auto") -> Estimator:
    """The process-wide estimator ``fxcost.cost`` uses (one per cost model)."""
    with _default_lock:
        if cost_model not in _default:
            _default[cost_model] = Estimator(cost_model=cost_model)
        return _default[cost_model]


def clear_default_estimators() -> None:
    """Forget the process-wide estimators and every model they traced (to time a cold start)."""
    with _default_lock:
        _default.clear()
