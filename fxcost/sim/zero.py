"""The data-parallel collectives of a layer under a ZeRO stage, FSDP and HSDP.

Per layer (the unit PyTorch FSDP wraps, DeepSpeed's parameter coordinator fetches and torchtitan's
``fully_shard`` is applied to), as fractions of the layer's parameter bytes on one rank:

- ZeRO 0 and 1 (DDP, Megatron's distributed optimizer): the gradients all-reduced over ``dp`` once the
  last micro-batch's backward is done.
- ZeRO 2: reduce-scattered instead, after every micro-batch (the gradients are sharded, so no rank
  keeps a whole gradient to accumulate into: DeepSpeed refuses ``no_sync`` under ZeRO 2 and 3, and
  FSDP reduce-scatters each backward unless told not to); after the optimizer step each rank's updated
  shard is all-gathered back into whole parameters (:func:`step_comms`).
- ZeRO 3 (FSDP, FSDP2, DeepSpeed ZeRO-3): also the parameters all-gathered before the forward and
  again before the backward (``reshard_after_forward``), prefetched one layer ahead.
- HSDP (``shard`` < ``dp``, FSDP2's 2-D mesh, FSDP1's ``HYBRID_SHARD``): the ZeRO-3 states are sharded
  within groups of ``shard`` consecutive data-parallel ranks and replicated across the ``dp / shard``
  groups: gathers and reduce-scatters stay in the shard group, and each rank's reduced shard is then
  all-reduced over its replicas (``1 / shard`` of the layer's bytes).

FSDP1, FSDP2 and DeepSpeed ZeRO-3 issue the same collectives at this granularity; what sets FSDP2 apart
(per-parameter DTensor sharding without FSDP1's flat-parameter padding, at most ``shard - 1`` elements
per layer; no ``recordStream`` memory held past its use) is below what the simulator resolves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxcost.sim.comm import Comm
from fxcost.sim.memory import state_groups

if TYPE_CHECKING:
    from fxcost.sim.strategy import Strategy

__all__ = ["step_comms", "zero_collectives"]

Collective = tuple[str, str, float]  # (kind, group, fraction of the layer's bytes)


def zero_collectives(
    s: Strategy, ranks: int, group: str, shard: int
) -> tuple[list[Collective], list[Collective]]:
    """(the gathers before a layer's forward and backward, the reductions after its backward) of a
    parameter reduced over ``ranks`` ranks (group ``group``) and sharded over ``shard`` of them."""
    if ranks == 1:
        return [], []
    if s.zero < 2:
        return [], [("all_reduce", group, 1.0)]
    within = "shard" if shard < ranks else group
    gathers = [("all_gather", within, 1.0)] if s.zero == 3 else []
    replicas = [("all_reduce", "replicate", 1.0 / shard)] if shard < ranks else []
    return gathers, [("reduce_scatter", within, 1.0), *replicas]


def step_comms(s: Strategy, params: int, expert_params: int, itemsize: int) -> list[Comm]:
    """The collectives after the optimizer step of a rank holding ``params`` parameters (of them
    ``expert_params`` experts', :func:`~fxcost.sim.memory.state_groups`) of ``itemsize`` bytes: ZeRO 2
    all-gathers the shards each rank updated into whole parameters, over the ranks that reduced their
    gradients. ZeRO 3 keeps them sharded (it gathers before each use); ZeRO 0 and 1 reduce whole
    gradients, the all-reduce standing for the reduce-scatter and the all-gather of the updated shards
    of Megatron's distributed optimizer."""
    if s.zero != 2:
        return []
    groups = state_groups(s, params, expert_params)
    return [Comm("all_gather", count * itemsize, group, "param") for count, ranks, group in groups
            if count and ranks > 1]  # fmt: skip
