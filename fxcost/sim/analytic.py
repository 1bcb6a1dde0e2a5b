"""A plan's iteration and memory without the event simulation: the fast first pass of the plan search.

:class:`Pieces` summarizes a one-stage plan of a few traced layers (compiled once per tensor-parallel
degree, sequence parallelism and micro-batch size, :func:`fxcost.sim.plan.compile_plan`): each traced
layer's forward and backward compute and tensor-parallel collectives, the embeddings' and the head's,
the bytes each saves for the backward, the parameters of each. :func:`estimate` lays a deep model of
those layers out in pipeline stages as :func:`fxcost.sim.deepen.deepen` does and returns:

- **memory**: each stage's peak, by the same formulas as :func:`fxcost.sim.memory.rank_memory`, so it
  equals the simulated plan's;
- **iteration** of the 1F1B schedule (Narayanan et al. 2021, §2.2): the first micro-batch's forward
  and the last one's backward cross every stage, the other ``m - 1`` micro-batches are paced by the
  slowest stage, ``sum(F_i + B_i) + (m - 1) max(F_i + B_i)`` (with ``vpp`` chunks per stage, the
  bubble ``sum - max`` divided by ``vpp``, Narayanan et al. 2021 §2.2.2), plus the activations sent between
  stages on that path, plus the data-parallel gradient reduction that the backward does not hide (with
  ``overlap_grad_reduce``: what remains after the last micro-batch's backward, at least the reduction of
  the stage's first layer; without: all of it) and the stage's optimizer step after it
  (:func:`fxcost.sim.memory.optimizer_step_ms`), less the time the stage ends before the first one.
  ZeRO 3's parameter gathers run before every layer's forward and backward, prefetched one layer ahead:
  ``F`` and ``B`` are the first gather and the larger of the compute and the other gathers; ZeRO 2 and 3
  reduce the gradients after every micro-batch.
  Collectives are priced as the simulator prices them (:func:`fxcost.sim.cluster.collective_ms` on the
  first group of each kind, shared as the most crowded of them).

Compute beside parameter gathers and gradient reductions takes ``gamma`` longer for the overlap, as
in the simulator (the gathers after each stage's first, the reductions of ZeRO 2 and 3 beside every
micro-batch's backward, those of ZeRO 0 and 1 beside the last one's). The event simulation
(:func:`fxcost.sim.engine.simulate_tasks`) adds what this leaves out: pipeline sends that overlap
compute, the order of collectives on their streams.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from fxcost.sim.cluster import Cluster, link_sharing
from fxcost.sim.engine import GAMMA
from fxcost.sim.memory import GIB, model_state_bytes, optimizer_step_ms
from fxcost.sim.nccl import collective_ms
from fxcost.sim.plan import Comm, Plan, Segment, host_bound, layer_of
from fxcost.sim.ranks import groups_of, stage_ranks
from fxcost.sim.recompute import KEEPS_INPUT, rerun_bytes, rerun_collectives, rerun_ms
from fxcost.sim.schedule import in_flight_chunks, virtual_stages
from fxcost.sim.strategy import Strategy
from fxcost.sim.zero import step_comms

__all__ = ["Estimate", "Pieces", "estimate"]


@dataclass(frozen=True)
class _Part:
    """Consecutive segments of one direction: compute ms, the collectives inside, bytes saved."""

    compute_ms: float
    comms: tuple[Comm, ...]
    saved_bytes: float
    rerun_ms: Mapping[str, float]  # by partial recompute policy, as Segment's
    rerun_bytes: Mapping[str, float]

    @classmethod
    def of(cls, segments: Sequence[Segment]) -> _Part:
        return cls(
            sum(host_bound(seg) for seg in segments),
            tuple(c for seg in segments for c in seg.inside),
            sum(seg.saved_bytes for seg in segments),
            _summed(segments, "rerun_ms"),
            _summed(segments, "rerun_bytes"),
        )


def _summed(segments: Sequence[Segment], name: str) -> dict[str, float]:
    total: Counter[str] = Counter()
    for seg in segments:
        total.update(getattr(seg, name))
    return dict(total)


@dataclass(frozen=True)
class Pieces:
    """A one-stage plan of the traced layers, summarized by part (see the module docstring).

    Attributes:
        plan: the one-stage plan itself (deepened for the exact simulation).
        traced: the traced layers, in order; the deep model's layer ``i`` repeats ``traced[min(i, n-1)]``.
        forward, backward: by traced layer, and ``"embed"``/``"head"`` for the parts before and after.
        params: parameters by traced layer and ``""`` (outside the layers), before tensor parallelism.
    """

    plan: Plan
    traced: tuple[str, ...]
    forward: Mapping[str, _Part]
    backward: Mapping[str, _Part]
    params: Mapping[str, int]

    @classmethod
    def of(cls, plan: Plan, params: Mapping[str, int]) -> Pieces:
        """Raises ValueError for a plan of more than one stage, or one without layers."""
        if len(plan.stages) != 1 or not plan.stages[0].layers:
            raise ValueError(f"Pieces takes a one-stage plan with layers; got {len(plan.stages)} stage(s)")
        stage = plan.stages[0]
        traced = tuple(stage.layers)
        per_layer: Counter[str] = Counter()
        for module, count in params.items():
            per_layer[layer_of(module, set(traced))] += count

        def split(segments: list[Segment], first: str, last: str) -> dict[str, _Part]:
            inside = [i for i, seg in enumerate(segments) if seg.layer]
            parts = {layer: _Part.of([seg for seg in segments if seg.layer == layer]) for layer in traced}
            parts[first] = _Part.of(segments[: inside[0]])
            parts[last] = _Part.of(segments[inside[-1] + 1 :])
            return parts

        return cls(
            plan,
            traced,
            split(stage.forward, "embed", "head"),
            split(stage.backward, "head", "embed"),
            dict(per_layer),
        )


@dataclass(frozen=True)
class Estimate:
    """A plan's analytic iteration (ms) and the peak memory of its fullest rank (GiB)."""

    iteration_ms: float
    memory_gib: float
    capacity_gib: float

    @property
    def oom(self) -> bool:
        return self.memory_gib > self.capacity_gib


