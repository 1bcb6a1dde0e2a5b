"""Peak memory of one rank: parameters, gradients, optimizer state, activations; the OOM verdict.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, §5): with ``Ψ`` parameters on a rank,
fp32 training with Adam holds ``4Ψ`` bytes of parameters, ``4Ψ`` of gradients and ``8Ψ`` of
optimizer state (first and second moments). Mixed precision (fp16/bf16) holds ``2Ψ + 2Ψ`` of
half-precision parameters and gradients and ``12Ψ`` of fp32 master weights and moments. ZeRO stage 1
shards the optimizer state over the ``dp`` ranks, stage 2 the gradients too, stage 3 the parameters
too; with context parallelism over the ``dp * cp`` ranks that reduce the gradients, expert parameters
(:mod:`fxcost.sim.moe`) over the ``dp * cp / ep`` holding the same experts. Activations: the bytes each
micro-batch saves for its backward times the micro-batches in flight (all of them for GPipe,
``pp - stage`` for 1F1B); recomputed layers keep only their inputs,
plus, once, the largest recomputed layer's activations while it is recomputed. With sequence
parallelism the plan keeps the activations between the tensor-parallel blocks, and a recomputed
layer's input, split over the ``tp`` ranks (:mod:`fxcost.sim.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxcost.sim.plan import Plan, StagePlan

__all__ = ["Memory", "in_flight", "model_state_bytes", "rank_memory"]

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


def in_flight(schedule: str, stage: int, stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations a stage holds at its peak."""
    if schedule == "gpipe":
        return micro_batches
    return min(stages - stage, micro_batches)


def rank_memory(plan: Plan, stage: StagePlan, capacity_gb: float) -> Memory:
    """The peak memory of one rank of ``stage`` of ``plan`` on a GPU of ``capacity_gb``: the micro-batches
    in flight each hold the stage's saved activations, and a recomputed layer's activations are held
    once more while it runs again."""
    s = plan.strategy
    half = plan.itemsize == 2  # expert parameters' states are sharded over the ranks holding the same experts
    dense = model_state_bytes(stage.params - stage.expert_params, s.data_ranks, s.zero, half)
    experts = model_state_bytes(stage.expert_params, s.data_ranks // s.ep, s.zero, half)
    p, g, o = (a + b for a, b in zip(dense, experts, strict=True))
    held = in_flight(s.schedule, stage.index, s.pp, s.micro_batches)
    activations = held * stage.activation_bytes + stage.recompute_bytes
    return Memory(p, g, o, activations, capacity_gb * GIB)
