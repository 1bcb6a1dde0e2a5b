"""What an eager step hides of an isolated-op prediction, and what it adds: per-op overhead and host time.

A node's predicted time is that of the op timed alone with CUDA events (how the training data and
origin traces were measured): its kernel plus a per-op overhead of launch and event latency (the
device's ``overhead_ms``, 15-27 us on the calibrated GPUs), never less than a floor. Run back to back
in an eager iteration, the GPU queue hides that overhead (:func:`kernel_ms`), and the host spends
:data:`HOST_MS` per op issuing them. :mod:`fxcost.propagate.eager` runs the two as a pipeline.

Taking an overhead off leaves a kernel time that is floored by streaming its tensors through DRAM
at the spec bandwidth (:func:`dram_floor_ms`). The overhead hidden is that of the weakest GPU a
device beats (:func:`hidden_overhead_ms`); without the floor, a memory-bound kernel of tens of
microseconds on an H100 (a bf16 rotary product, 24 MB, recorded 26 us) came out at the 2 us minimum.
The floor holds where the operands come from DRAM: on the H100/H200 recordings, 100 of 6,046
streaming kernels over L2's size ran below it, by at most 8%. Operands a previous kernel left in L2
can beat it: 925 of 16,519 kernels within L2's size ran below it, by up to 1.5x
(``benchmarks/fixtures/gpu``). L2's bandwidth has no source, so the floor does not price it.
"""

from __future__ import annotations

import math

import numpy as np

from fxcost.cost_models.interface import NodeBatch
from fxcost.gpus import Device
from fxcost.gpus.order import per_database, weaker_than
from fxcost.lowering import is_pointwise
from fxcost.records import NodeCost

__all__ = ["HOST_MS", "ISOLATED_MODELS", "MIN_KERNEL_MS", "dram_floor_ms", "hidden_overhead_ms", "kernel_ms",
           "kernel_times", "node_dram_floor_ms", "streamed_bytes"]  # fmt: skip

# Host time per launched op in eager PyTorch on a server CPU: the median CUDA-event time of the
# kernel-free nodes (size, view, getitem) in the shared per-node traces, 9-12 us.
HOST_MS = 0.010

# Cost models whose predictions are isolated-op latencies (they include the per-op overhead).
ISOLATED_MODELS = frozenset({"mlp", "mlp_ratio", "wave_scaling"})

# The shortest time a kernel occupies the GPU between its neighbours.
MIN_KERNEL_MS = 0.002

# Ops that read every operand whole and write every result, besides PyTorch's pointwise-tagged ones
# (among which clone): casts, concatenation, row normalizations and softmax, full reductions. Not
# ``copy_``, whose record counts its destination as read.
_STREAMING_OPS = frozenset({
    "aten._to_copy.default", "aten.cat.default", "aten.stack.default",
    "aten.native_layer_norm.default", "aten.native_layer_norm_backward.default",
    "aten._softmax.default", "aten._log_softmax.default", "aten._softmax_backward_data.default",
    "aten._log_softmax_backward_data.default", "aten._safe_softmax.default",
    "aten.sum.default", "aten.sum.dim_IntList", "aten.mean.default", "aten.mean.dim",
    "aten.amax.default", "aten.amin.default", "aten.var.correction", "aten.var_mean.correction",
    "aten.linalg_vector_norm.default",
})  # fmt: skip


@per_database  # every eager price reads it for the GPU and those beating it
def hidden_overhead_ms(device: Device) -> float:
    """The per-op overhead an eager step hides from the heads' origin-free predictions on ``device``:
    its calibrated overhead, raised to the largest of the GPUs it beats on every spec.

    The overhead is that of the harness that timed each op alone (launch, event latency), and the
    calibrated GPUs' differ by their hosts (P100 27 us, V100 18-21 us). The heads' times on a GPU are
    never above those of the GPUs it beats (the envelope), which carry those GPUs' overheads; taking
    off only the device's own, a V100's kernels came out longer than a P100's from isolated
    predictions that were shorter, and a step of small ops ran slower on the stronger GPU. Hiding at
    least what a weaker GPU hides keeps each kernel time, and so the step, in GPU order."""
    return max([device.overhead_ms, *(d.overhead_ms for d in weaker_than(device))])


def kernel_ms(
    predicted_ms: float,
    source: str | None,
    device: Device,
    hidden_ms: float | None = None,
    floor_ms: float = 0.0,
) -> float:
    """A node's kernel time from its predicted time by cost model ``source``.

    An isolated-op prediction loses the per-op overhead eager execution hides: for the heads,
    :func:`hidden_overhead_ms` (pass it as ``hidden_ms`` in a loop); runtime-based models added
    ``device``'s own overhead to a kernel time and lose it again. The result is never below
    :data:`MIN_KERNEL_MS` nor ``floor_ms``, the node's :func:`node_dram_floor_ms`. Other predictions
    are kernel times already."""
    if source not in ISOLATED_MODELS:
        return predicted_ms
    if source == "mlp":
        overhead = hidden_overhead_ms(device) if hidden_ms is None else hidden_ms
    else:
        overhead = device.overhead_ms
    return max(predicted_ms - overhead, MIN_KERNEL_MS, floor_ms)


def kernel_times(
    batch: NodeBatch, predicted_ms: np.ndarray, sources: np.ndarray, device: Device
) -> np.ndarray:
    """:func:`kernel_ms` of ``batch``'s nodes at once, each never below its :func:`dram_floor_ms` (NaN
    stays NaN: no prediction)."""
    sources = sources.astype(str)
    overhead = np.where(sources == "mlp", hidden_overhead_ms(device), device.overhead_ms)
    isolated = np.isin(sources, list(ISOLATED_MODELS))
    floor = np.maximum(dram_floor_ms(batch, device), MIN_KERNEL_MS)
    return np.where(isolated, np.maximum(predicted_ms - overhead, floor), predicted_ms)


def streamed_bytes(node: NodeCost) -> float:
    """The DRAM bytes ``node``'s kernels move at least: its :attr:`~fxcost.records.NodeCost.bytes`
    (each operand read once, each result written once) where its kernels do read every operand whole
    and write every result: PyTorch's pointwise ops, copies and casts, concatenation, layer norm,
    softmax and full reductions. 0 for any other op, whose recorded operands may be only partly
    touched (a gather's table, a fill's template, an in-place scatter's destination) or re-read from
    caches (GEMMs, convolutions, attention)."""
    if not node.has_kernel or node.bytes is None:
        return 0.0
    whole = node.op in _STREAMING_OPS or is_pointwise(node.op)
    return float(node.bytes) if whole else 0.0


def dram_floor_ms(batch: NodeBatch, device: Device) -> np.ndarray:
    """Each node's kernel time floor on ``device``: its :func:`streamed_bytes` at the spec sheet's DRAM
    bandwidth (0 where the GPU has none; operands resident in L2 can beat it, see the module)."""
    nbytes = batch.derived("eager.streamed_bytes", lambda: np.array([streamed_bytes(n) for n in batch.nodes]))
    return nbytes / _bytes_per_ms(device)


def node_dram_floor_ms(node: NodeCost, device: Device) -> float:
    """:func:`dram_floor_ms` of one node."""
    return streamed_bytes(node) / _bytes_per_ms(device)


def _bytes_per_ms(device: Device) -> float:
    return device.mem_bandwidth_gbps * 1e6 if device.mem_bandwidth_gbps else math.inf
