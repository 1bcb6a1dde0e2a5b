"""A plan's iteration and memory without the event simulation: the fast first pass of the plan search.

:class:`Pieces` summarizes a one-stage plan of a few traced layers (compiled once per tensor-parallel
degree, sequence parallelism, context-parallel ring, expert-parallel degree and micro-batch size,
:func:`fxcost.sim.plan.compile_plan`): each traced layer's forward and backward compute and the
tensor-, context- and expert-parallel collectives inside them, the embeddings' and the head's, the bytes each
saves for the backward, the parameters of each. :func:`estimate` lays a deep model of
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
  Collectives are priced as the simulator prices them (:func:`fxcost.sim.nccl.comm_ms` on the first
  group of each kind, shared as the most crowded of them; a context-parallel ring's steps on its
  slowest hop, each exposing what the attention beside it does not hide), and gradients are reduced
  and ZeRO states sharded over the ``dp * cp`` ranks.

Compute beside parameter gathers and gradient reductions takes ``gamma`` longer for the overlap, as
in the simulator (the gathers after each stage's first, the reductions of ZeRO 2 and 3 beside every
micro-batch's backward, those of ZeRO 0 and 1 beside the last one's). The event simulation
(:func:`fxcost.sim.engine.simulate_tasks`) adds what this leaves out: pipeline sends that overlap
compute, the order of collectives on their streams.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from typing import NamedTuple

from fxcost.sim.cluster import Cluster, link_sharing, ring_hop
from fxcost.sim.deepen import layer_sources
from fxcost.sim.engine import GAMMA
from fxcost.sim.memory import GIB, model_state_bytes, optimizer_step_ms, state_groups
from fxcost.sim.moe import expert_shards, is_expert
from fxcost.sim.nccl import comm_ms
from fxcost.sim.plan import Comm, Plan, Segment, host_bound, layer_of
from fxcost.sim.ranks import groups_of, stage_ranks
from fxcost.sim.recompute import KEEPS_INPUT, rerun_bytes, rerun_collectives, rerun_ms
from fxcost.sim.schedule import in_flight_chunks, virtual_stages
from fxcost.sim.strategy import Strategy
from fxcost.sim.zero import step_comms, zero_collectives

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
        traced: the traced layers, in order (which of them each deep layer repeats: :func:`estimate`).
        forward, backward: by traced layer, and ``"embed"``/``"head"`` for the parts before and after.
        params: parameters by traced layer and ``""`` (outside the layers), before tensor parallelism.
        experts: of ``params``, the mixture-of-experts layers' experts' (:func:`fxcost.sim.moe.is_expert`).
    """

    plan: Plan
    traced: tuple[str, ...]
    forward: Mapping[str, _Part]
    backward: Mapping[str, _Part]
    params: Mapping[str, int]
    experts: Mapping[str, int]
    _layouts: dict[tuple[object, ...], _Layout] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def of(cls, plan: Plan, params: Mapping[str, int]) -> Pieces:
        """Raises ValueError for a plan of more than one stage, or one without layers."""
        if len(plan.stages) != 1 or not plan.stages[0].layers:
            raise ValueError(f"Pieces takes a one-stage plan with layers; got {len(plan.stages)} stage(s)")
        stage = plan.stages[0]
        traced = tuple(stage.layers)
        per_layer: Counter[str] = Counter()
        per_expert: Counter[str] = Counter()
        for module, count in params.items():
            per_layer[layer_of(module, set(traced))] += count
            if is_expert(module):
                per_expert[layer_of(module, set(traced))] += count

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
            dict(per_expert),
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


@dataclass(frozen=True)
class _Stage:
    """A pipeline stage's micro-batch (``time``: forward and backward, ms), its ``backward``, the gradient
    reduction its last backward leaves ``exposed`` and its optimizer ``step`` (ms), and its memory (bytes):
    model ``states``, the activations one micro-batch ``saved``, and the largest recomputed layer's."""

    time: float
    backward: float
    exposed: float
    step: float
    states: float
    saved: float
    again: float