@lru_cache(maxsize=256)
def _prices(cluster: Cluster, dp: int, tp: int, pp: int) -> dict[str, tuple[list[int], float]]:
    """For each group kind, the first group's ranks and how many groups share its links, the groups
    laid out as the simulator lays them out."""
    s = Strategy(dp=dp, tp=tp, pp=pp)
    prices = {
        kind: (by_stage[0][0], max(link_sharing([g for stage in by_stage for g in stage], cluster)))
        for kind, by_stage in groups_of(s).items()
        if kind in ("tp", "dp")
    }
    pairs = [[a, b] for a, b in zip(stage_ranks(s, 0), stage_ranks(s, 1), strict=True)] if pp > 1 else [[0]]
    prices["pp"] = (pairs[0], max(link_sharing(pairs, cluster)))
    return prices


@lru_cache(maxsize=65536)
def _comm_ms(c: Comm, cluster: Cluster, dp: int, tp: int, pp: int) -> float:
    """``c`` priced on its group's first instance under a layout of ``dp x tp x pp`` ranks."""
    ranks, sharing = _prices(cluster, dp, tp, pp)[c.group]
    return collective_ms(c.kind, c.nbytes, ranks, cluster, sharing=sharing)


def estimate(pieces: Pieces, s: Strategy, layers: int, cluster: Cluster, gamma: float = GAMMA) -> Estimate:
    """The iteration and peak memory of ``pieces`` deepened to ``layers`` layers under ``s`` on ``cluster``;
    ``gamma``: the overlap factor, as the simulator's.

    Raises:
        ValueError: ``s.pp`` exceeds ``layers``, or ``s`` uses context or expert parallelism or HSDP,
            which this pass does not model (``fxcost.simulate`` does).
    """
    if s.pp > layers:
        raise ValueError(f"pp={s.pp} stages but the model has {layers} layers to split")
    if s.cp > 1 or s.ep > 1 or s.shard:
        raise ValueError(f"the analytic pass models dp, tp, pp, vpp, ZeRO and sp, not {s}: use simulate")

    def price(c: Comm) -> float:
        return _comm_ms(c, cluster, s.dp, s.tp, s.pp)

    plan, traced, itemsize = pieces.plan, pieces.traced, pieces.plan.itemsize
    cost: dict[tuple[str, str], float] = {}
    for direction, parts in (("F", pieces.forward), ("B", pieces.backward)):
        for name, part in parts.items():
            cost[(direction, name)] = part.compute_ms + sum(price(c) for c in part.comms)
    held = {name: count // s.tp for name, count in pieces.params.items()}  # as add_layer_collectives
    gather = (
        {name: price(Comm("all_gather", n * itemsize, "dp", "feature")) for name, n in held.items()}
        if s.zero == 3 and s.dp > 1
        else {}
    )
    kind = "reduce_scatter" if s.zero >= 2 else "all_reduce"
    reduce = (
        {name: price(Comm(kind, n * itemsize, "dp", "gradient")) for name, n in held.items()}
        if s.dp > 1
        else {}
    )
    send = price(Comm("send_recv", plan.boundary_bytes, "pp", "feature")) if s.pp > 1 else 0
    capacity = (cluster.device.memory_gb or float("inf")) * GIB

    times: list[float] = []
    backwards: list[float] = []
    steps: list[float] = []  # each stage's optimizer step and what follows it, ms
    exposed: list[float] = []
    peak = 0.0
    by_stage: list[list[str]] = [[] for _ in range(s.pp)]
    for i, (stage, _) in enumerate(virtual_stages(layers, s.pp, s.vpp)):
        by_stage[stage].append(traced[min(i, len(traced) - 1)])
    for index, mine in enumerate(by_stage):
        outer = ["embed"] * (index == 0) + ["head"] * (index == s.pp - 1)
        policy = {x: s.recompute_of(x) for x in mine}
        forward = sum(cost[("F", x)] for x in mine + outer)
        backward = sum(cost[("B", x)] for x in mine + outer)
        # The kernels of each direction, which gathers and reductions beside them slow (gamma).
        forward_kernels = sum(pieces.forward[x].compute_ms for x in mine + outer)
        backward_kernels = sum(pieces.backward[x].compute_ms for x in mine + outer)
        for x in mine:  # a recomputed layer runs its forward again, with the collectives it reruns
            part = pieces.forward[x]
            again = rerun_ms(policy[x], part.compute_ms, part.rerun_ms)
            backward += again + sum(price(c) for c in rerun_collectives(policy[x], part.comms))
            backward_kernels += again
        gathered = [*mine, *([""] if outer else [])]  # the part outside the layers is gathered once
        gathers = [gather.get(x, 0.0) for x in gathered]
        reduced = [reduce.get(x, 0.0) for x in gathered]
        rounds = s.micro_batches if s.zero >= 2 else 1  # sharded gradients are reduced every micro-batch
        beside = sum(gathers[1:])
        forward += gamma * min(forward_kernels, beside)
        beside += sum(reduced) if s.zero >= 2 and s.overlap_grad_reduce else 0.0
        backward += gamma * min(backward_kernels, beside)
        if gathers:  # prefetched one layer ahead on their own stream: the first one waits, the rest overlap
            forward = gathers[0] + max(forward, sum(gathers[1:]))
            backward = gathers[0] + max(backward, sum(gathers[1:]))
        times.append(forward + backward)
        backwards.append(backward)
        total = sum(reduced) * rounds
        if s.overlap_grad_reduce:
            last = reduced[0] + (reduced[-1] if outer and index == 0 else 0.0)
            # Reduced beside the last micro-batch's backward (ZeRO 0 and 1): all but the last reduction
            # slow its kernels, which delays the last one; a longer chain of reductions hides that.
            slowed = gamma * min(backward_kernels, total - last) if s.zero < 2 else 0.0
            exposed.append(max(last + slowed, total - backward * rounds) if total else 0.0)
        else:
            exposed.append(total)
        params = sum(held[x] for x in mine) + (held.get("", 0) if outer else 0)
        states = sum(model_state_bytes(params, s.shard or s.dp, s.zero, half=itemsize == 2))
        step = optimizer_step_ms(params, 0, s, cluster.device)
        steps.append(step + sum(price(c) for c in step_comms(s, params, 0, itemsize)))
        if s.zero == 3 and s.dp > 1:  # two layers' parameters whole (computing, prefetched), one's gradients
            states += 3 * max(held.get(x, 0) for x in gathered) * itemsize
        # As fxcost.sim.recompute.activations: a layer keeps what it does not rerun, and its input where
        # it reruns its first ops.
        rerun = [
            rerun_bytes(policy[x], pieces.forward[x].saved_bytes, pieces.forward[x].rerun_bytes) for x in mine
        ]
        saved = sum(pieces.forward[x].saved_bytes for x in outer + mine) - sum(rerun)
        saved += plan.boundary_bytes * sum(policy[x] in KEEPS_INPUT for x in mine)
        again = max(rerun, default=0.0)
        peak = max(peak, states + in_flight_chunks(s, index) * saved / s.vpp + again)
    # The bubble, the stages' time beyond the slowest one's, shrinks by the chunks per stage (vpp).
    pipe = s.micro_batches * max(times) + (sum(times) - max(times)) / s.vpp + 2 * (s.pp - 1) * send
    # Stage i ends its last backward before the stages ahead of it end theirs.
    tail = max(exposed[i] + steps[i] - sum(backwards[:i]) for i in range(s.pp))
    return Estimate(pipe + max(tail, 0.0), peak / GIB, capacity / GIB)
