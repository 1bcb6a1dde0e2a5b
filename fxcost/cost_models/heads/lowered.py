"""Ops the heads price as the work they lower to (:func:`lowered_work`): a composite op's sub-nodes, a
memory-bound op's passes, each priced by the head of its class and summed (:func:`lowered_ms`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.eager import MIN_KERNEL_MS, hidden_overhead_ms
from fxcost.cost_models.interface import NodeBatch
from fxcost.cost_models.latency import latency_floor_ms
from fxcost.gpus import Device
from fxcost.lowering import KernelSpec, lower
from fxcost.lowering.attention import ATTENTION_OPS
from fxcost.lowering.composite import COMPOSITE_OPS, lower_composite
from fxcost.lowering.nodes import memory_pass
from fxcost.precision import is_float
from fxcost.records import NodeCost

__all__ = ["Lowered", "lowered_ms", "lowered_work"]


@dataclass(frozen=True)
class Lowered:
    """The lowered nodes of a batch (positions), their work as one batch, and the work item's owner
    and repetitions: the owner's time is the sum of its work's times their counts. ``latency``: the
    work items (positions in ``work``) that are kernels bound by memory latency, with their spec."""

    nodes: np.ndarray
    owner: np.ndarray
    work: NodeBatch
    counts: np.ndarray
    latency: list[tuple[int, KernelSpec]]
    row_op: np.ndarray


def _latency_floored(ms: np.ndarray, lowered: Lowered, device: Device) -> np.ndarray:
    """``ms`` (the heads' times of ``lowered.work`` as memory passes on ``device``), each kernel bound by
    memory latency never below its latency floor (:func:`~fxcost.cost_models.latency.latency_floor_ms`:
    its latency-bound time plus the per-op overhead every head's time carries)."""
    if not lowered.latency:
        return ms
    floored = ms.copy()
    for j, spec in lowered.latency:
        floor = latency_floor_ms(spec, device)
        if math.isfinite(floor) and math.isfinite(floored[j]):
            floored[j] = max(floored[j], floor)
    return floored


def lowered_work(node: NodeCost) -> list[tuple[NodeCost, int, KernelSpec | None]] | None:
    """What a lowered node runs, as (node a head predicts, repetitions, the kernel it stands for where
    lowered from one): empty if it launches nothing, None where it cannot tell."""
    if node.op in ATTENTION_OPS:  # priced per GPU: its kernel depends on the target (Heads._attention_ms)
        return None
    if node.op in COMPOSITE_OPS:
        try:
            return [(sub, count, None) for sub, count in lower_composite(node)] or None
        except (IndexError, KeyError, TypeError, ValueError):  # a node without the arguments we read
            return None
    dtype = next((d for d in (*node.out_dtypes, *node.in_dtypes) if is_float(d)), "float32")
    kernels = lower(node)
    if kernels is None or not all(math.isfinite(k.bytes) for k in kernels):
        return None
    return [(memory_pass(k.bytes, dtype), 1, k) for k in kernels]


def lowered_ms(work_ms: np.ndarray, lowered: Lowered, count: int, device: Device) -> np.ndarray:
    """Each of ``count`` nodes' time from the times of ``lowered``'s work on ``device`` (each priced as
    an op timed alone): the sum of its work's times their counts, a latency-bound kernel never below
    its floor. A row op's kernels run back to back in one op: the per-op overhead each work item's
    time carries counts once (the other lowered ops keep one per item: moving them too put the
    recorded H100 steps' GPU time further off, their small passes being priced fast)."""
    total = np.zeros(count)
    work_ms = _latency_floored(work_ms, lowered, device)
    hidden = hidden_overhead_ms(device)
    kernels_ms = np.where(lowered.row_op, np.maximum(work_ms - hidden, MIN_KERNEL_MS), work_ms)
    np.add.at(total, lowered.owner, kernels_ms * lowered.counts)
    total[np.unique(lowered.owner[lowered.row_op])] += hidden
    return total
