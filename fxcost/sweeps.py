"""Sweeps: the predicted step time of many (model, config, batch, device, precision) points.

``sweep(points)`` groups the points by model and config, builds and traces each model once
(:class:`~fxcost.estimator.Estimator`), and prices every point of the group from that one trace:
ten thousand points over a handful of models take seconds. ``backend="ray"`` spreads the groups
over a Ray cluster (``pip install 'fxcost[ray]'``) for searches that outgrow one machine; each
worker keeps its own estimator. With ``out=``, results are appended to a JSON-lines file as they
come, and a rerun skips the points already there (an interrupted sweep resumes).

Example:
    >>> from fxcost.sweeps import Point
    >>> points = [Point("gpt2", batch=b, device=d, config={"seq": 256})
    ...           for b in (8, 16, 32) for d in ("H100-SXM", "L4")]  # doctest: +SKIP
    >>> for r in fxcost.sweep(points): print(r.point.device, r.point.batch, r.ms)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fxcost._progress import progress_bars
from fxcost.execution import check_execution
from fxcost.gpus import get_device
from fxcost.precision import PrecisionArg, parse_precision

if TYPE_CHECKING:
    from fxcost.estimator import Estimator

__all__ = ["Point", "Result", "evaluate_group", "sweep"]

Backend = Literal["local", "ray"]
ModelSpec = str | Callable[..., Any]


@dataclass(frozen=True)
class Point:
    """One configuration to price.

    Attributes:
        model: a zoo name (``fxcost.zoo.names()``), a ``"module:callable"`` path, or a callable;
            called as ``model(batch=..., **config)`` it returns ``(model, example_inputs)``.
        batch: the batch size to price the step at.
        device: the GPU (``fxcost.devices()``).
        config: keyword arguments of the model builder (width, depth, sequence length).
        precision: ``"fp32"``, ``"tf32"``, ``"fp16"``, ``"bf16"``, or None for the model's dtypes
            (checked when the point is made; a :class:`~fxcost.precision.Precision` is kept by name).
        train: a training step (forward, loss, backward) or a forward pass.
        strategy: a parallel plan (``"dp=2,tp=4,pp=2,mb=8"``): the point is a simulated multi-GPU
            iteration (:func:`fxcost.simulate`, training only) on ``cluster``, by default one node of
            as many ``device`` GPUs as the strategy needs; ``batch`` is then the global batch.
        cluster: ``"2x8xA100-SXM4-80GB"``; only with a strategy.
        execution: ``"eager"``, ``"compiled"`` (Inductor's fused kernels) or ``"cudagraphs"`` (no host
            gaps); see :mod:`fxcost.propagate.compiled`.
    """

    model: ModelSpec
    batch: int
    device: str
    config: Mapping[str, Any] = field(default_factory=dict)
    precision: PrecisionArg = None
    train: bool = True
    strategy: str | None = None
    cluster: str | None = None
    execution: str = "eager"

    def __post_init__(self) -> None:
        parsed = parse_precision(self.precision)
        object.__setattr__(self, "precision", None if parsed is None else parsed.name)
        check_execution(self.execution)

    def key(self) -> str:
        """A stable identity of the point (for resuming): its fields as JSON, callables by name; an
        eager point's key leaves ``execution`` out, as files written before execution modes do."""
        fields = asdict(self) | {"model": _spec_name(self.model), "config": dict(self.config)}
        if self.execution == "eager":
            del fields["execution"]
        return json.dumps(fields, sort_keys=True, default=repr)


@dataclass(frozen=True)
class Result:
    """The prediction for one point; ``error`` says why there is none."""

    point: Point
    ms: float | None = None
    fw_ms: float | None = None
    bw_ms: float | None = None
    error: str | None = None

    @property
    def samples_per_s(self) -> float | None:
        """Throughput: samples of the batch per second of predicted step time."""
        return None if not self.ms else self.point.batch / self.ms * 1000

    def to_json(self) -> dict[str, Any]:
        return {"point": json.loads(self.point.key()), "ms": self.ms, "fw_ms": self.fw_ms,
                "bw_ms": self.bw_ms, "error": self.error}  # fmt: skip


