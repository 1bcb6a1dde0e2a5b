"""Peak memory of one rank: parameters, gradients, optimizer state, activations; the OOM verdict; and
the optimizer step's memory traffic (:func:`optimizer_step_ms`).

Model states follow the ZeRO paper (Rajbhandari et al. 2020, §5): with ``Ψ`` parameters on a rank,
fp32 training with Adam holds ``4Ψ`` bytes of parameters, ``4Ψ`` of gradients and ``8Ψ`` of
optimizer state (first and second moments). Mixed precision (fp16/bf16) holds ``2Ψ + 2Ψ`` of
half-precision parameters and gradients and ``12Ψ`` of fp32 master weights and moments. ZeRO stage 1
shards the optimizer state over the ``dp`` ranks, stage 2 the gradients too, stage 3 the parameters
too (HSDP: over the ``shard`` ranks of its group); with context parallelism over the ``dp * cp`` ranks
that reduce the gradients, expert parameters (:mod:`fxcost.sim.moe`) over the ``dp * cp / ep`` holding
the same experts. A ZeRO-3 rank also holds the whole parameters of the layer it computes and of the
one it prefetches, and the whole gradients of one layer until they are reduce-scattered (FSDP's
unsharded parameters and gradients). FSDP2 keeps fp32 sharded parameters and gradients
(``4 + 4 + 8`` bytes over the shard ranks) where the ZeRO paper's mixed precision counts
``2 + 2 + 12``: the same total. Activations: the bytes each micro-batch saves for its backward times
the micro-batches in flight (all of them for GPipe, ``pp - stage`` for 1F1B,
``2 (pp - stage - 1) + (vpp - 1) pp + 1`` model chunks of ``1/vpp`` of the stage's for interleaved
1F1B, on the first stage Korthikanti et al. 2022's ``pp (1 + (pp - 1) / (pp vpp))``
stage-micro-batches); a recomputing layer keeps what it does not run again (its input only, under
``full``), plus, once, the most a layer writes again while it reruns. With sequence parallelism the
plan keeps the activations between the tensor-parallel blocks, and a recomputed layer's input, split over the
``tp`` ranks (:mod:`fxcost.sim.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fxcost.sim.schedule import in_flight_chunks

if TYPE_CHECKING:
    from fxcost.gpus import Device
    from fxcost.sim.plan import Plan, StagePlan
    from fxcost.sim.strategy import Strategy

__all__ = [
    "ADAM_STEP_BYTES",
    "Memory",
    "model_state_bytes",
    "optimizer_step_bytes",
    "optimizer_step_ms",
    "rank_memory",
    "state_groups",
]

GIB = 1024**3


@dataclass(frozen=True)
class Memory:
    """Peak bytes of one rank, by kind, against the GPU's capacity."""

    params: float
    grads: float
    optimizer: float
    activations: float
    capacity: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    @property
    def oom(self) -> bool:
        """Whether the rank runs out of memory (the total exceeds the GPU's memory)."""
        return self.total > self.capacity

    def __str__(self) -> str:
        parts = ", ".join(
            f"{k} {getattr(self, k) / GIB:.2f}" for k in ("params", "grads", "optimizer", "activations")
        )
        verdict = "OUT OF MEMORY" if self.oom else "fits"
        return f"{self.total / GIB:.2f} GiB of {self.capacity / GIB:.0f} ({parts}): {verdict}"


def model_state_bytes(params: int, dp: int, zero: int, half: bool = False) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer) bytes on one rank holding ``params`` parameters, Adam."""
    weights, grads, optimizer = (2.0, 2.0, 12.0) if half else (4.0, 4.0, 8.0)
    return (
        params * weights / (dp if zero >= 3 else 1),
        params * grads / (dp if zero >= 2 else 1),
        params * optimizer / (dp if zero >= 1 else 1),
    )


ADAM_STEP_BYTES = 28
"""DRAM bytes a fused Adam step moves per parameter it updates (Megatron-LM's, apex's and DeepSpeed's
multi-tensor Adam, PyTorch's ``fused=True``): in fp32 the parameter, its gradient and both moments read
(16) and the parameter and moments written (12); in mixed precision the fp32 master weight and moments
read and written (24), the half gradient read and the half parameter written (4). PyTorch's default
``foreach`` Adam passes over the states several times: more."""


def state_groups(s: Strategy, params: int, expert_params: int) -> tuple[tuple[int, int, str], ...]:
    """A rank's ``params`` parameters (of them ``expert_params`` experts') by how their states are
    held: (parameters, the ranks their ZeRO states are sharded over, the group reducing their
    gradients), dense ones first (over ``dp * cp``, or HSDP's ``shard``), then the experts' (over the
    ``dp * cp / ep`` replicas holding the same experts)."""
    return (
        (params - expert_params, s.shard or s.data_ranks, "dp"),
        (expert_params, s.data_ranks // s.ep, "edp"),
    )


def optimizer_step_bytes(params: int, expert_params: int, s: Strategy) -> float:
    """DRAM bytes one rank's optimizer step moves for a stage of ``params`` parameters per rank (of them
    ``expert_params`` experts'): :data:`ADAM_STEP_BYTES` for each parameter it updates, all it holds
    under ZeRO 0, its ``1 / ranks`` share of them from ZeRO 1 (:func:`state_groups`)."""
    return sum(
        ADAM_STEP_BYTES * count / (ranks if s.zero else 1)
        for count, ranks, _ in state_groups(s, params, expert_params)
    )


def optimizer_step_ms(params: int, expert_params: int, s: Strategy, device: Device) -> float:
    """The optimizer step of one rank holding ``params`` parameters (:func:`optimizer_step_bytes`) at
    the GPU's memory bandwidth: a floor, as a memory-bound pass at the spec-sheet rate is; 0 where the
    bandwidth is unknown (the DRAM floor's convention, :mod:`fxcost.cost_models.eager`)."""
    bandwidth = device.mem_bandwidth_gbps
    if not bandwidth:
        return 0.0
    return optimizer_step_bytes(params, expert_params, s) / (bandwidth * 1e6)


def rank_memory(plan: Plan, stage: StagePlan, capacity_gb: float) -> Memory:
    """The peak memory of one rank of ``stage`` of ``plan`` on a GPU of ``capacity_gb``: the micro-batches
    in flight each hold the stage's saved activations (a model chunk's share of them with interleaved
    1F1B), a recomputed layer's activations are held once more while it runs again, and under ZeRO 3
    two layers' parameters are held whole (the one computing and the one prefetched) and one layer's
    gradients before they are reduce-scattered."""
    s = plan.strategy
    half = plan.itemsize == 2
    dense, experts = (model_state_bytes(count, ranks, s.zero, half)
                      for count, ranks, _ in state_groups(s, stage.params, stage.expert_params))  # fmt: skip
    p, g, o = (a + b for a, b in zip(dense, experts, strict=True))
    activations = in_flight_chunks(s, stage.index) * stage.activation_bytes / s.vpp + stage.recompute_bytes
    segments = stage.forward + stage.backward
    # a layer's gathers (dense and expert ones with ep) land together, and so do its reduce-scatters
    gathered = max(
        (sum(c.nbytes for c in seg.before if c.kind == "all_gather") for seg in segments), default=0.0
    )
    reduced = max(
        (sum(c.nbytes for c in seg.after if c.kind == "reduce_scatter") for seg in segments), default=0.0
    )
    if s.zero == 3:
        p, g = p + 2 * gathered, g + reduced
    return Memory(p, g, o, activations, capacity_gb * GIB)
