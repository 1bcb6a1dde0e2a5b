"""Batch norm on a CUDA GPU: the kernels of PyTorch's native NCHW path and the memory round trips that
bound them.

From ``aten/src/ATen/native/cuda/Normalization.cuh`` (``MAX_BLOCK_SIZE`` = 512, ``getNumThreads``: the
first of 32, 64, 128, 256, 512 threads that covers its argument):

- training statistics, ``batch_norm_stats_cuda_template``: ``batch_norm_collect_statistics_kernel``,
  one block per channel over the input viewed as ``(N, C, L)`` (``L`` the product of the spatial
  sizes), ``tf = getNumThreads(L)`` by ``512 / tf`` threads. Each thread walks its channel's rows
  ``threadIdx.y, +blockDim.y, ...`` and in each row the elements ``threadIdx.x, +blockDim.x, ...``,
  one load an iteration, whose value the Welford update needs before the next one is issued.
- the normalization, ``batch_norm_elemt_cuda_template``: ``batch_norm_transform_input_kernel`` on a
  ``(C, min(256·1024 / C, ceil(N / tb)))`` grid of ``(tf, tb)`` blocks, ``tf`` =
  ``max(getNumThreads(L / 4), min(getNumThreads(L), 64))``, ``tb = max(64 / tf, 1)``.
- the training backward, ``batch_norm_backward_cuda_template``: ``batch_norm_backward_kernel``, one
  block per channel shaped as the statistics kernel. It reads the channel's mean, inverse standard
  deviation and weight, sums ``grad`` and ``grad · (x - mean)`` over the channel (``reduce``: one
  iteration loads both, and the sum waits for them), then walks the channel again to write the
  input's gradient: each iteration loads both and stores one element (the output is no restrict
  pointer, so the next iteration's loads are not moved above the store).

So the statistics and backward kernels are bound by latency, not bandwidth: a block has 512 threads,
each with one round trip to memory in flight, however large the channel. A block's time is its
threads' round trips (:attr:`~fxcost.lowering.kernels.KernelSpec.round_trips`) times the memory
latency (``cost_models.latency``). Channels-last inputs run other kernels
(``batch_norm_collect_statistics_channels_last_kernel``...); the graph does not say a tensor's memory
format, so every input is taken as contiguous NCHW.
"""

from __future__ import annotations

import math

import torch

from fxcost.gpus.occupancy import Launch
from fxcost.lowering.kernels import KernelSpec, memory_kernels, tensor_in, tensor_out
from fxcost.records import NodeCost

__all__ = ["MAX_BLOCK_SIZE", "channel_launch", "num_threads"]

aten = torch.ops.aten

MAX_BLOCK_SIZE = 512
"""Threads of a per-channel block on NVIDIA GPUs (``MAX_BLOCK_SIZE`` in ``Normalization.cuh``)."""


def num_threads(elements: int) -> int:
    """``getNumThreads``: the first of 32, 64, 128, 256 and 512 threads that covers ``elements``."""
    return next((t for t in (32, 64, 128, 256) if elements <= t), MAX_BLOCK_SIZE)


def channel_launch(shape: tuple[int, ...]) -> tuple[Launch, int]:
    """The one-block-per-channel launch of the statistics and backward kernels for an input of
    ``shape`` (N, C, spatial...), and the iterations each thread makes over its channel."""
    n, c, length = _ncl(shape)
    tf = num_threads(length)
    ty = max(1, MAX_BLOCK_SIZE // tf)
    return Launch(grid=(c, 1, 1), block=(tf, ty, 1)), math.ceil(n / ty) * math.ceil(length / tf)


def _transform_launch(shape: tuple[int, ...]) -> Launch:
    n, c, length = _ncl(shape)
    tf = max(num_threads(length // 4), min(num_threads(length), 64))
    tb = max(64 // tf, 1)
    grid_y = min(max(1, min(256 * 1024 // c, math.ceil(n / tb))), 65535)
    return Launch(grid=(c, grid_y, 1), block=(tf, tb, 1))


def _ncl(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The input as PyTorch's kernels view it: (batch, channels, product of the spatial sizes)."""
    if len(shape) < 2:
        raise ValueError(f"batch norm needs an input of at least 2 dimensions, got {shape}")
    return shape[0], shape[1], math.prod(shape[2:])


@memory_kernels(
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit_no_training.default,
)
def _batch_norm(node: NodeCost) -> list[KernelSpec]:
    """Training: the statistics kernel reads the input, then the transform reads it again and writes the
    output. Inference normalizes with the running statistics: the transform alone."""
    x = node.in_shapes[0]
    moved = tensor_in(node, 0) + tensor_out(node, 0)
    transform = ("batch_norm_transform_input", _transform_launch(x), moved, 0)
    if node.op.endswith("no_training.default") or not node.args.get("training", True):
        return _specs(node, [transform])
    stats, iterations = channel_launch(x)
    return _specs(node, [("batch_norm_collect_statistics", stats, tensor_in(node, 0), iterations), transform])


@memory_kernels(aten.native_batch_norm_backward.default)
def _batch_norm_backward(node: NodeCost) -> list[KernelSpec]:
    """Training: one kernel per channel reduces the output gradient and ``(x - mean) · grad``, then reads
    both again to write the input's gradient (when asked for, ``output_mask[0]``): one round trip for
    the channel's statistics and weight, one per iteration of each walk. With the running statistics
    (``batch_norm_backward_elemt`` and ``_reduce``): an elementwise pass for the input's gradient and
    a reduction for the weight's, their launches not modelled."""
    grad, x = tensor_in(node, 0), tensor_in(node, 1)
    write = bool((node.args.get("output_mask") or [True])[0])
    grad_input = grad if write else 0
    if not node.args.get("train", True):
        launch = Launch(grid=(max(1, math.ceil(math.prod(node.in_shapes[0]) / 512)), 1, 1), block=(128, 1, 1))
        passes = [("batch_norm_backward_elemt", grad + grad_input), ("batch_norm_backward_reduce", grad + x)]
        return _specs(node, [(name, launch, b, 0) for name, b in passes], exact=False)
    launch, iterations = channel_launch(node.in_shapes[1])
    trips = 1 + iterations * (2 if write else 1)
    return _specs(node, [("batch_norm_backward", launch, 2 * (grad + x) + grad_input, trips)])


def _specs(
    node: NodeCost, kernels: list[tuple[str, Launch, float, int]], exact: bool = True
) -> list[KernelSpec]:
    """KernelSpecs of ``kernels`` (name, launch, bytes, round trips a thread), the node's FLOPs shared by
    bytes."""
    flops = math.nan if node.flops is None else float(node.flops)
    moved = sum(b for _, _, b, _ in kernels) or 1.0
    return [
        KernelSpec(name, launch, flops * b / moved, float(b), exact=exact, round_trips=trips)
        for name, launch, b, trips in kernels
    ]