def sweep(
    points: Iterable[Point | Mapping[str, Any]],
    backend: Backend = "local",
    *,
    cost_model: str = "auto",
    address: str | None = None,
    out: str | Path | None = None,
    progress: bool = True,
) -> list[Result]:
    """Predict every point; results in the order of ``points``.

    Args:
        points: :class:`Point` objects, or dicts of their fields.
        backend: ``"local"`` (this process) or ``"ray"`` (one task per model group on a Ray cluster;
            connects with ``ray.init(address=address)`` unless Ray is initialized already).
        cost_model: the prediction policy or cost model.
        address: the Ray cluster to connect to (``"auto"``, ``"ray://host:10001"``); None starts a
            local Ray instance.
        out: a JSON-lines file results are appended to as they come; points already in it are not
            evaluated again, so an interrupted sweep resumes where it stopped.
        progress: show a progress bar.

    A point that cannot be priced (a model that fails to build or trace) gets a result with
    ``error`` set; the sweep goes on. Bad points (an unknown device, a batch below 1) fail at once,
    before anything is evaluated.

    Raises:
        ValueError: an invalid point or backend.
    """
    todo = [_as_point(p) for p in points]
    if backend not in ("local", "ray"):
        raise ValueError(f"unknown sweep backend {backend!r}; accepted: 'local', 'ray'")
    done = _read_done(out) if out is not None else {}
    results: dict[int, Result] = {}
    pending: dict[str, list[tuple[int, Point]]] = {}
    for i, point in enumerate(todo):
        known = done.get(point.key())
        if known is not None:
            results[i] = Result(point, **known)
        else:
            pending.setdefault(_group_key(point), []).append((i, point))
    groups = list(pending.values())
    run = _run_ray(groups, cost_model, address) if backend == "ray" else _run_local(groups, cost_model)
    with _ResultLog(out) as log, _progress(len(todo), len(results), progress) as advance:
        for batch_results in run:
            for i, result in batch_results:
                results[i] = result
                log.write(result)
            advance(len(batch_results))
    return [results[i] for i in range(len(todo))]


# -- evaluation ----------------------------------------------------------------------------------

Indexed = list[tuple[int, Point]]


def evaluate_group(group: Indexed, cost_model: str = "auto") -> list[tuple[int, Result]]:
    """Price the points of one group (one model and config): build the model once, trace it once."""
    from fxcost import zoo
    from fxcost.estimator import default_estimator

    estimator = default_estimator(cost_model)
    first = group[0][1]
    # Traced at the largest batch (a batch of 1 would trace static shapes, valid for itself only).
    batch = max(p.batch for _, p in group)
    try:
        model, inputs = zoo.load(first.model, batch, **first.config)
        captured = estimator.capture(
            model, inputs, first.train
        )  # one failure for the group, not one per point
    except Exception as e:
        return [(i, Result(p, error=f"{type(e).__name__}: {e}")) for i, p in group]
    out = []
    for i, p in group:
        try:
            if p.strategy is not None:
                out.append((i, Result(p, ms=_simulated_ms(model, inputs, p, estimator))))
                continue
            if captured.holds_at(p.batch):  # the usual case: no inputs to re-key
                c = captured.cost(p.device, p.batch, p.precision, p.execution)
            else:
                c = estimator.cost(model, inputs, p.train, p.batch, p.device, p.precision,
                                   execution=p.execution)  # fmt: skip
        except Exception as e:
            out.append((i, Result(p, error=f"{type(e).__name__}: {e}")))
        else:
            out.append((i, Result(p, ms=c.ms, fw_ms=c.fw_ms, bw_ms=c.bw_ms)))
    return out


