"""``fxcost.plan``: search the parallel plans of a decoder on a cluster, ranked by simulated iteration.

The search space is :data:`DIMENSIONS`, a table: each :class:`Dimension` names a
:class:`~fxcost.sim.strategy.Strategy` field (or ``micro_batch``, the samples of one micro-batch), the
values it takes and the rule that rejects a combination (with its reason; rejected combinations are
counted by reason). Dimensions that split the GPUs (``splits_gpus``) leave ``dp = gpus / their
product``. A new strategy field is searched by adding its row.

The search runs in three steps, sharing the expensive work among candidates:

1. **Capture** (``capture_s``): the decoder two layers deep traced once per micro-batch size and its
   nodes priced on the GPU; then one one-stage plan per tensor-parallel degree, sequence parallelism,
   context-parallel ring, expert-parallel degree and micro-batch size
   (:class:`~fxcost.sim.analytic.Pieces`), which every candidate of those five shares (from here on,
   ``search_s``).
2. **Analytic pass** (:func:`fxcost.sim.analytic.estimate`): every candidate's peak memory (exact) and
   1F1B iteration (approximate), in microseconds each.
3. **Exact pass**: the ``exact`` fastest candidates that fit in memory deepened and run through the
   event simulator, as :func:`fxcost.simulate` does (the same time to the last digit).

Candidates are ranked fitting first, exactly simulated before analytic, then by iteration; an OOM
candidate is never ranked above one that fits. ``rank_correlation`` (Spearman) and ``max_gap`` say how
well the analytic pass ranked the exactly simulated ones.

The candidates, their rates and MFU: :mod:`fxcost.sim.ranked`.

Example:
    >>> result = fxcost.plan("llama-8b", "4x8xH100-SXM", batch=256, seqlen=4096)  # doctest: +SKIP
    >>> print(result.table(top=5))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxcost._checks import positive_int
from fxcost._progress import Update
from fxcost.capture import default_loss
from fxcost.estimator import Estimator, default_estimator
from fxcost.precision import Precision, parse_precision
from fxcost.sim.analytic import Pieces, estimate
from fxcost.sim.cluster import Cluster
from fxcost.sim.deepen import deepen
from fxcost.sim.engine import simulate_tasks
from fxcost.sim.memory import GIB, rank_memory
from fxcost.sim.plan import compile_plan
from fxcost.sim.ranked import Candidate, PlanSearch, peak_tflops, spearman
from fxcost.sim.simulator import GAMMA, _tasks, _traced
from fxcost.sim.strategy import RECOMPUTE, Strategy
from fxcost.zoo.decoders import Decoder, decoder

__all__ = ["DIMENSIONS", "MICRO_SIZES", "Dimension", "Space", "candidates", "plan", "simulate_pieces"]

TRACED_LAYERS = 2


@dataclass(frozen=True)
class Space:
    """What the dimensions' values and rules are taken from."""

    model: Decoder
    gpus: int
    gpus_per_node: int
    batch: int
    micro_sizes: tuple[int, ...]
    seq: int = 0  # tokens per sequence (0: the model's context)

    @property
    def tokens(self) -> int:
        return self.seq or self.model.seq


Choice = Mapping[str, Any]


@dataclass(frozen=True)
class Dimension:
    """One searched setting: its name, its values, the reason a combination is invalid (None: valid)."""

    name: str
    values: Callable[[Space], Sequence[Any]]
    rule: Callable[[Choice, Space], str | None] = lambda choice, space: None
    splits_gpus: bool = False


def _powers_of_two(limit: int) -> tuple[int, ...]:
    return tuple(2**i for i in range(limit.bit_length()) if 2**i <= limit)


def _tp_rule(c: Choice, space: Space) -> str | None:
    return "tp does not divide the heads" if space.model.heads % c["tp"] else None


def _pp_rule(c: Choice, space: Space) -> str | None:
    return "pp exceeds the layers" if c["pp"] > space.model.layers else None


def _batch_rule(c: Choice, space: Space) -> str | None:
    return "the batch does not split" if space.batch % (c["dp"] * c["micro_batch"]) else None


def _zero_rule(c: Choice, space: Space) -> str | None:
    return "ZeRO without data parallelism" if c["zero"] and c["dp"] * c["cp"] == 1 else None


def _sp_rule(c: Choice, space: Space) -> str | None:
    return "sp without tensor parallelism" if c["sp"] and c["tp"] == 1 else None


