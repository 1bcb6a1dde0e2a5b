"""Which GPU ranks a parallel plan's groups hold, in Megatron-LM's rank order.

Ranks are numbered with the tensor-parallel ranks adjacent, then the context-parallel ones, then the
data-parallel replicas, then the pipeline stages (:func:`rank_of`); :func:`groups_of` lists each
stage's groups of every kind, which the simulator and the analytic pass price collectives on.
"""

from __future__ import annotations

from fxcost.sim.strategy import Strategy

__all__ = ["groups_of", "rank_of", "stage_ranks"]


def rank_of(s: Strategy, p: int, d: int, t: int, c: int = 0) -> int:
    """The rank of stage ``p``, data-parallel replica ``d``, context-parallel rank ``c``, tensor-parallel
    rank ``t``: Megatron's order (tensor-parallel ranks adjacent, then context-, then data-parallel, then
    pipeline stages)."""
    return ((p * s.dp + d) * s.cp + c) * s.tp + t


def stage_ranks(s: Strategy, p: int) -> list[int]:
    """The ranks of stage ``p``, replica by replica."""
    return [rank_of(s, p, d, t, c) for d in range(s.dp) for c in range(s.cp) for t in range(s.tp)]


def groups_of(s: Strategy) -> dict[str, list[list[list[int]]]]:
    """Each stage's groups by kind (``groups[kind][stage]``): tensor-parallel, data-parallel (the ``dp * cp``
    ranks reducing a gradient), context-parallel rings, expert-parallel (``ep`` consecutive replicas),
    expert-data-parallel (the replicas holding the same experts), and HSDP's shard and replicate groups;
    a stage's first group of each kind is its simulated rank's (rank ``rank_of(s, stage, 0, 0)``)."""
    dp, cp, tp, ep = range(s.dp), range(s.cp), range(s.tp), s.ep
    groups = {
        "tp": [[[rank_of(s, p, d, t, c) for t in tp] for d in dp for c in cp] for p in range(s.pp)],
        "dp": [[[rank_of(s, p, d, t, c) for d in dp for c in cp] for t in tp] for p in range(s.pp)],
        "cp": [[[rank_of(s, p, d, t, c) for c in cp] for d in dp for t in tp] for p in range(s.pp)],
        "ep": [
            [
                [rank_of(s, p, g * ep + e, t, c) for e in range(ep)]
                for g in range(s.dp // ep)
                for c in cp
                for t in tp
            ]
            for p in range(s.pp)
        ],
        "edp": [
            [[rank_of(s, p, d, t, c) for d in dp[e::ep] for c in cp] for e in range(ep) for t in tp]
            for p in range(s.pp)
        ],
    }
    if s.shard and s.shard < s.dp:  # HSDP: groups of consecutive replicas, and their counterparts across
        blocks = [range(b, b + s.shard) for b in range(0, s.dp, s.shard)]
        groups["shard"] = [[[rank_of(s, p, d, t) for d in block] for t in range(s.tp) for block in blocks]
                           for p in range(s.pp)]  # fmt: skip
        groups["replicate"] = [[[rank_of(s, p, block[j], t) for block in blocks] for t in range(s.tp)
                                for j in range(s.shard)] for p in range(s.pp)]  # fmt: skip
    return groups
