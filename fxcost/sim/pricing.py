"""A step's nodes priced on one GPU for a plan (:func:`fxcost.sim.plan.compile_plan`), kept on the node
batch: a plan search compiles one plan per tensor-parallel degree, sequence parallelism,
context-parallel ring and expert-parallel degree from the same captured nodes, and those plans share
the predictions, the shards and their prices (the sequence-parallel and the plain plan of one ``tp``
share every shard but the sequence's).

What is kept is keyed by the device (all of its facts: a device file's GPU of the same name, or a GPU
priced :func:`~fxcost.gpus.holdout.uncalibrated`, is priced anew). It depends on the capture's cost
models (``chain``) too, which are the :class:`~fxcost.estimator.Captured`'s for every batch it gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fxcost.cost_models import CostModel, NodeBatch, predict_batch
from fxcost.cost_models.eager import kernel_times
from fxcost.cost_models.heads.step_intervals import step_bounds, step_sums
from fxcost.gpus import Device
from fxcost.records import NodeCost

__all__ = ["Priced", "Shard", "Shards", "kernel_ms", "priced", "shards"]

Priced = tuple[np.ndarray, np.ndarray, list[float], tuple[float, float]]
"""Each node's predicted ms and the model that predicted it, its kernel ms, and the step's interval."""


Shard = Callable[[NodeCost], "NodeCost | None"]
"""A node's shard on one rank, None for a node the split leaves whole."""

Shards = tuple[dict[int, NodeCost], dict[int, float]]
"""The shards of the nodes a split splits, by position, and their kernel ms."""


def priced(batch: NodeBatch, chain: Sequence[CostModel], device: Device, counts: np.ndarray) -> Priced:
    """The nodes of ``batch`` predicted on ``device`` (:data:`Priced`), the step's interval for each
    distinct node run ``counts`` times (:mod:`~fxcost.cost_models.heads.step_intervals`), as factors."""

    def compute() -> Priced:
        ms, source = predict_batch(batch, chain, device)
        total = float(np.nan_to_num(ms) @ counts)
        low, high = step_bounds(step_sums(batch.nodes, ms, source, counts, device))  # NaN: nothing
        interval = (low / total, high / total) if total > 0 else (1.0, 1.0)
        return ms, source, _kernels_of(batch, ms, source, device), interval

    return batch.derived(("plan pricing", device), compute)


def shards(
    batch: NodeBatch,
    kind: str,
    shard: Shard,
    tp: int,
    chain: Sequence[CostModel],
    device: Device,
    among: np.ndarray | None = None,
) -> Shards:
    """The nodes of ``batch`` that ``shard`` (the ``kind`` of split, over ``tp`` ranks) splits, of
    those ``among`` marks, by position, and their kernel ms on ``device`` (none when ``tp`` is 1)."""
    if tp == 1:
        return {}, {}

    def compute() -> Shards:
        found = {
            i: s
            for i, n in enumerate(batch.nodes)
            if (among is None or among[i]) and (s := shard(n)) is not None
        }
        if not found:
            return {}, {}
        kernel = kernel_ms(NodeBatch.of(list(found.values())), chain, device)
        return found, dict(zip(found, kernel, strict=True))

    return batch.derived(("plan shards", kind, tp, device), compute)


def kernel_ms(batch: NodeBatch, chain: Sequence[CostModel], device: Device) -> list[float]:
    """Kernel time per node of ``batch`` predicted by ``chain``
    (:func:`fxcost.cost_models.eager.kernel_times`, with the nodes' DRAM floors), 0 where there is no
    prediction."""
    ms, source = predict_batch(batch, chain, device)
    return _kernels_of(batch, ms, source, device)


def _kernels_of(batch: NodeBatch, ms: np.ndarray, source: np.ndarray, device: Device) -> list[float]:
    return np.nan_to_num(kernel_times(batch, ms, source, device)).tolist()