def _cp_values(space: Space) -> tuple[int, ...]:
    return tuple(cp for cp in _powers_of_two(space.gpus) if cp == 1 or space.tokens // cp >= CP_MIN_TOKENS)


def _cp_rule(c: Choice, space: Space) -> str | None:
    return "2 x cp does not divide the sequence" if c["cp"] > 1 and space.tokens % (2 * c["cp"]) else None


def _ep_values(space: Space) -> tuple[int, ...]:
    return tuple(ep for ep in _powers_of_two(space.model.experts) if space.model.experts % ep == 0)


def _ep_rule(c: Choice, space: Space) -> str | None:
    if c["ep"] > 1 and c["tp"] > 1 and not c["sp"]:
        return "ep with tp without sp"
    return "ep does not divide dp" if c["dp"] % c["ep"] else None


def _vpp_rule(c: Choice, space: Space) -> str | None:
    if c["vpp"] == 1:
        return None
    micro_batches = space.batch // (c["dp"] * c["micro_batch"])
    if c["pp"] == 1 or micro_batches % c["pp"]:
        return "interleaving without pp stages the micro-batches fill"
    return "pp x vpp exceeds the layers" if c["pp"] * c["vpp"] > space.model.layers else None


CP_MIN_TOKENS = 1024
"""Context parallelism splits a sequence into at least this many tokens per rank in the search: it is
the remedy for sequences whose activations do not fit, and every value searched multiplies the plans
(``fxcost.simulate`` takes any ``cp``)."""

# The search space: one row per setting. Tensor parallelism stays inside a node (its all-reduces are
# on the critical path), pipeline stages and context-parallel rings are powers of two, expert
# parallelism splits a mixture's experts over data-parallel ranks, the rest as listed.
DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("tp", lambda space: _powers_of_two(space.gpus_per_node), _tp_rule, splits_gpus=True),
    Dimension("pp", lambda space: _powers_of_two(space.gpus), _pp_rule, splits_gpus=True),
    Dimension("cp", _cp_values, _cp_rule, splits_gpus=True),
    Dimension("micro_batch", lambda space: space.micro_sizes, _batch_rule),
    Dimension("zero", lambda space: (0, 1, 2, 3), _zero_rule),
    Dimension("recompute", lambda space: RECOMPUTE),
    Dimension("sp", lambda space: (False, True), _sp_rule),
    Dimension("vpp", lambda space: (1, 2), _vpp_rule),
    Dimension("ep", _ep_values, _ep_rule),
)
MICRO_SIZES = (1, 2, 4, 8)


