"""What a layer keeps for its backward and what it runs again, under each recompute policy
(:data:`~fxcost.sim.strategy.RECOMPUTE`).

:func:`reruns` says, per forward node, which partial policies (Megatron-LM's ``selective``, torchtitan's
``ops``) run it again; :func:`~fxcost.sim.plan.compile_plan` sums their kernel time and the bytes they
write into each forward segment (``Segment.rerun_ms``, ``Segment.rerun_bytes``). :func:`activations`
turns a stage's segments into the bytes it keeps and the most it holds again while a layer reruns,
for :mod:`fxcost.sim.memory`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fxcost.lowering.attention import ATTENTION_BACKWARD_OPS, ATTENTION_OPS
from fxcost.lowering.nodes import MATMULS
from fxcost.records import NodeCost

if TYPE_CHECKING:
    from fxcost.sim.plan import Comm, Segment
    from fxcost.sim.strategy import Strategy

__all__ = ["FUSED_FORWARD", "KEEPS_INPUT", "LINEAR", "SOFTMAX", "activations", "core_attention",
           "rerun_bytes", "rerun_collectives", "rerun_ms", "reruns"]  # fmt: skip


FUSED_FORWARD = ATTENTION_OPS - ATTENTION_BACKWARD_OPS
SOFTMAX = ("aten._softmax.default", "aten._safe_softmax.default")
LINEAR = ("aten.mm.default", "aten.addmm.default")
"""A linear layer's product: torchtitan's per-op policy names ``aten.mm``, what its bias-free linears
run; with a bias the same product is ``addmm``, counted alike."""


def core_attention(nodes: Sequence[NodeCost]) -> set[tuple[int, str]]:
    """The forward nodes of Megatron-LM's core attention, as ``(graph, name)``: each fused attention,
    and around each softmax over the ``seq x seq`` scores the ops connected to it through tensors of
    that shape (scaling, masking, dropout, views) up to and including the products that make the scores
    (``Q K^T``) and use them (``· V``). Followed along the graph's edges, not by shape alone: where the
    sequence is as long as the width, the hidden states have the scores' trailing shape too."""
    forward = {(n.graph, n.name): n for n in nodes if n.phase == "fw"}
    users: defaultdict[tuple[int, str], list[tuple[int, str]]] = defaultdict(list)
    for key, n in forward.items():
        for name in n.inputs:
            users[(n.graph, name)].append(key)
    core = {key for key, n in forward.items() if n.op in FUSED_FORWARD}
    for key, n in forward.items():
        if n.op not in SOFTMAX or not n.in_shapes or len(n.in_shapes[0]) < 2:
            continue
        seq = n.in_shapes[0][-1]
        if n.in_shapes[0][-2] != seq:
            continue
        stack = [key]
        while stack:
            here = stack.pop()
            if here in core:
                continue
            core.add(here)
            if forward[here].op in MATMULS and here != key:
                continue  # a product bounds the scores
            for near in [*((here[0], name) for name in forward[here].inputs), *users[here]]:
                m = forward.get(near)
                if m is not None and (m.op in MATMULS or any(x[-2:] == (seq, seq) for x in m.out_shapes)):
                    stack.append(near)
    return core


def reruns(node: NodeCost, core: bool, linears: Counter[str], layer: str) -> tuple[str, ...]:
    """The partial recompute policies under which a forward ``node`` of ``layer`` runs again:
    ``selective`` where it is ``core`` attention (:func:`core_attention`), ``ops`` unless it is a fused
    attention or an odd-numbered :data:`LINEAR` product of the layer (``linears`` counts them so far and
    is updated)."""
    linear = node.op in LINEAR
    if linear:
        linears[layer] += 1
    kept = node.op in FUSED_FORWARD or (linear and linears[layer] % 2 == 1)
    return (*(("selective",) if core else ()), *(() if kept else ("ops",)))


KEEPS_INPUT = frozenset({"full", "ops"})
"""The policies that rerun a layer's first ops, so that it keeps its input."""


def rerun_collectives(policy: str, inside: Sequence[Comm]) -> list[Comm]:
    """The collectives of a layer's forward (``inside``: ``Segment.inside``, in order) that run again
    with it under ``policy``:

    - ``full``: all of them (tensor-parallel, and the expert and context ones inside the layer).
    - ``ops``: the tensor-parallel collectives whose outputs torchtitan's per-op policy does not save
      (it saves reduce-scatters', not all-gathers' or all-reduces') and that the rerun needs: with
      sequence parallelism each all-gather, whose output the linears it feeds need again for their
      weights' gradients; without, each all-reduce but the layer's last, whose output feeds the next
      norm (``torch.utils.checkpoint`` stops rerunning once the tensors the backward needs are back,
      and the last reduction's output leaves the layer). Expert all-to-alls are not rerun.
    - ``selective``: none; its core attention runs between the collectives.
    """
    if policy == "full":
        return list(inside)
    if policy != "ops":
        return []
    reductions = [i for i, c in enumerate(inside) if c.kind == "all_reduce" and c.group == "tp"]
    rerun = {i for i, c in enumerate(inside) if c.kind == "all_gather" and c.group == "tp"}
    rerun |= set(reductions[:-1])
    return [c for i, c in enumerate(inside) if i in rerun]


def rerun_ms(policy: str, whole_ms: float, partial: Mapping[str, float]) -> float:
    """The compute a layer (or part of one) whose forward takes ``whole_ms`` runs again under ``policy``:
    all of it (``full``), its partial policy's share (``partial``: ``Segment.rerun_ms``), or none."""
    return whole_ms if policy == "full" else partial.get(policy, 0.0)


def rerun_bytes(policy: str, written: float, partial: Mapping[str, float]) -> float:
    """What a layer (or part of one) that wrote ``written`` bytes writes again under ``policy``: all of
    it (``full``), its partial policy's share (``partial``: ``Segment.rerun_bytes``), or nothing."""
    return written if policy == "full" else partial.get(policy, 0.0)


def activations(forward: Sequence[Segment], s: Strategy, boundary: float) -> tuple[float, float]:
    """Bytes a stage of these ``forward`` segments keeps for the backward per micro-batch under ``s``'s
    recomputation, and the most a recomputed layer writes again while it reruns (held until its
    backward has used it). A layer keeps what it does not rerun, and its input (``boundary`` bytes) where
    it reruns its first ops (:data:`KEEPS_INPUT`)."""
    written: defaultdict[str, float] = defaultdict(float)
    rerun: defaultdict[str, float] = defaultdict(float)
    for seg in forward:
        written[seg.layer] += seg.saved_bytes
        rerun[seg.layer] += rerun_bytes(s.recompute_of(seg.layer), seg.saved_bytes, seg.rerun_bytes)
    kept = sum(written[layer] - rerun[layer] for layer in written)
    kept += boundary * sum(s.recompute_of(layer) in KEEPS_INPUT for layer in written)
    return kept, max(rerun.values(), default=0.0)
