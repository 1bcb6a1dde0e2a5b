"""The work of the kernel a GPU runs for an attention node (:func:`attention_work`).

The fused kernels (FlashAttention-2 as PyTorch ships it, xformers' CUTLASS memory-efficient kernel,
cuDNN's) never write ``S``: a thread block owns ``Br`` query rows (the forward) or ``Bc`` key rows
(the backward, which accumulates ``dQ`` in fp32 through global atomics) and walks the other side
tile by tile. :class:`FusedAttention` is that structure:
tile sizes per kernel and head dim, the grid, the tiles a causal mask skips (those wholly above the
diagonal; diagonal tiles run in full), the per-block work, and the bytes it moves. The math backend
materializes ``S``: it lowers to its batched GEMMs and memory passes, which the GEMM and elementwise
models price.

Which kernel runs, and the call it runs, are :mod:`fxcost.lowering.attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxcost.gpus import Device
from fxcost.lowering.attention import AttentionCall, Backend, attention_call, choose_backend
from fxcost.lowering.nodes import gemm_node, memory_pass
from fxcost.precision import itemsize
from fxcost.records import NodeCost

__all__ = ["FusedAttention", "attention_work", "fused_attention", "kernel_head_dim", "math_work"]


@dataclass(frozen=True)
class FusedAttention:
    """The launch structure and work of one fused attention kernel on one GPU.

    Attributes:
        backend: the kernel family. warps: warps per thread block.
        block_rows: rows a thread block owns (queries forward, keys backward); tile: rows of the other
            side per step.
        blocks: the grid's thread blocks. tiles_per_block: the tiles each of a (batch, head)'s blocks
            walks, in launch order (a causal mask skips the tiles above the diagonal).
        shared_memory_bytes: per block (Q, K, V tiles; the backward also dO and the scores).
        flops_per_tile: tensor-core FLOPs of one block-rows x tile step.
        scores_per_tile: softmax elements of one step (exponentials and conversions).
        bytes_main: DRAM bytes of the main kernel, each operand once; bytes_passes: those of the
            backward's two memory passes (``D = rowsum(dO·O)`` before, the fp32 ``dQ`` converted after).
        reread_bytes: what the blocks load beyond that single pass: every further block of a
            (batch, head) re-reads the other side's tiles it walks (K and V forward; Q, dO, the LSE and
            ``D`` backward, where each key block also adds its share into the fp32 ``dQ``), and each
            head re-reads a mask broadcast over the heads.
        head_bytes: the re-read operands of one (batch, head); batch_bytes: the mask slice one batch's
            heads share (0 where each head has its own, counted in ``head_bytes``). Re-reads hit L2
            while the (batch, head)s the resident blocks work on keep these in it.
    """

    backend: Backend
    warps: int
    block_rows: int
    tile: int
    blocks: int
    tiles_per_block: tuple[int, ...]
    shared_memory_bytes: int
    flops_per_tile: int
    scores_per_tile: int
    bytes_main: int
    bytes_passes: tuple[int, ...]
    reread_bytes: int = 0
    head_bytes: int = 0
    batch_bytes: int = 0


def _tiles(backend: Backend, call: AttentionCall) -> tuple[int, int, int]:
    """(rows per block, tile, warps) of a kernel: FlashAttention-2's kernel traits for sm80/sm90 as
    PyTorch builds them (``flash_fwd_launch_template.h``, ``flash_bwd_launch_template.h``), the CUTLASS
    memory-efficient kernel's (the ``fmha_cutlassF_{dtype}_aligned_{queries}x{keys}`` instances PyTorch
    generates: 64x64 up to head dim 64, 64x128 up to 128, 32x128 beyond; one warp per 32x32 of the
    block; ``kernel_backward.h``), cuDNN's sm90 kernels' (FlashAttention-3's layout: a producer and two
    consumer warpgroups, 384 threads, forward and backward)."""
    d = max(call.d, call.dv)
    if backend == "flash":
        if call.backward:
            return (128, 128, 8) if d <= 64 else (64, 128, 8) if d <= 128 else (64, 64, 8)
        return (128, 128, 4) if d <= 64 else (128, 64, 4) if d <= 128 else (128, 64, 8)
    if backend == "efficient":
        if call.backward:
            return (64, 64, 4) if d <= 64 else (128, 64, 8)
        return (64, 64, 4) if d <= 64 else (64, 128, 8) if d <= 128 else (32, 128, 4)
    return (128, 128, 12) if not call.backward else (128, 64, 12)  # cuDNN: three warpgroups


def kernel_head_dim(backend: Backend, d: int) -> int:
    """The head dim a fused kernel's tiles span for a head of ``d``: its products run over all of it,
    the columns past ``d`` zero. FlashAttention-2 is built for head dims of multiples of 32 up to 256
    (PyTorch's ``flash_api.cpp`` rounds the head dim up to the next one it instantiates); cuDNN's sm90
    kernels for 64, 128 and 256, the width their names carry (``..._64x128x64_...`` for a head of 64,
    ``..._64x128x128_...`` for heads of 80, 96 and 128 in the recorded sweeps). The CUTLASS
    memory-efficient kernel iterates the head dim in its own steps: ``d``."""
    if backend == "flash" and d <= 256:
        return -(-d // 32) * 32
    if backend == "cudnn":
        return next((width for width in (64, 128, 256) if d <= width), d)
    return d


def fused_attention(call: AttentionCall, backend: Backend) -> FusedAttention:
    """The structure of ``call`` run by a fused ``backend`` (not ``"math"``)."""
    rows, tile, warps = _tiles(backend, call)
    size = itemsize(call.dtype)
    d, dv = kernel_head_dim(backend, call.d), kernel_head_dim(backend, call.dv)  # the tiles' head dims
    bh = call.batch * call.heads
    if call.backward:  # blocks own keys, walk the queries that see them
        owned, walked = math.ceil(call.sk / rows), math.ceil(call.sq / tile)
        per_block = [walked - (j * rows // tile if call.causal else 0) for j in range(owned)]
        flops = 2 * rows * tile * (3 * d + 2 * dv)
        smem = (2 * tile * d + 2 * rows * d + rows * tile) * size  # Q, dO; K, V; P/dS
    else:  # blocks own queries, walk the keys they see
        owned, walked = math.ceil(call.sq / rows), math.ceil(call.sk / tile)
        per_block = [min(walked, -(-(i + 1) * rows // tile)) if call.causal else walked for i in range(owned)]
        flops = 2 * rows * tile * (d + dv)
        smem = (rows * d + 2 * tile * d) * size  # Q; K, V
    q = bh * call.sq * call.d * size
    kv = call.batch * call.kv_heads * call.sk * (call.d + call.dv) * size
    o = bh * call.sq * call.dv * size
    lse = bh * call.sq * 4
    # Rows of the walked side each block loads: whole tiles, the last one cut at the sequence's end.
    walked_len = call.sq if call.backward else call.sk
    loaded_rows = sum(min(max(w, 0) * tile, walked_len) for w in per_block)
    # A mask broadcast over the heads is loaded by every head: heads / mask_heads times in all.
    mask_head_bytes = call.mask_bytes // max(call.batch * call.mask_heads, 1)  # one head's slice
    mask_loaded = bh * mask_head_bytes * loaded_rows // max(owned * walked_len, 1)
    mask_reread = max(mask_loaded - call.mask_bytes, 0)
    shared_mask = call.mask_heads != call.heads
    batch_bytes = mask_head_bytes if shared_mask else 0
    if call.backward:
        # dQ's fp32 accumulator takes every key block's atomics in L2 and reaches DRAM about once.
        dq_accum = bh * call.sq * call.d * 4
        # read Q K V O dO LSE D and the mask; write dK dV, dQ fp32
        main = q + 2 * kv + 2 * o + 2 * lse + dq_accum + call.mask_bytes
        # D = rowsum(dO·O) before; dQ from fp32 to the dtype after.
        passes: tuple[int, ...] = (2 * o + lse, bh * call.sq * call.d * (4 + size))
        per_row = (call.d + call.dv) * size + 2 * 4 + call.d * 4  # Q, dO, LSE, D; dQ's fp32 adds
        once = q + o + 2 * lse + dq_accum
    else:
        main, passes = q + kv + o + lse + call.mask_bytes, tuple[int, ...]()
        per_row = (call.d + call.dv) * size  # K, V
        once = kv
    reread = max(bh * loaded_rows * per_row - once, 0) + mask_reread
    head = walked_len * per_row + (0 if shared_mask else mask_head_bytes)
    return FusedAttention(
        backend=backend, warps=warps, block_rows=rows, tile=tile, blocks=owned * bh,
        tiles_per_block=tuple(max(w, 0) for w in per_block), shared_memory_bytes=smem,
        flops_per_tile=flops, scores_per_tile=rows * tile, bytes_main=main, bytes_passes=passes,
        reread_bytes=reread, head_bytes=head, batch_bytes=batch_bytes,
    )  # fmt: skip


def math_work(call: AttentionCall) -> list[tuple[NodeCost, int]]:
    """The math backend's kernels, as (node the GEMM and elementwise models price, repetitions): it
    writes ``S`` and each step over it through memory."""
    bh, size = call.batch * call.heads, itemsize(call.dtype)
    scores = bh * call.sq * call.sk * size
    gemm = [gemm_node("bmm", bh, call.sq, call.sk, call.d, call.dtype),
            gemm_node("bmm", bh, call.sq, call.dv, call.sk, call.dtype)]  # fmt: skip
    # Forward passes over S: the scale, the mask (reading it too), softmax, dropout (writing its mask).
    forward = [2 * scores, *([3 * scores] if call.masked or call.causal else []), 2 * scores,
               *([3 * scores] if call.dropout else [])]  # fmt: skip
    kv_copies = []
    if call.kv_heads != call.heads:  # grouped-query keys and values are repeated per query head first
        kv_copies = [2 * bh * call.sk * (call.d + call.dv) * size]
    if not call.backward:
        return [(g, 1) for g in gemm] + [(memory_pass(b, call.dtype), 1) for b in kv_copies + forward]
    grads = [gemm_node("bmm", bh, call.sk, call.dv, call.sq, call.dtype),  # dV = P^T dO
             gemm_node("bmm", bh, call.sq, call.sk, call.dv, call.dtype),  # dP = dO V^T
             gemm_node("bmm", bh, call.sq, call.d, call.sk, call.dtype),  # dQ = dS K
             gemm_node("bmm", bh, call.sk, call.d, call.sq, call.dtype)]  # dK = dS^T Q  # fmt: skip
    # Backward passes: dropout's, softmax's (P, dP -> dS), the scale's.
    backward = [*([3 * scores] if call.dropout else []), 3 * scores, 2 * scores]
    return [(g, 1) for g in grads] + [(memory_pass(b, call.dtype), 1) for b in kv_copies + backward]


def attention_work(
    node: NodeCost, device: Device
) -> tuple[Backend, FusedAttention | list[tuple[NodeCost, int]]] | None:
    """The backend an attention node runs on ``device`` and its work: the fused kernel's structure,
    or the math backend's GEMMs and memory passes. None for other ops or shapes it cannot read."""
    call = attention_call(node)
    if call is None:
        return None
    backend = choose_backend(call, device)
    if backend == "math":
        return backend, math_work(call)
    return backend, fused_attention(call, backend)