def candidates(
    space: Space, dimensions: Sequence[Dimension] = DIMENSIONS
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Every valid combination of the dimensions' values (with ``dp``), and the invalid ones counted by
    the first rule they break."""
    valid: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    for values in itertools.product(*(d.values(space) for d in dimensions)):
        choice = dict(zip((d.name for d in dimensions), values, strict=True))
        split = math.prod(v for d, v in zip(dimensions, values, strict=True) if d.splits_gpus)
        if space.gpus % split:
            skipped["the parallel degrees do not divide the GPUs"] += 1
            continue
        choice["dp"] = space.gpus // split
        reason = next((r for d in dimensions if (r := d.rule(choice, space))), None)
        if reason:
            skipped[reason] += 1
        else:
            valid.append(choice)
    return valid, skipped


def _strategy(choice: Choice, batch: int) -> Strategy:
    names = {f.name for f in dataclasses.fields(Strategy)}
    settings = {k: v for k, v in choice.items() if k in names}
    return Strategy(**settings, micro_batches=batch // (choice["dp"] * choice["micro_batch"]))


def plan(
    model: str | Path | dict[str, Any] | Decoder,
    cluster: Cluster | str,
    batch: int,
    seqlen: int | None = None,
    *,
    precision: str | Precision | None = "bf16",
    exact: int = 3,
    micro_sizes: Sequence[int] = MICRO_SIZES,
    dimensions: Sequence[Dimension] = DIMENSIONS,
    estimator: Estimator | None = None,
    progress: Update | None = None,
) -> PlanSearch:
    """Search the parallel plans of ``model`` for a global ``batch`` of ``seqlen``-token sequences.

    Args:
        model: a named decoder (:data:`fxcost.zoo.decoders.DECODERS`), a Hugging Face ``config.json``
            of a decoder-only model (path or dict), or a :class:`~fxcost.zoo.decoders.Decoder`.
        cluster: a :class:`Cluster` or its string form ``"128x8xH100-SXM"``.
        seqlen: tokens per sequence (default: the model's context).
        precision: the training precision (default bf16).
        exact: how many of the fastest fitting plans the event simulator runs.
        micro_sizes: micro-batch sizes searched (each is traced once).
        progress: ``update(label, done, total)`` (:mod:`fxcost._progress`).

    Raises:
        ValueError: an unknown model, a bad cluster, batch, sequence length or precision, or no valid plan.
    """
    dec = decoder(model)
    cluster = Cluster.parse(cluster) if isinstance(cluster, str) else cluster
    batch = positive_int("batch", batch)
    seq = dec.seq if seqlen is None else positive_int("seqlen", seqlen)
    parsed = parse_precision(precision)
    exact = positive_int("exact", exact)
    sizes = tuple(sorted({positive_int("micro-batch size", m) for m in micro_sizes}))
    update = progress or (lambda label, done, total: None)
    space = Space(dec, cluster.world_size, cluster.gpus_per_node, batch, sizes, seq)
    choices, skipped = candidates(space, dimensions)
    if not choices:
        reasons = ", ".join(f"{n} {why}" for why, n in skipped.most_common())
        raise ValueError(
            f"no valid plan of {dec.name} for batch {batch} on {cluster} ({reasons}); accepted: a batch "
            f"that splits over the data-parallel replicas, e.g. a multiple of {cluster.world_size}"
        )
    estimator = estimator or default_estimator()
    config = dec.hf_config(dec.traced_depth(TRACED_LAYERS), seq)
    depth = dec.layer_sources(TRACED_LAYERS)  # the traced layer each of the model's layers repeats

    captured: dict[int, Any] = {}
    pieces: dict[tuple[int, bool, int, int, int], Pieces] = {}

    def piece(s: Strategy, micro: int) -> Pieces:
        """The one-stage plan of a micro-batch of ``micro`` under ``s``'s tp, sp, cp and ep (ep taking
        as many data-parallel ranks)."""
        key = (s.tp, s.sp, s.cp, s.ep, micro)
        if key not in pieces:
            traced, params, _ = captured[micro]
            one = Strategy(tp=s.tp, sp=s.sp, cp=s.cp, ep=s.ep, dp=s.ep)
            compiled = compile_plan(traced, params, one, cluster.device, micro * s.ep, parsed)
            pieces[key] = Pieces.of(compiled, params)
        return pieces[key]

    # The capture: the step traced once per micro-batch size and its nodes priced on the GPU (tp=1).
    start = time.perf_counter()
    needed = sorted({c["micro_batch"] for c in choices})
    for i, micro in enumerate(needed):
        update("tracing", i, len(needed))
        captured[micro] = _traced(config, None, micro, seq, None, default_loss, Strategy(), estimator)
        piece(Strategy(), micro)
    capture_s = time.perf_counter() - start

    start = time.perf_counter()
    tokens = batch * seq
    flops = dec.model_flops(tokens, seq)
    peak = peak_tflops(cluster.device, parsed) * 1e12 * cluster.world_size

    def candidate(
        strategy: Strategy, micro: int, analytic: float, ms: float, is_exact: bool, gib: float
    ) -> Candidate:
        rate = tokens / ms * 1000
        capacity = cluster.device.memory_gb or math.inf
        return Candidate(
            strategy,
            micro,
            analytic,
            ms,
            is_exact,
            gib,
            capacity,
            rate,
            rate / cluster.world_size,
            flops / (ms / 1000) / peak * 100,
        )

    found: list[Candidate] = []
    for i, choice in enumerate(choices):
        if i % 64 == 0:
            update("searching plans", i, len(choices))
        s, micro = _strategy(choice, batch), choice["micro_batch"]
        guess = estimate(piece(s, micro), s, depth, cluster)
        found.append(candidate(s, micro, guess.iteration_ms, guess.iteration_ms, False, guess.memory_gib))
    fitting = sorted((c for c in found if not c.oom), key=lambda c: c.iteration_ms)[:exact]
    for i, best in enumerate(fitting):
        update("simulating the best plans", i, len(fitting))
        p = piece(best.strategy, best.micro_batch)
        ms, gib = simulate_pieces(p, captured[best.micro_batch][1], best.strategy, depth, cluster)
        found[found.index(best)] = candidate(best.strategy, best.micro_batch, best.analytic_ms, ms, True, gib)
    found.sort(key=lambda c: (c.oom, not c.exact, c.iteration_ms))
    simulated = [c for c in found if c.exact]
    correlation = spearman([c.analytic_ms for c in simulated], [c.iteration_ms for c in simulated])
    gap = max((abs(c.analytic_ms / c.iteration_ms - 1) for c in simulated), default=math.nan)
    search_s = time.perf_counter() - start
    return PlanSearch(dec, cluster, batch, seq, found, skipped, capture_s, search_s, correlation, gap)


def simulate_pieces(
    pieces: Pieces,
    params: Mapping[str, int],
    strategy: Strategy,
    layers: int | Sequence[int],
    cluster: Cluster,
) -> tuple[float, float]:
    """(the simulated iteration in ms, the peak memory of the fullest rank in GiB) of ``pieces``
    deepened to ``layers`` layers (:func:`~fxcost.sim.deepen.layer_sources`) under ``strategy``: the
    steps of :func:`fxcost.simulate` after its trace, without the interval."""
    one = dataclasses.replace(pieces.plan, strategy=dataclasses.replace(strategy, pp=1, vpp=1))
    deep = deepen(one, params, strategy, layers)
    tasks, _ = _tasks(deep, cluster)
    capacity = cluster.device.memory_gb or math.inf
    peak = max(rank_memory(deep, st, capacity).total for st in deep.stages)
    return simulate_tasks(tasks, GAMMA), peak / GIB
