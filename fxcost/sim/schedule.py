"""Pipeline schedules: which layers a stage holds, and the order it runs its micro-batches.

GPipe runs every micro-batch's forward, then every backward; 1F1B (PipeDream-flush, the Megatron-LM
default) runs ``pp - stage - 1`` forwards to warm up, then alternates one forward and one backward.
Interleaved 1F1B (Narayanan et al. SC21, arXiv 2104.04473, §2.2.2) gives each stage ``vpp`` model
chunks: the layers are split into ``pp * vpp`` contiguous virtual stages and chunk ``c`` of stage
``p`` holds virtual stage ``c * pp + p``, so a micro-batch passes every stage ``vpp`` times. The
order is Megatron-LM's (``forward_backward_pipelining_with_interleaving`` in
``megatron/core/pipeline_parallel/schedules.py``): the ``k``-th forward of a stage runs chunk
``k mod (pp vpp) // pp`` on micro-batch ``k // (pp vpp) * pp + k mod pp``, the ``k``-th backward the
chunks in reverse; ``2 (pp - stage - 1) + (vpp - 1) pp`` forwards warm up (all of them when the
micro-batches are exactly ``pp``), then one forward and one backward alternate. Each of the
``vpp`` passes over the stages is shorter, so the bubble is ``(pp - 1) / (vpp m)`` of the ideal time
rather than ``(pp - 1) / m``, for ``vpp`` times the point-to-point messages and, on the first stage,
``1 + (pp - 1) / (pp vpp)`` times 1F1B's in-flight activations (Korthikanti et al. 2022, §4.2.3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxcost.sim.plan import Segment, StagePlan
    from fxcost.sim.strategy import Strategy

__all__ = [
    "assign_chunks",
    "chunk_segments",
    "in_flight_chunks",
    "neighbour",
    "run_order",
    "upstream",
    "virtual_stages",
]


def virtual_stages(layers: int, pp: int, vpp: int = 1) -> list[tuple[int, int]]:
    """For each of ``layers`` layers in order, its (stage, chunk): the layers split evenly into
    ``pp * vpp`` contiguous virtual stages, virtual stage ``v`` on stage ``v % pp`` as chunk ``v // pp``.

    Raises:
        ValueError: fewer layers than virtual stages.
    """
    virtual = pp * vpp
    if virtual > max(layers, 1):
        what = f"pp={pp} x vpp={vpp} virtual stages" if vpp > 1 else f"pp={pp} stages"
        raise ValueError(f"{what} but the model has {layers} layers to split")
    return [((i * virtual // layers) % pp, (i * virtual // layers) // pp) for i in range(layers)]


def assign_chunks(stages: Sequence[StagePlan], chunk_of: Mapping[str, int], vpp: int) -> None:
    """Set each segment's model chunk: its layer's, and outside the layers (embeddings on the first
    stage, the head on the last) the first virtual stage's chunk 0 or the last one's ``vpp - 1``."""
    for st in stages:
        for seg in st.forward + st.backward:
            seg.chunk = chunk_of[seg.layer] if seg.layer else (0 if st.index == 0 else vpp - 1)


def chunk_segments(stage: StagePlan, vpp: int) -> list[tuple[list[Segment], list[Segment]]]:
    """The stage's (forward, backward) segments of each model chunk, in execution order."""
    return [
        ([seg for seg in stage.forward if seg.chunk == c], [seg for seg in stage.backward if seg.chunk == c])
        for c in range(vpp)
    ]


def run_order(s: Strategy, stage: int) -> list[tuple[str, int, int]]:
    """The order ``stage`` runs its work: (``"F"`` or ``"B"``, model chunk, micro-batch)."""
    m, pp, vpp = s.micro_batches, s.pp, s.vpp
    if s.schedule == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    total = m * vpp
    warmup = _warmup(stage, pp, vpp, m)

    def forward(k: int) -> tuple[str, int, int]:
        return "F", k % (pp * vpp) // pp, k // (pp * vpp) * pp + k % pp

    def backward(k: int) -> tuple[str, int, int]:
        return "B", vpp - 1 - k % (pp * vpp) // pp, k // (pp * vpp) * pp + k % pp

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    return order + [backward(k) for k in range(total - warmup, total)]


def _warmup(stage: int, pp: int, vpp: int, m: int) -> int:
    """Forwards a stage runs before its first backward under (interleaved) 1F1B."""
    if vpp == 1:
        return min(pp - stage - 1, m)
    if m == pp:  # Megatron-LM: all forwards first when the micro-batches are just the stages
        return m * vpp
    return min(2 * (pp - stage - 1) + (vpp - 1) * pp, m * vpp)


def in_flight_chunks(s: Strategy, stage: int) -> int:
    """Chunk-micro-batches whose activations ``stage`` holds at its peak (the warm-up forwards and
    the one before the first backward; every one under GPipe)."""
    if s.schedule == "gpipe":
        return s.micro_batches
    return min(_warmup(stage, s.pp, s.vpp, s.micro_batches) + 1, s.micro_batches * s.vpp)


def neighbour(direction: str, stage: int, chunk: int, pp: int, vpp: int) -> tuple[int, int] | None:
    """The (stage, chunk) a forward (``"F"``) sends its activations to, or a backward its gradients
    to: the next virtual stage, or the previous; None at the model's ends."""
    virtual = chunk * pp + stage + (1 if direction == "F" else -1)
    return (virtual % pp, virtual // pp) if 0 <= virtual < pp * vpp else None


def upstream(direction: str, stage: int, chunk: int, pp: int, vpp: int) -> tuple[int, int] | None:
    """The (stage, chunk) whose forward (or backward) a forward (or backward) waits for."""
    return neighbour("B" if direction == "F" else "F", stage, chunk, pp, vpp)