class _Layout(NamedTuple):
    """:class:`Pieces` as a layout of ranks and a ZeRO stage price it: each part's time with the
    collectives inside it (``cost``, by direction and part); each layer's parameters per rank, dense
    (``held``) and its experts' (``experts``), its ZeRO 3 gathers and gradient reductions (ms) and the
    bytes each lands at once (``gathered``, ``reduced``: ZeRO 3's memory); a pipeline send; and each
    layer's rerun collectives by recompute policy (filled as plans ask)."""

    cost: dict[tuple[str, str], float]
    held: dict[str, int]
    experts: dict[str, int]
    gather: dict[str, float]
    reduce: dict[str, float]
    gathered: dict[str, float]
    reduced: dict[str, float]
    send: float
    reruns: dict[tuple[str, str], float]


def _layout(pieces: Pieces, s: Strategy, cluster: Cluster) -> _Layout:
    """:class:`_Layout` of ``pieces`` under ``s``'s dp, tp, pp, cp, ep and ZeRO stage on ``cluster``, kept
    in ``pieces``: the plans of a search share a few. Parameters, their gathers and reductions as
    :func:`fxcost.sim.plan.add_layer_collectives` has them."""
    key = (cluster, s.dp, s.tp, s.pp, s.cp, s.ep, s.zero)
    if key in pieces._layouts:
        return pieces._layouts[key]
    price = _pricer(s, cluster)
    itemsize = pieces.plan.itemsize
    cost = {
        (direction, name): part.compute_ms + sum(price(c) for c in part.comms)
        for direction, parts in (("F", pieces.forward), ("B", pieces.backward))
        for name, part in parts.items()
    }
    split = s.ep > 1  # with ep, the experts are split over its ranks and reduced over the rest
    experts = {
        name: pieces.experts.get(name, 0) // expert_shards(s) if split else 0 for name in pieces.params
    }
    held = {
        name: (n - (pieces.experts.get(name, 0) if split else 0)) // s.tp for name, n in pieces.params.items()
    }
    dense = zero_collectives(s, s.data_ranks, "dp", s.data_ranks)
    expert = zero_collectives(s, s.data_ranks // s.ep, "edp", s.data_ranks // s.ep) if split else ([], [])
    gather, reduce, gathered, reduced = {}, {}, {}, {}
    for name in pieces.params:
        shares = ((held[name], dense), (experts[name], expert))
        gathers = [Comm(k, n * itemsize * f, g, "param") for n, (gs, _) in shares for k, g, f in gs]
        reductions = [Comm(k, n * itemsize * f, g, "gradient") for n, (_, rs) in shares for k, g, f in rs]
        gather[name], reduce[name] = sum(map(price, gathers)), sum(map(price, reductions))
        gathered[name] = sum(c.nbytes for c in gathers if c.kind == "all_gather")
        reduced[name] = sum(c.nbytes for c in reductions if c.kind == "reduce_scatter")
    send = price(Comm("send_recv", pieces.plan.boundary_bytes, "pp", "feature")) if s.pp > 1 else 0.0
    pieces._layouts[key] = _Layout(cost, held, experts, gather, reduce, gathered, reduced, send, {})
    return pieces._layouts[key]


Layers = tuple[tuple[str, int], ...]
"""Names of a stage's traced layers (or parts), each with how many times the stage holds it."""


def _total(counts: Layers, value: Callable[[str], float]) -> float:
    """The sum of ``value`` over the names ``counts`` holds, each as many times as it counts."""
    return sum(n * value(x) for x, n in counts)


@lru_cache(maxsize=4096)
def _stage_layers(
    sources: tuple[int, ...], pp: int, vpp: int, traced: tuple[str, ...]
) -> tuple[tuple[str, Layers], ...]:
    """Each stage's first layer and its layers counted, of a model whose layer ``i`` repeats
    ``traced[sources[i]]``, in ``pp`` stages of ``vpp`` chunks."""
    by_stage: list[list[str]] = [[] for _ in range(pp)]
    for i, (stage, _) in enumerate(virtual_stages(len(sources), pp, vpp)):
        by_stage[stage].append(traced[sources[i]])
    return tuple((mine[0], tuple(sorted(Counter(mine).items()))) for mine in by_stage)


@lru_cache(maxsize=256)
def _prices(
    cluster: Cluster, dp: int, tp: int, pp: int, cp: int, ep: int
) -> dict[str, tuple[list[int], float]]:
    """For each group kind the layout has, the first group's ranks and how many groups share its links,
    the groups laid out as the simulator lays them out."""
    s = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, sp=tp > 1)  # sp places no rank (ep with tp needs it)
    groups = groups_of(s)
    prices = {
        kind: (groups[kind][0][0], max(link_sharing([g for stage in groups[kind] for g in stage], cluster)))
        for kind in ("tp", "dp") + ("ep", "edp") * (ep > 1)
    }
    if pp > 1:
        pairs = [[a, b] for a, b in zip(stage_ranks(s, 0), stage_ranks(s, 1), strict=True)]
        prices["pp"] = (pairs[0], max(link_sharing(pairs, cluster)))
    if cp > 1:
        prices["cp"] = ring_hop(groups["cp"][0], cluster)
    return prices


