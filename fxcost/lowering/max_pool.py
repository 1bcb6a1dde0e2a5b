"""2-D max pooling's forward kernel on a CUDA GPU, and the memory round trips that bound it.

PyTorch's NCHW path (``aten/src/ATen/native/cuda/DilatedMaxPool2d.cu``, ``max_pool_forward_nchw``)
runs one thread per output element in blocks of 256 threads (``BLOCK_THREADS``), one block per 256
outputs. Each thread walks its window row by row and compares each element with the running maximum
before loading the next, so it makes one round trip to memory per element of the window. That file is
not shipped with PyTorch's wheels and was not re-read for this module; the launch agrees with the
kernels recorded on the lent H100 and H200 (``benchmarks/fixtures/gpu``), which validate it. The
backward kernel is left to the memory pass of ``lowering.kernels``. Channels-last inputs run
``max_pool_forward_nhwc``; the graph does not say a tensor's memory format, so every input is taken
as contiguous NCHW.
"""

from __future__ import annotations

import math

import torch

from fxcost.gpus.occupancy import Launch
from fxcost.lowering.kernels import KernelSpec, memory_kernels
from fxcost.records import NodeCost

__all__ = ["BLOCK_THREADS"]

aten = torch.ops.aten

BLOCK_THREADS = 256
"""Threads of a block of ``max_pool_forward_nchw``."""


@memory_kernels(aten.max_pool2d_with_indices.default)
def _max_pool_forward(node: NodeCost) -> list[KernelSpec]:
    """Each output thread loads its window's elements one after another: as many round trips as the
    window has elements inside the input (the window clipped to the input's size)."""
    x = node.in_shapes[0]
    if len(x) < 3:
        raise ValueError(f"max pooling needs an input of at least 3 dimensions, got {x}")
    kernel = list(node.args["kernel_size"])
    kh, kw = (kernel * 2)[:2] if len(kernel) == 1 else kernel[:2]
    outputs = math.prod(node.out_shapes[0])
    launch = Launch(grid=(math.ceil(outputs / BLOCK_THREADS), 1, 1), block=(BLOCK_THREADS, 1, 1))
    trips = min(kh, x[-2]) * min(kw, x[-1])
    flops = math.nan if node.flops is None else float(node.flops)
    return [KernelSpec("max_pool_forward_nchw", launch, flops, float(node.bytes or 0), round_trips=trips)]