def _simulated_ms(model: Any, inputs: Any, p: Point, estimator: Estimator) -> float:
    from fxcost.sim import Strategy, simulate

    strategy = Strategy.parse(p.strategy or "")
    cluster = p.cluster or f"{strategy.world_size}x{p.device}"
    return simulate(
        model,
        strategy,
        cluster,
        example_inputs=inputs,
        batch=p.batch,
        precision=p.precision,
        estimator=estimator,
        execution=p.execution,
    ).iteration_ms


def _run_local(groups: Sequence[Indexed], cost_model: str) -> Iterator[list[tuple[int, Result]]]:
    for group in groups:
        for chunk in _chunks(group, 256):  # report progress while a big group is priced
            yield evaluate_group(chunk, cost_model)


def _run_ray(
    groups: Sequence[Indexed], cost_model: str, address: str | None
) -> Iterator[list[tuple[int, Result]]]:
    try:
        import ray
    except ImportError as e:
        raise ImportError("backend='ray' needs Ray: pip install 'fxcost[ray]'") from e
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task: Any = ray.remote(evaluate_group)
    # Big groups are split so that workers share them; each worker traces the model once.
    pending = [task.remote(chunk, cost_model) for group in groups for chunk in _chunks(group, 2500)]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        yield ray.get(ready[0])


def _chunks(items: Sequence[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


# -- points --------------------------------------------------------------------------------------


def _as_point(p: Point | Mapping[str, Any]) -> Point:
    if not isinstance(p, Point):
        fields = set(Point.__dataclass_fields__)
        unknown = set(p) - fields
        if unknown:
            raise ValueError(f"unknown sweep point fields {sorted(unknown)}; accepted: {sorted(fields)}")
        p = Point(**p)
    if not isinstance(p.batch, int) or isinstance(p.batch, bool) or p.batch < 1:
        raise ValueError(f"sweep point batch must be a positive int, got {p.batch!r}")
    get_device(p.device)  # an unknown device fails here, with close matches, before anything runs
    if p.strategy is not None:
        from fxcost.sim import Strategy

        Strategy.parse(p.strategy)  # a malformed strategy fails here too
        if not p.train:
            raise ValueError("a sweep point with a strategy simulates training; it needs train=True")
    elif p.cluster is not None:
        raise ValueError("a sweep point's cluster is only used with a strategy")
    return p


def _group_key(p: Point) -> str:
    """Points priced from one built model: same model, config and mode."""
    return json.dumps([_spec_name(p.model), dict(p.config), p.train], sort_keys=True, default=repr)


def _spec_name(spec: ModelSpec) -> str:
    if isinstance(spec, str):
        return spec
    return f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', repr(spec))}"


# -- resume and progress -------------------------------------------------------------------------


def _read_done(path: str | Path) -> dict[str, dict[str, Any]]:
    """Results already in a JSON-lines file, by point key (a torn last line is ignored)."""
    done: dict[str, dict[str, Any]] = {}
    path = Path(path)
    if not path.exists():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line being written when the sweep was interrupted
        if row.get("error") is None:
            key = json.dumps(row["point"], sort_keys=True, default=repr)
            done[key] = {k: row[k] for k in ("ms", "fw_ms", "bw_ms")}
    return done


class _ResultLog:
    """Appends results to a JSON-lines file, one flushed line each (nothing when ``path`` is None)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self.file: Any = None

    def __enter__(self) -> _ResultLog:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = _ends_mid_line(self.path)
            self.file = self.path.open("a", encoding="utf-8")
            if torn:  # end the line an interrupted run was writing, so the next result starts afresh
                self.file.write("\n")
        return self

    def write(self, result: Result) -> None:
        if self.file is not None:
            self.file.write(json.dumps(result.to_json(), default=_finite) + "\n")
            self.file.flush()

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()


def _ends_mid_line(path: Path) -> bool:
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else repr(x)


@contextlib.contextmanager
def _progress(total: int, done: int, show: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar over the points (or nothing), advanced by the number of new results."""
    with progress_bars(show and done < total) as update:
        count = done
        update("sweep", count, total)

        def advance(n: int) -> None:
            nonlocal count
            count += n
            update("sweep", count, total)

        yield advance