@lru_cache(maxsize=65536)
def _comm_ms(c: Comm, cluster: Cluster, dp: int, tp: int, pp: int, cp: int, ep: int) -> float:
    """``c`` priced on its group's first instance under a layout of ``dp x tp x pp x cp`` ranks, ``ep``
    of the data-parallel ones splitting the experts."""
    ranks, sharing = _prices(cluster, dp, tp, pp, cp, ep)[c.group]
    return comm_ms(c, ranks, cluster, sharing=sharing)


def _pricer(s: Strategy, cluster: Cluster) -> Callable[[Comm], float]:
    """Prices a collective under ``s``'s layout of ranks on ``cluster`` (:func:`_comm_ms`)."""
    return functools.partial(_comm_ms, cluster=cluster, dp=s.dp, tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep)


def _beyond_backward(reduced: float, backward: float, layers: int, s: Strategy) -> float:
    """How long a stage's gradient reductions (``reduced`` ms, each of its ``layers`` layers' issued once
    its last backward of the layer is done) go on after its last backward (``backward`` ms, all its
    model chunks). Interleaved 1F1B runs the backwards in groups of ``pp`` micro-batches, the last
    chunk first, so chunk ``c``'s last backward ends ``c pp`` chunk backwards before the stage's, and
    the earlier chunks' reductions run beside the later ones' backwards."""
    chunk, share, end = backward / s.vpp, reduced / s.vpp, -math.inf
    first = chunk / max(layers // s.vpp, 1)  # a chunk's first reduction waits for its first layer
    for c in reversed(range(s.vpp)):
        end = max(end, -c * s.pp * chunk - chunk + first) + share
    return end


def estimate(
    pieces: Pieces, s: Strategy, layers: int | Sequence[int], cluster: Cluster, gamma: float = GAMMA
) -> Estimate:
    """The iteration and peak memory of ``pieces`` deepened to ``layers`` layers (a depth, or each
    layer's traced layer: :func:`~fxcost.sim.deepen.layer_sources`) under ``s`` on ``cluster``;
    ``gamma``: the overlap factor, as the simulator's.

    Raises:
        ValueError: ``s.pp`` exceeds ``layers``, or ``s`` gives experts a load (``expert_load``) or
            uses HSDP, which this pass does not model (``fxcost.simulate`` does).
    """
    sources = layer_sources(layers, len(pieces.traced))
    if s.pp > len(sources):
        raise ValueError(f"pp={s.pp} stages but the model has {len(sources)} layers to split")
    if s.shard or s.expert_load is not None:
        raise ValueError(f"the analytic pass models balanced experts and no HSDP, not {s}: use simulate")

    price = _pricer(s, cluster)
    plan, itemsize = pieces.plan, pieces.plan.itemsize
    lay = _layout(pieces, s, cluster)
    cost, gather, reduce, reruns = lay.cost, lay.gather, lay.reduce, lay.reruns
    capacity = (cluster.device.memory_gb or float("inf")) * GIB

    def priced(first: str, counts: Layers, first_stage: bool, last_stage: bool) -> _Stage:
        """A stage of ``counts`` layers, ``first`` the first of them (with the embeddings on the first
        stage, the head on the last). Each distinct layer is priced once, times its count."""
        outer = (("embed", 1),) * first_stage + (("head", 1),) * last_stage
        parts = counts + outer
        policy = {x: s.recompute_of(x) for x, _ in counts}
        forward, backward = _total(parts, lambda x: cost[("F", x)]), _total(parts, lambda x: cost[("B", x)])
        # The kernels of each direction, which gathers and reductions beside them slow (gamma).
        forward_kernels = _total(parts, lambda x: pieces.forward[x].compute_ms)
        backward_kernels = _total(parts, lambda x: pieces.backward[x].compute_ms)
        # A recomputed layer runs its forward again, with the collectives it reruns.
        for x, n in counts:
            part = pieces.forward[x]
            again = rerun_ms(policy[x], part.compute_ms, part.rerun_ms)
            if (x, policy[x]) not in reruns:
                reruns[(x, policy[x])] = sum(price(c) for c in rerun_collectives(policy[x], part.comms))
            backward += n * (again + reruns[(x, policy[x])])
            backward_kernels += n * again
        held = counts + (("", 1),) * bool(outer)  # the part outside the layers is held (and gathered) once
        beside = _total(held, lambda x: gather.get(x, 0.0)) - gather.get(first, 0.0)
        reduced = _total(held, lambda x: reduce.get(x, 0.0))
        rounds = s.micro_batches if s.zero >= 2 else 1  # sharded gradients are reduced every micro-batch
        forward += gamma * min(forward_kernels, beside)
        overlapped = reduced if s.zero >= 2 and s.overlap_grad_reduce else 0.0
        backward += gamma * min(backward_kernels, beside + overlapped)
        # ZeRO 3's gathers, prefetched one layer ahead on their own stream: the first waits, the rest overlap.
        forward, backward = (gather.get(first, 0.0) + max(t, beside) for t in (forward, backward))
        exposed = reduced * rounds
        if s.overlap_grad_reduce and exposed:
            last = reduce.get(first, 0.0) + (reduce.get("", 0.0) if first_stage else 0.0)
            # Reduced beside the last micro-batch's backward (ZeRO 0 and 1): all but the last reduction
            # slow its kernels, which delays the last one; a longer chain of reductions hides that.
            slowed = gamma * min(backward_kernels, exposed - last) if s.zero < 2 else 0.0
            exposed = max(
                last + slowed, _beyond_backward(exposed, backward * rounds, sum(n for _, n in counts), s)
            )
        experts = int(_total(held, lambda x: lay.experts.get(x, 0)))
        params = int(_total(held, lambda x: lay.held.get(x, 0))) + experts
        states = sum(
            sum(model_state_bytes(count, ranks, s.zero, half=itemsize == 2))
            for count, ranks, _ in state_groups(s, params, experts)
        )
        step = optimizer_step_ms(params, experts, s, cluster.device)
        step += sum(price(c) for c in step_comms(s, params, experts, itemsize))
        # ZeRO 3 holds two layers' parameters whole (computing, prefetched) and one's gradients.
        if s.zero == 3:
            states += 2 * max(lay.gathered.get(x, 0.0) for x, _ in held)
            states += max(lay.reduced.get(x, 0.0) for x, _ in held)
        # As fxcost.sim.recompute.activations: a layer keeps what it does not rerun, and its input where
        # it reruns its first ops.
        rerun = {
            x: rerun_bytes(policy[x], pieces.forward[x].saved_bytes, pieces.forward[x].rerun_bytes)
            for x, _ in counts
        }
        saved = _total(parts, lambda x: pieces.forward[x].saved_bytes) - _total(counts, rerun.__getitem__)
        saved += plan.boundary_bytes * sum(n for x, n in counts if policy[x] in KEEPS_INPUT)
        return _Stage(
            forward + backward, backward, exposed, step, states, saved, max(rerun.values(), default=0.0)
        )

    # Stages of the same layers, the first and the last apart, are the same stage.
    memo: dict[tuple[object, ...], _Stage] = {}
    stages: list[_Stage] = []
    for index, (first, counts) in enumerate(_stage_layers(sources, s.pp, s.vpp, pieces.traced)):
        key = (first, counts, index == 0, index == s.pp - 1)
        if key not in memo:
            memo[key] = priced(*key)
        stages.append(memo[key])
    times = [st.time for st in stages]
    peak = max(
        st.states + in_flight_chunks(s, i) * st.saved / s.vpp + st.again for i, st in enumerate(stages)
    )
    # The bubble, the stages' time beyond the slowest one's, shrinks by the chunks per stage (vpp).
    pipe = s.micro_batches * max(times) + (sum(times) - max(times)) / s.vpp + 2 * (s.pp - 1) * lay.send
    # Stage i ends its last backward before the stages ahead of it end theirs.
    ahead = accumulate((st.backward for st in stages[:-1]), initial=0.0)
    tail = max(st.exposed + st.step - before for st, before in zip(stages, ahead, strict=True))
    return Estimate(pipe + max(tail, 0.0), peak / GIB, capacity / GIB)
