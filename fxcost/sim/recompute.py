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
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fxcost.records import NodeCost

if TYPE_CHECKING:
    from fxcost.sim.plan import Segment
    from fxcost.sim.strategy import Strategy

__all__ = ["activations", "reruns"]


def reruns(node: NodeCost, scores: bool, mms: Counter[str], layer: str) -> tuple[str, ...]:
    """The partial recompute policies under which a forward ``node`` of ``layer`` runs again:
    ``selective`` where it is core attention (``scores``: it reads or writes the ``seq x seq`` scores,
    or is a fused attention), ``ops`` unless it is a fused attention or an odd-numbered linear product
    of the layer (``mms`` counts them so far and is updated). torchtitan's list names ``aten.mm``, what
    its bias-free linears run; a linear with a bias runs the same product as ``addmm``, counted alike."""
    mm = node.op.removeprefix("aten.") in ("mm.default", "addmm.default")
    if mm:
        mms[layer] += 1
    kept = "scaled_dot_product" in node.op or (mm and mms[layer] % 2 == 1)
    return (*(("selective",) if scores else ()), *(() if kept else ("ops",)))


def activations(forward: Sequence[Segment], s: Strategy, boundary: float) -> tuple[float, float]:
    """Bytes a stage of these ``forward`` segments keeps for the backward per micro-batch under ``s``'s
    recomputation, and the most a recomputed layer writes again while it reruns (held until its
    backward has used it). A layer keeps what it does not rerun, and its input (``boundary`` bytes) where
    it reruns its first ops (``full``, ``ops``)."""
    written: defaultdict[str, float] = defaultdict(float)
    rerun: defaultdict[str, float] = defaultdict(float)
    for seg in forward:
        written[seg.layer] += seg.saved_bytes
        policy = s.recompute_of(seg.layer)
        rerun[seg.layer] += seg.saved_bytes if policy == "full" else seg.rerun_bytes.get(policy, 0.0)
    kept = sum(written[layer] - rerun[layer] for layer in written)
    kept += boundary * sum(s.recompute_of(layer) in ("full", "ops") for layer in written)
    return kept, max(rerun.values(), default=0.0)
