"""The execution-graph compiler (Proteus §V): a captured step and a strategy become per-stage tasks.

Input: a step traced once (:class:`~fxcost.estimator.Captured`, sizes symbolic in the batch), the
model's parameters by module, a :class:`~fxcost.sim.strategy.Strategy` and a cluster. Output: for
each pipeline stage, the compute segments of one micro-batch's forward and backward with the
collectives the strategy implies, priced on the cluster's GPU:

- **Layers and stages.** The repeated layers of the model (modules named ``<prefix>.<int>``) are split
  into ``pp`` contiguous stages (``pp x vpp`` virtual stages, :mod:`fxcost.sim.schedule`); what comes
  before the first layer in the forward (embeddings) runs on the first stage, what comes after (final
  norm, head, loss) on the last. Backward nodes follow the module they differentiate.
- **Tensor parallelism** (Megatron-LM): inside a layer, nodes of its attention and MLP children are
  split over ``tp`` ranks (:mod:`fxcost.sim.shard`) and priced at their sharded shapes. Each exit
  from a sharded region is an all-reduce of the activations (forward) or their gradients
  (backward), two per layer each way. With sequence parallelism each becomes a reduce-scatter, and an
  all-gather enters the region; the layer's nodes outside the regions run on ``1/tp`` of the tokens.
- **Data parallelism and ZeRO.** Each layer's gradients are all-reduced over ``dp`` once its last
  micro-batch's backward is done (reduce-scattered after every micro-batch from ZeRO 2); with ZeRO 3
  (FSDP) each layer's parameters are all-gathered, one layer ahead, before its forward and backward.
- **Pipeline**: activations are sent to the next stage after each micro-batch's forward, their
  gradients back after its backward.
- **Recomputation** (:mod:`fxcost.sim.recompute`): a layer runs again before its backward, and does
  not keep, its whole forward with its collectives (``full``: it keeps its input), its core attention
  (``selective``) or all but its attention and every other ``mm``, with the tensor-parallel
  collectives whose outputs it drops (``ops``).

Per-node times are kernel times: the heads' isolated-op predictions less the device's per-op
overhead, which an eager step hides (:mod:`fxcost.cost_models.eager`); a segment never takes less
than the host needs to issue its ops (:func:`fxcost.propagate.issue_bound_ms`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from fxcost.cost_models import NodeBatch
from fxcost.estimator import Captured
from fxcost.gpus import Device
from fxcost.precision import PRECISIONS, Precision, PrecisionArg, parse_precision
from fxcost.propagate import issue_bound_ms
from fxcost.records import PHASES, NodeCost
from fxcost.report import Report
from fxcost.sim import pricing
from fxcost.sim.comm import Comm
from fxcost.sim.context import add_ring, attention_nodes, kv_width, seqlen_of, split_sequence
from fxcost.sim.dims import vocabulary, width_and_tokens
from fxcost.sim.layers import in_tp_region, layer_of, layers_of, region_of
from fxcost.sim.moe import expert_plan, expert_shards, is_expert
from fxcost.sim.recompute import LINEAR, activations, core_attention, reruns
from fxcost.sim.schedule import assign_chunks, virtual_stages
from fxcost.sim.shard import (
    attention_heads,
    check_tp,
    shard_column,
    shard_node,
    shard_sequence,
    shard_vocabulary,
)
from fxcost.sim.strategy import Strategy
from fxcost.sim.zero import zero_collectives

__all__ = [
    "Comm",
    "Plan",
    "Segment",
    "StagePlan",
    "add_layer_collectives",
    "compile_plan",
    "host_bound",
    "itemsize_of",
    "layer_of",
    "layers_of",
]


@dataclass
class Segment:
    """A run of consecutive nodes of one layer (or of the non-layer part) in one direction: its
    compute ms, and the collectives it issues (before it, inside it, after it)."""

    layer: str  # the layer module, or "" outside the layers
    compute_ms: float
    ops: int
    before: list[Comm] = field(default_factory=list)
    inside: list[Comm] = field(default_factory=list)
    after: list[Comm] = field(default_factory=list)
    saved_bytes: float = 0.0  # a forward segment: the bytes its nodes write (kept for the backward)
    # by partial recompute policy: the kernel ms and bytes written of the forward nodes it reruns
    rerun_ms: dict[str, float] = field(default_factory=dict)
    rerun_bytes: dict[str, float] = field(default_factory=dict)
    chunk: int = 0  # the model chunk of its stage it runs in (interleaved 1F1B, :mod:`fxcost.sim.schedule`)


@dataclass
class StagePlan:
    """One pipeline stage, for one micro-batch: forward and backward segments in execution order."""

    index: int
    layers: list[str]
    forward: list[Segment]
    backward: list[Segment]
    params: int  # parameters held by one rank of this stage (after tensor parallelism)
    activation_bytes: float  # kept for the backward per micro-batch on one rank (fxcost.sim.recompute)
    recompute_bytes: float  # the largest recomputed layer's activations, held while it runs again
    expert_params: int = 0  # of ``params``, the experts' (split over ``ep``; their states over dp*cp/ep)


@dataclass
class Plan:
    strategy: Strategy
    stages: list[StagePlan]
    boundary_bytes: float  # activations sent between stages per micro-batch (a rank's part with sp)
    hidden: int
    tokens: int  # tokens per micro-batch on one rank
    itemsize: int  # bytes per element of activations, parameters and gradients (4 in fp32, 2 in fp16/bf16)
    # The nominal 80% interval of the compute, as factors of its predicted time (heads.step_intervals).
    compute_interval: tuple[float, float] = (1.0, 1.0)


class _GraphLayers(NamedTuple):
    """The repeated layers of a traced step (in order, and as a set), the layer of each module ("" outside
    them) and the forward nodes selective recomputation reruns (:func:`core_attention`)."""

    order: list[str]
    known: frozenset[str]
    of_module: dict[str, str]
    core: set[tuple[int, str]]

    @classmethod
    def of(cls, report: Report) -> _GraphLayers:
        order = layers_of([n.module for n in report.nodes if n.phase in ("fw", "bw")])
        known = frozenset(order)
        of_module = {module: layer_of(module, known) for module in {n.module for n in report.nodes}}
        return cls(order, known, of_module, core_attention(report.nodes))


def itemsize_of(precision: Precision | None) -> int:
    """Bytes per element of a step run in ``precision`` (None: fp32)."""
    return (precision or PRECISIONS["fp32"]).itemsize


def compile_plan(
    captured: Captured,
    params: Mapping[str, int],
    strategy: Strategy,
    device: Device,
    batch: int,
    precision: PrecisionArg = None,
) -> Plan:
    """Per-stage segments of one micro-batch of ``captured`` under ``strategy`` on ``device``, priced
    with the capture's cost models.

    ``params``: parameter count by owning module path (``model.named_parameters()``).

    Raises:
        ValueError: the batch does not split into ``dp * micro_batches``, ``tp`` does not divide the
            attention heads and the width, or ``pp`` exceeds layers.
    """
    s = strategy
    precision = parse_precision(precision)
    micro = s.micro_batch(batch)
    chain = captured.chain
    report = captured.report
    batch_nodes = captured.node_batch(micro, precision)
    # What the traced graph alone decides, kept with its nodes for the plans that price them again.
    layers, known, layer_by_module, core = batch_nodes.derived("plan.graph", lambda: _GraphLayers.of(report))
    placed = virtual_stages(len(layers), s.pp, s.vpp)  # (stage, chunk) of each layer
    stage_of_layer = {layer: placed[i][0] for i, layer in enumerate(layers)}

    seqlen = seqlen_of(batch_nodes.nodes) if s.cp > 1 else None
    if s.cp > 1 and not seqlen:
        raise ValueError(f"cp={s.cp} splits the sequence of attention and this step has none; accepted: cp=1")
    if seqlen:  # context parallelism: every node on the rank's part of the sequence
        whole_tokens = width_and_tokens(batch_nodes.nodes)[1]
        whole = batch_nodes.nodes, s.cp, seqlen, whole_tokens
        batch_nodes = batch_nodes.derived(("cp", s.cp), lambda: NodeBatch.of(split_sequence(*whole)))
    _, _, kernel, interval = pricing.priced(batch_nodes, chain, device, captured.counts.sum(axis=1))
    hidden, tokens = width_and_tokens(batch_nodes.nodes)
    vocab = vocabulary(batch_nodes.nodes)
    itemsize = itemsize_of(precision)
    forward = [
        (n, d) for n, d in zip(report.nodes, captured.index, strict=True) if n.phase == "fw" and d is not None
    ]
    experts = expert_plan(batch_nodes.nodes, forward, s, hidden, tokens, itemsize)
    if experts is not None:
        experts.price(lambda nodes: pricing.kernel_ms(NodeBatch.of(nodes), chain, device))

    # Per distinct node, its tensor-parallel shard inside a layer and outside (vocabulary-parallel).
    def in_layer(n: NodeCost) -> NodeCost | None:
        return shard_node(n, s.tp, hidden, tokens)

    def outside(n: NodeCost) -> NodeCost | None:
        return shard_vocabulary(n, s.tp, tokens, vocab) if vocab else None

    if s.tp > 1:
        layered = [n for n in batch_nodes.nodes if layer_of(n.module, known)]
        check_tp(s.tp, hidden, attention_heads(layered))

    def split_by(
        kind: str, shard: pricing.Shard, tp: int = s.tp, among: np.ndarray | None = None
    ) -> pricing.Shards:
        return pricing.shards(batch_nodes, kind, shard, tp, chain, device, among)

    layer_shard, layer_ms = split_by("layer", in_layer)
    forward_runs = captured.counts[:, PHASES.index("fw")] > 0  # column splits serve the forward only
    column_shard, column_ms = split_by("column", lambda n: shard_column(n, s.tp, tokens), among=forward_runs)
    outer_shard, outer_ms = split_by("vocabulary", outside)
    seq_tp = s.tp if s.sp else 1  # sequence parallelism splits the tokens between the regions
    seq_shard, seq_ms = split_by("sequence", lambda n: shard_sequence(n, s.tp, hidden, tokens), seq_tp)

    stages = [StagePlan(i, [x for x in layers if stage_of_layer[x] == i], [], [], 0, 0.0, 0.0)
              for i in range(s.pp)]  # fmt: skip
    boundary, rows = tokens * hidden * itemsize, [(tokens, hidden)]
    kinds = ("all_reduce", "all_gather", "reduce_scatter")
    all_reduce, gather, scatter = (Comm(kind, boundary, "tp", "feature") for kind in kinds)

    def leave(region: str) -> Comm:  # sums a sharded region's partial results (over the sequence's parts)
        return scatter if s.sp and region != "vocabulary" else all_reduce

    for phase in ("fw", "bw"):
        seen_layer = False
        current: Segment | None = None
        region: str | None = None  # the sharded child (attention, MLP) being run, if any
        ordered = [
            (n, d)
            for n, d in zip(report.nodes, captured.index, strict=True)
            if n.phase == phase and d is not None
        ]
        in_layers = [i for i, (n, _) in enumerate(ordered) if layer_by_module[n.module]]
        linears: Counter[str] = Counter()  # a layer's forward linear products so far (the "ops" policy)
        last = _last_products(ordered, layer_by_module) if phase == "fw" else set()
        for i, (node, d) in enumerate(ordered):
            layer = layer_by_module[node.module]
            inherited = False
            if not layer and current is not None and in_layers and in_layers[0] < i < in_layers[-1]:
                inherited, layer = True, current.layer  # no module amid the layers: the residual stream's
            seen_layer = seen_layer or bool(layer)
            plan = stages[_stage(layer, seen_layer, phase, stage_of_layer, s.pp)]
            segments = plan.forward if phase == "fw" else plan.backward
            if not segments or segments[-1] is not current or current.layer != layer:
                if current is not None and region is not None:
                    current.inside.append(leave(region))  # the layer ended inside a sharded region
                current, region = Segment(layer, 0.0, 0), None
                segments.append(current)
            shards: dict[int, NodeCost] = {}
            shard_ms: dict[int, float] = {}
            if inherited:  # replicated work on the residual stream; it neither enters nor leaves a region
                child = region
            elif layer:
                child = region_of(node.module, layer) if node.module.startswith(layer + ".") else None
                child = experts.region(node.module, child) if experts is not None else child
                if child and in_tp_region(node.module, layer) and s.tp_of(node.module) > 1:
                    shards, shard_ms = layer_shard, layer_ms
            else:  # outside the layers: the vocabulary-wide head, loss and embedding gradient
                child = "vocabulary"
                if s.tp_of(node.module) > 1:
                    shards, shard_ms = outer_shard, outer_ms
            sharded = d in shards
            if region is not None and (child != region or (not sharded and not layer)):
                current.inside.append(leave(region))  # leaving a sharded region: sum the partial results
                region = None
            if sharded and layer and i not in last and d in column_shard and phase == "fw":
                shards, shard_ms = column_shard, column_ms  # not the region's last product: column-parallel
            if sharded and region is None and s.sp and layer:
                current.inside.append(gather)  # entering: the whole sequence from its parts
            region = child if sharded else region
            routed = experts is not None and is_expert(node.module)  # the rank's experts, as it runs them
            if not sharded and layer and region is None and d in seq_shard and not routed:
                shards, shard_ms, sharded = seq_shard, seq_ms, True  # between the regions: split tokens
            if experts is not None:  # entering or leaving the experts: an all-to-all
                current.inside += experts.crossing(node.module)
            node_ms = float(
                shard_ms[d] if sharded else experts.ms_of(d, node.module, kernel) if experts else kernel[d]
            )
            current.compute_ms += node_ms
            current.ops += 1
            if phase == "fw":
                ran = experts.node_of(d, node.module, batch_nodes.nodes) if experts else batch_nodes.nodes[d]
                written = (shards[d] if sharded else ran).bytes_written or 0
                current.saved_bytes += written
                for policy in reruns(node, (node.graph, node.name) in core, linears, layer) if layer else ():
                    current.rerun_ms[policy] = current.rerun_ms.get(policy, 0.0) + node_ms
                    current.rerun_bytes[policy] = current.rerun_bytes.get(policy, 0.0) + written
            out = batch_nodes.nodes[d].out_shapes if layer and sharded else None  # a row-parallel output,
            if s.sp and phase == "fw" and region and out == rows == shards[d].out_shapes:
                current.inside.append(scatter)  # whole, is scattered at once: the bias and dropout run split
                region = None
        if current is not None and region is not None:
            current.inside.append(leave(region))
        if current is not None and experts is not None:
            current.inside += experts.crossing("")
    assign_chunks(stages, {layer: placed[i][1] for i, layer in enumerate(layers)}, s.vpp)
    add_layer_collectives(stages, params, known, s, itemsize)
    if seqlen:
        attention, attention_ms = attention_nodes(batch_nodes.nodes, seqlen), dict[tuple[str, str], float]()
        for n, pos in zip(report.nodes, captured.index, strict=True):
            if pos is not None and pos in attention:
                key = (layer_by_module[n.module], n.phase)
                attention_ms[key] = attention_ms.get(key, 0.0) + kernel[pos] / s.tp_of(n.module)
        kv = kv_width(batch_nodes.nodes, attention, hidden, tokens) // s.tp
        add_ring(stages, attention_ms, 2 * tokens * kv * itemsize, s.cp)
    per_rank = boundary / s.tp if s.sp else boundary  # sp: stages send, recomputed layers keep, a part
    for plan in stages:
        plan.activation_bytes, plan.recompute_bytes = activations(plan.forward, s, per_rank)
    return Plan(s, stages, per_rank, hidden, tokens, itemsize, interval)


def add_layer_collectives(
    stages: list[StagePlan], params: Mapping[str, int], layers: Collection[str], s: Strategy, itemsize: int
) -> None:
    """Parameters per stage and rank, and the data-parallel and ZeRO collectives of each layer
    (:mod:`fxcost.sim.zero`): its parameters gathered before its first forward and first backward
    segment (ZeRO 3), its gradients reduced after its last backward segment. The part outside the
    layers (embeddings, head) is held by the first and the last stage, which both reduce it, split over
    ``tp`` (Megatron's vocabulary-parallel embedding and head; the positions and the final norm,
    ``seq x h`` beside ``vocab x h``, counted as split too). Expert parameters (:mod:`fxcost.sim.moe`)
    are split over ``ep`` ranks and reduced over the ``dp * cp / ep`` holding the same experts
    ("edp"); the rest over ``dp * cp`` ("dp")."""
    per_layer: Counter[str] = Counter()
    per_expert: Counter[str] = Counter()
    for module, count in params.items():
        (per_expert if s.ep > 1 and is_expert(module) else per_layer)[layer_of(module, layers)] += count

    def held(layer: str) -> int:  # outside the layers: Megatron's vocabulary-parallel embedding and head
        return per_layer[layer] // s.tp_of(layer)

    def expert(layer: str) -> int:
        return per_expert[layer] // expert_shards(s)

    # (kind, group, share of the layer's bytes)
    gathers, reductions = zero_collectives(s, s.data_ranks, "dp", s.shard or s.data_ranks)
    edp = s.data_ranks // s.ep
    expert_gathers, expert_reductions = zero_collectives(s, edp, "edp", edp) if s.ep > 1 else ([], [])
    for plan in stages:
        held_layers = {seg.layer for seg in plan.forward + plan.backward}
        plan.expert_params = sum(expert(layer) for layer in held_layers)
        plan.params = sum(held(layer) for layer in held_layers) + plan.expert_params
        for segments in (plan.forward, plan.backward):
            for seg in {seg.layer: seg for seg in reversed(segments)}.values():  # first of each layer
                seg.before += [Comm(k, held(seg.layer) * itemsize * f, g, "param") for k, g, f in gathers]
                seg.before += [Comm(k, expert(seg.layer) * itemsize * f, g, "param")
                               for k, g, f in expert_gathers if expert(seg.layer)]  # fmt: skip
        for seg in {seg.layer: seg for seg in plan.backward}.values():  # the last of each layer
            seg.after += [Comm(k, held(seg.layer) * itemsize * f, g, "gradient") for k, g, f in reductions]
            seg.after += [Comm(k, expert(seg.layer) * itemsize * f, g, "gradient")
                          for k, g, f in expert_reductions if expert(seg.layer)]  # fmt: skip


def _last_products(ordered: Sequence[tuple[NodeCost, int]], layer_by_module: Mapping[str, str]) -> set[int]:
    """Positions in ``ordered`` of the row-parallel products: of the products of a layer's modules that
    share a parent (``self_attn``, ``mlp``, a shared expert), the last (o_proj, c_proj, down_proj); the
    ones before it are column-parallel."""
    last = {}
    for i, (n, _) in enumerate(ordered):
        if n.op in LINEAR and layer_by_module[n.module] and n.module != layer_by_module[n.module]:
            last[n.module.rpartition(".")[0]] = i
    return set(last.values())


def _stage(layer: str, seen_layer: bool, phase: str, stage_of_layer: Mapping[str, int], pp: int) -> int:
    if layer:
        return stage_of_layer[layer]
    # Outside the layers: before them in the forward (embeddings) is the first stage, after them the
    # last; the backward runs in reverse.
    before = not seen_layer
    first = before if phase == "fw" else not before
    return 0 if first else pp - 1


def host_bound(segment: Segment) -> float:
    """A segment's compute time, at least the host's time to issue its ops."""
    return issue_bound_ms(segment.compute_ms, segment.ops)
