"""``fxcost.simulate``: one training iteration of a parallel plan on a cluster, simulated.

The step is traced once (:class:`~fxcost.estimator.Estimator`, no GPU needed), compiled into
per-stage tasks for the strategy (:mod:`fxcost.sim.plan`), its collectives priced on the cluster's
links (:mod:`fxcost.sim.cluster`) and the tasks run through the event simulator
(:mod:`fxcost.sim.engine`). The result has the iteration time, throughput, every stage's timeline
(exportable for Perfetto), its peak memory and the OOM verdict, and the collectives issued.

Example:
    >>> result = fxcost.simulate(model, "dp=2,tp=4,pp=2,mb=8", "2x8xA100-SXM4-80GB",
    ...                          example_inputs=(tokens, targets))  # doctest: +SKIP
    >>> result.iteration_ms, result.samples_per_s, result.oom  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fxcost._checks import positive_int
from fxcost._io import atomic_write
from fxcost.capture import LossFn, as_call, batch_of, default_loss
from fxcost.cost_models.heads import spec_sheet_caveat
from fxcost.estimator import Captured, Estimator, default_estimator
from fxcost.precision import PrecisionArg, parse_precision
from fxcost.propagate import check_execution
from fxcost.sim.cluster import Cluster, link_sharing, ring_hop
from fxcost.sim.deepen import deepen
from fxcost.sim.engine import GAMMA, Task, simulate_tasks, to_chrome_trace
from fxcost.sim.memory import Memory, optimizer_step_ms, rank_memory
from fxcost.sim.nccl import comm_ms
from fxcost.sim.plan import Comm, Plan, compile_plan, host_bound
from fxcost.sim.ranks import groups_of, stage_ranks
from fxcost.sim.recompute import rerun_collectives, rerun_ms
from fxcost.sim.schedule import chunk_segments, neighbour, run_order, upstream
from fxcost.sim.strategy import Strategy
from fxcost.sim.zero import step_comms

__all__ = ["AFTER_STEP", "GAMMA", "OPTIMIZER_STEP", "SimResult", "simulate"]

OPTIMIZER_STEP = "optimizer step"  # the name of each stage's optimizer-step task
AFTER_STEP = "gather updated shards"  # and of ZeRO 2's all-gathers after it


@dataclass
class SimResult:
    """A simulated iteration.

    Attributes:
        iteration_ms: forward and backward of one global batch and the optimizer step after them (a
            fused Adam's traffic at the memory bandwidth, :func:`fxcost.sim.memory.optimizer_step_ms`).
        forward_backward_ms: the iteration without the optimizer step (and ZeRO 2's gathers after it):
            what a timer around the forward and backward alone measures.
        batch: the global batch.
        strategy, cluster: what was simulated.
        tasks: every stage's timeline (one representative rank per pipeline stage).
        memory: peak memory of one rank per stage.
        collectives: (kind, group, bytes) -> how many times one rank issues it per iteration.
        interval_ms: the nominal 80% interval of ``iteration_ms``: the iteration simulated again with
            every compute task at the low and the high end of the compute's interval (collectives as
            predicted; see :mod:`fxcost.cost_models.heads.step_intervals`).
    """

    iteration_ms: float
    batch: int
    strategy: Strategy
    cluster: Cluster
    tasks: list[Task]
    memory: list[Memory]
    collectives: Counter[tuple[str, str, float]] = field(default_factory=Counter)
    interval_ms: tuple[float, float] = (math.nan, math.nan)
    forward_backward_ms: float = math.nan

    @property
    def samples_per_s(self) -> float:
        return self.batch / self.iteration_ms * 1000 if self.iteration_ms > 0 else float("inf")

    @property
    def oom(self) -> bool:
        """Whether any rank runs out of memory."""
        return any(m.oom for m in self.memory)

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the simulated timeline as a Chrome/Perfetto trace JSON."""
        trace = to_chrome_trace(self.tasks, f"{self.strategy} on {self.cluster.device.name}")
        return atomic_write(Path(path), json.dumps(trace).encode())

    def summary(self) -> str:
        c = self.cluster
        lines = [
            f"{self.strategy} on {c.nodes}x{c.gpus_per_node}x{c.device.name}: "
            f"{self.iteration_ms:.1f} ms per iteration (80% interval {self.interval_ms[0]:.1f}-"
            f"{self.interval_ms[1]:.1f}), {self.samples_per_s:.1f} samples/s; "
            f"{self.forward_backward_ms:.1f} ms before the optimizer step",
        ]
        lines += [f"  stage {i} memory: {m}" for i, m in enumerate(self.memory)]
        caveat = spec_sheet_caveat(c.device)
        return "\n".join([*lines, caveat] if caveat else lines)


def simulate(
    model: torch.nn.Module | Callable[..., Any] | Captured | str | Path | dict[str, Any],
    strategy: Strategy | str,
    cluster: Cluster | str,
    *,
    example_inputs: Any = None,
    batch: int | None = None,
    seqlen: int | None = None,
    params: Mapping[str, int] | None = None,
    precision: PrecisionArg = None,
    gamma: float = GAMMA,
    loss_fn: LossFn = default_loss,
    estimator: Estimator | None = None,
    execution: str = "eager",
    layers: int | Sequence[int] | None = None,
) -> SimResult:
    """Simulate one training iteration of ``model`` under ``strategy`` on ``cluster``.

    Args:
        model: a module (with ``example_inputs`` at any batch), a Hugging Face ``config.json`` path
            or its dict (with ``batch`` and ``seqlen``), or a step traced already (a ``Captured``, with
            ``params``).
        strategy: a :class:`Strategy` or its string form ``"dp=2,tp=4,pp=2,mb=8,zero=1"``.
        cluster: a :class:`Cluster` or its string form ``"2x8xA100-SXM4-80GB"``.
        batch: the global batch (default: the inputs' batch).
        params: parameter counts by module path (default: from the model).
        precision: ``"fp16"``/``"bf16"``/``"tf32"`` to price the step in that precision.
        gamma: the overlap factor (compute slows by this share while gradients are reduced).
        estimator: traces and prices the step (its cost model and cache); the process-wide default
            Estimator if None.
        execution: ``"eager"``, ``"compiled"`` or ``"cudagraphs"``: every compute task is scaled by
            what that mode makes of one rank's micro-batch step on one GPU (its step over the eager
            step, :meth:`~fxcost.estimator.Captured.cost`); collectives are left as they are.
        layers: simulate the model as this many layers deep: its traced layers (alike, at least
            one) stand for ``layers`` of them, the last one repeated (:func:`fxcost.sim.deepen.deepen`), so
            that a model of hundreds of layers is traced with two; or one traced layer's index per layer,
            for layers of kinds (:meth:`fxcost.zoo.decoders.Decoder.layer_sources`). None: as traced.

    Raises:
        ValueError: ``batch`` or ``seqlen`` is below 1, the strategy needs another number of GPUs than
            the cluster has, or does not fit the model (the batch does not split into ``dp x mb``
            micro-batches, ``tp`` does not divide the attention heads and the width, ``pp`` exceeds
            the layers).
    """
    batch = None if batch is None else positive_int("batch", batch)
    seqlen = None if seqlen is None else positive_int("seqlen", seqlen)
    strategy = Strategy.parse(strategy) if isinstance(strategy, str) else strategy
    cluster = Cluster.parse(cluster) if isinstance(cluster, str) else cluster
    parsed = parse_precision(precision)
    check_execution(execution)
    if strategy.world_size != cluster.world_size:
        raise ValueError(
            f"strategy {strategy} needs {strategy.world_size} GPUs, the cluster has {cluster.world_size} "
            f"({cluster.nodes} nodes x {cluster.gpus_per_node})"
        )
    captured, params, batch = _traced(
        model, example_inputs, batch, seqlen, params, loss_fn, strategy, estimator or default_estimator()
    )
    if layers is None:
        plan = compile_plan(captured, params, strategy, cluster.device, batch, parsed)
    else:
        one_stage = dataclasses.replace(strategy, pp=1, vpp=1)
        plan = compile_plan(captured, params, one_stage, cluster.device, batch, parsed)
        plan = deepen(plan, params, strategy, layers)
    tasks, collectives = _tasks(plan, cluster)
    if execution != "eager":
        micro = strategy.micro_batch(batch)
        step = captured.cost(cluster.device, micro, parsed, execution).ms
        eager = captured.cost(cluster.device, micro, parsed).ms
        tasks = _scaled(tasks, step / eager if eager > 0 else 1.0)
    iteration = simulate_tasks(tasks, gamma)
    forward_backward = max(
        (t.end_ms for t in tasks if t.name not in (OPTIMIZER_STEP, AFTER_STEP)), default=0.0
    )
    interval = tuple(_scaled_iteration(tasks, factor, gamma) for factor in plan.compute_interval)
    capacity = cluster.device.memory_gb or float("inf")
    memory = [rank_memory(plan, st, capacity) for st in plan.stages]
    return SimResult(iteration, batch, strategy, cluster, tasks, memory, collectives, interval,  # type: ignore[arg-type]
                     forward_backward)  # fmt: skip


def _scaled_iteration(tasks: list[Task], factor: float, gamma: float) -> float:
    """The iteration with every compute task ``factor`` times as long (the tasks are left as they are)."""
    return simulate_tasks(_scaled(tasks, factor), gamma)


def _scaled(tasks: list[Task], factor: float) -> list[Task]:
    """Copies of ``tasks`` with every compute task ``factor`` times as long, but the optimizer step: a
    memory pass at the bandwidth, not a kernel the cost models predict."""

    def copy(t: Task) -> Task:  # the engine sets only a task's times: its deps and args are shared
        scaled = t.stream == "compute" and t.name != OPTIMIZER_STEP
        return Task(
            t.name, t.stage, t.stream, t.duration_ms * factor if scaled else t.duration_ms, t.deps, t.args
        )

    return [copy(t) for t in tasks]


def _traced(
    model: Any, example_inputs: Any, batch: int | None, seqlen: int | None,
    params: Mapping[str, int] | None, loss_fn: LossFn, strategy: Strategy, estimator: Estimator,
) -> tuple[Captured, Mapping[str, int], int]:  # fmt: skip
    """The step traced where it holds at one rank's micro-batch, its parameters, the global batch."""
    if isinstance(model, Captured):
        if params is None:
            raise ValueError("simulating a Captured step needs params= (parameter counts by module path)")
        return model, params, batch if batch is not None else model.batch or 1
    if isinstance(model, (str, Path, dict)):
        from fxcost.zoo.hf import hf_step

        if batch is None or seqlen is None:
            raise ValueError("a Hugging Face config needs batch= and seqlen=")
        step = hf_step(model, batch, seqlen, train=True)
        model, example_inputs, loss_fn = step.model, step.inputs, step.loss_fn
    if example_inputs is None:
        raise ValueError("simulate needs example_inputs= for a model (a tensor, tuple or dict)")
    if batch is None:
        batch = batch_of(*as_call(example_inputs)) or 1
    micro = strategy.micro_batch(batch)
    captured = estimator.capture(model, example_inputs, True, loss_fn=loss_fn, batch_size=micro)
    return captured, params if params is not None else _params_by_module(model), batch


def _params_by_module(model: Any) -> dict[str, int]:
    if not isinstance(model, torch.nn.Module):
        raise ValueError("parameters are read from an nn.Module; pass params= for other callables")
    counts: Counter[str] = Counter()
    for name, p in model.named_parameters():
        counts[name.rpartition(".")[0]] += p.numel()
    return dict(counts)


def _tasks(plan: Plan, cluster: Cluster) -> tuple[list[Task], Counter[tuple[str, str, float]]]:
    """The plan as simulator tasks, in each stage's schedule order, and the collectives issued."""
    s = plan.strategy
    groups = groups_of(s)
    # Groups of one kind run the same collectives at the same time; a stage's simulated group shares
    # its links as the most crowded of the stage's groups does.
    sharing = {kind: link_sharing([g for stage in by_stage for g in stage], cluster)
               for kind, by_stage in groups.items()}  # fmt: skip
    collectives: Counter[tuple[str, str, float]] = Counter()
    priced: dict[tuple[Comm, int, int], float] = {}
    tasks: list[Task] = []

    def add(task: Task) -> int:
        tasks.append(task)
        return len(tasks) - 1

    def placed(group: str, stage: int, peer: int) -> tuple[list[int], float]:
        """The simulated rank's group for a collective of ``stage`` (with ``peer`` for a pipeline
        send), and how many groups share its links."""
        if group == "pp":  # every rank of the stage sends to its counterpart on the peer stage at once
            pairs = [[a, b] for a, b in zip(stage_ranks(s, stage), stage_ranks(s, peer), strict=True)]
            return pairs[0], max(link_sharing(pairs, cluster))
        if group == "cp":  # a ring's step: every rank sends to the next, the slowest hop bounds it
            return ring_hop(groups["cp"][stage], cluster)
        mine, n = groups[group][stage], len(groups[group][stage])
        return mine[0], max(sharing[group][stage * n : (stage + 1) * n])

    def communicate(c: Comm, stage: int, deps: list[int], name: str | None = None, peer: int = -1) -> int:
        """Add collective ``c`` of ``stage`` (sent to ``peer``) as a task on its stream, priced on the
        stage's own group once per kind, group, size and peer."""
        key = (c, stage, peer)
        if key not in priced:  # a ring's steps: each exposes what its compute does not hide
            ranks, shared = placed(c.group, stage, peer)
            priced[key] = comm_ms(c, ranks, cluster, sharing=shared)
        collectives[(c.kind, c.group, c.nbytes)] += c.steps
        args = {"kind": c.kind, "group": c.group, "bytes": c.nbytes}
        return add(Task(name or f"{c.kind} {c.group}", stage, c.stream, priced[key], deps, args))

    first: dict[tuple[str, int, int, int], int] = {}  # (F/B, stage, chunk, micro-batch) -> its first task
    done: dict[tuple[str, int, int, int], int] = {}  # ... and its last
    gradients: list[tuple[int, Comm, int]] = []  # (stage, reduction, the backward task it follows)
    last_backward: dict[int, int] = {}
    for st in plan.stages:
        recomputed: defaultdict[str, float] = defaultdict(float)  # the forward ms a layer runs again
        rerun: defaultdict[str, list[Comm]] = defaultdict(list)  # and the collectives it reruns
        for seg in st.forward:
            policy = s.recompute_of(seg.layer)
            if policy == "none":
                continue
            recomputed[seg.layer] += rerun_ms(policy, host_bound(seg), seg.rerun_ms)
            rerun[seg.layer] += rerun_collectives(policy, seg.inside)
        chunks = chunk_segments(st, s.vpp)
        ahead: list[int] = []  # what the latest compute task waited for: a prefetch may start then
        for direction, chunk, m in run_order(s, st.index):
            prev: int | None = None
            key = (direction, st.index, chunk, m)
            first[key] = len(tasks)
            again = set(recomputed) if direction == "B" else set()  # layers still to recompute
            for seg in chunks[chunk][0 if direction == "F" else 1]:
                deps = [] if prev is None else [prev]
                if prev is None and direction == "B" and ("F", *key[1:]) in done:
                    deps.append(done[("F", *key[1:])])
                for c in seg.before:  # a prefetched gather starts as the compute before it does
                    deps = [communicate(c, st.index, ahead if c.stream == "param" else deps), *deps]
                duration = host_bound(seg)
                # A recomputed layer runs (part of) its forward again first, with the collectives it reruns.
                inside = list(seg.inside)
                if seg.layer in again:
                    again.discard(seg.layer)
                    duration += recomputed[seg.layer]
                    inside = rerun[seg.layer] + inside
                ahead = list(deps)
                prev = add(Task(f"{direction}{m} {seg.layer or 'outer'}", st.index, "compute", duration, deps,
                                {"micro_batch": m, "ops": seg.ops, "chunk": chunk}))  # fmt: skip
                for c in inside:
                    prev = communicate(c, st.index, [prev])
                if direction == "B" and (m == s.micro_batches - 1 or s.zero >= 2):  # sharded gradients:
                    gradients += [(st.index, c, prev) for c in seg.after]  # reduced every micro-batch
            if prev is None:
                del first[key]
                continue
            peer = neighbour(direction, st.index, chunk, s.pp, s.vpp)
            if peer is not None:
                send = Comm("send_recv", plan.boundary_bytes, "pp", "feature")
                name = "send activations" if direction == "F" else "send gradients"
                prev = communicate(send, st.index, [prev], name, peer[0])
            done[key] = prev
            if direction == "B":
                last_backward[st.index] = prev
    # A micro-batch's forward on a (virtual) stage waits for the previous one's, its backward for the next's.
    for (direction, stage, chunk, m), task in first.items():
        up = upstream(direction, stage, chunk, s.pp, s.vpp)
        if up is not None and (direction, *up, m) in done:
            tasks[task].deps.append(done[(direction, *up, m)])
    reduced: dict[int, list[int]] = {}
    for stage, c, after in gradients:
        deps = [after] if s.overlap_grad_reduce else [last_backward.get(stage, after)]
        reduced.setdefault(stage, []).append(communicate(c, stage, deps))
    # Each rank steps its optimizer once its last backward is done and its gradients are reduced.
    for st in plan.stages:
        if st.index in last_backward:
            ms = optimizer_step_ms(st.params, st.expert_params, s, cluster.device)
            deps = [last_backward[st.index], *reduced.get(st.index, [])]
            step = add(Task(OPTIMIZER_STEP, st.index, "compute", ms, deps, {"params": st.params}))
            for c in step_comms(s, st.params, st.expert_params, plan.itemsize):
                communicate(c, st.index, [step], AFTER_STEP)
    return tasks, collectives
