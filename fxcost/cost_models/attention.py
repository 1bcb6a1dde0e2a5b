"""Fused attention kernels priced from their structure on the target GPU.

No measurement of a fused attention kernel is in the training data, and none of the held-out GPUs'
may be fit: the time is built from spec-sheet rates and the kernel's launch structure
(:class:`~fxcost.lowering.attention_kernels.FusedAttention`), nothing learned:

- **Tensor-core work** per tile at the rate the kernel's instructions reach: the GPU's *sustained*
  tensor rate, the one its tensor-core GEMMs are priced at (a calibrated ``tl.dot`` rate, else the
  spec-sheet peak times the share of it a large GEMM sustains:
  :meth:`~fxcost.cost_models.heads.tensor_core.TiledGemms.sustained_tflops`; the raw peak where the
  caller has none). FlashAttention-2 and the CUTLASS memory-efficient kernel issue Ampere's
  ``mma.sync`` on every GPU, which on Hopper reaches about two thirds of the ``wgmma`` rate
  (:data:`MMA_SYNC_SHARE_SM90`); cuDNN's Hopper kernel issues ``wgmma``. fp32 inputs
  (memory-efficient only) run three TF32 ``mma.sync`` per product on sm80 or newer (PyTorch's copy of
  the kernel picks CUTLASS's ``OpMultiplyAddFastF32`` for float on sm80+, whatever
  ``allow_tf32`` says), each loaded operand split in registers into a big and a small TF32 part (a
  rounding add and a subtract, :data:`SPLIT_OPS_PER_OPERAND`), and CUDA cores before sm80. Operands
  staged through shared memory cap the rate at 128 bytes per clock per SM times the FLOPs a warp's
  tile does per byte it loads, which 4-byte operands halve (:func:`_intensity`). Every unit runs at
  the clock a tensor-core kernel sustains under the power cap where a source gives it
  (:func:`~fxcost.gpus.power.tensor_clock`: an H100's 1.83 GHz), else at the boost clock.
- **Softmax work** per score on the special-function units, 16 results per clock per SM on every
  NVIDIA GPU since Maxwell (CUDA C Programming Guide, arithmetic instruction throughput): one
  exponential, the packed conversion of each 16-bit matrix fed back to the tensor cores, and a few
  fp32 operations (scale, max, sum; the backward's ``dP - D`` and product with ``P``) at the CUDA-core
  rate; dropout draws its keep decisions from Philox, whose rounds run on the 32-bit integer units
  (:data:`PHILOX`, :func:`_dropout_cycles_per_score`); an additive mask (Hugging Face's models pass one,
  ``[B, 1, Sq, Sk]``, with ``is_causal=False``) a load, a 16-bit unpack and an add per score, and its
  bytes. FlashAttention-2 runs the softmax between its two GEMMs in the same warps, so the two add;
  cuDNN's Hopper kernel overlaps them, so the larger counts: it is warp-specialized like
  FlashAttention-3 (its launches are 384 threads, a producer and two consumer warpgroups), whose
  paper (Shah et al. 2024, §3.1) schedules one consumer's softmax under the other's ``wgmma``
  (ping-pong) and a warpgroup's own softmax under its next ``wgmma`` (asynchronous issue). That
  scheduling is the forward pass's: the paper's backward (Appendix B.1) specializes warps for the
  loads and for dQ's accumulation, not to hide the softmax, so cuDNN's backward (384 threads too)
  adds its stages as FlashAttention-2's does.
- **Waves**: thread blocks resident per SM from the occupancy calculator (the kernels use all 255
  registers a thread may have; cuDNN's, one per SM, below); the time is that of the busiest SM, at
  least the longest block (a causal forward's last query block walks every key tile).
- **Pipeline** (cuDNN's forward): a block's tiles overlap its two stages, so a block of ``n`` tiles
  takes ``n`` times the longer stage plus the shorter once (its first GEMM before any softmax, its
  last softmax before the last GEMM). The launch is persistent (the recorded launches: as many
  384-thread blocks as SMs, fewer only where there are fewer tiles of work, one per SM), each SM
  taking blocks in turn.
- **Memory**: the main kernel moves Q, K, V, O (and in the backward dO and fp32 dQ) once; the
  backward's two memory passes (``D = rowsum(dO·O)``, ``dQ``'s conversion) are kernels of their own.
  Each further block of a (batch, head) re-reads the tiles it walks (and each head a mask broadcast
  over the heads): from DRAM where the (batch, head)s the resident blocks span cannot keep them in
  L2, else from L2, whose bandwidth no spec sheet gives and which is not priced.
  A kernel takes at least the GPU's launch floor.

The memory-efficient backward (xformers' CUTLASS kernel) runs its GEMMs at half FlashAttention-2's
rate (:data:`EFFICIENT_BACKWARD_SHARE`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxcost.cost_models.roofline import LAUNCH_FLOOR_MS
from fxcost.gpus import Device
from fxcost.gpus.occupancy import blocks_per_sm, sm_version
from fxcost.gpus.power import tensor_clock
from fxcost.lowering.attention import AttentionCall
from fxcost.lowering.attention_kernels import FusedAttention
from fxcost.precision import itemsize

__all__ = ["EFFICIENT_BACKWARD_SHARE", "INT32_PER_CLOCK", "MMA_SYNC_SHARE_SM90", "PHILOX",
           "PHILOX_OPS_PER_ROUND", "SPLIT_OPS_PER_OPERAND", "Draws", "attention_kind",
           "fused_attention_ms"]  # fmt: skip

MMA_SYNC_SHARE_SM90 = 2 / 3
"""Share of Hopper's ``wgmma`` dense rate that Ampere-style ``mma.sync`` reaches (Luo et al.,
"Benchmarking and Dissecting the Nvidia Hopper GPU Architecture", 2024: legacy mma on H800 near two
thirds of wgmma's). FlashAttention-3's paper puts FlashAttention-2 on an H100 at 35% of the peak, the
softmax and waves taking the rest."""

EFFICIENT_BACKWARD_SHARE = 0.5
"""The memory-efficient backward's GEMM rate against FlashAttention-2's: FlashAttention-2's paper
(Dao 2023, §4.1) reports its backward about twice as fast as xformers' CUTLASS one, which keeps fewer
operands in registers and stages ``P`` and ``dS`` through shared memory at smaller tiles."""

SMEM_BYTES_PER_CLOCK = 128  # per SM, Volta onwards (32 banks of 4 bytes)
SFU_PER_CLOCK = 16  # exponentials and conversions per SM per clock, cc 5.x to 9.0
REGISTERS_PER_THREAD = 255
MASK_OPS_PER_SCORE = 2  # the mask element's load-and-unpack to fp32, and the add
WARP_TILE = 32  # rows and columns of a warp's tile in the mma.sync kernels

INT32_PER_CLOCK = 64
"""32-bit integer multiplies, adds and bitwise operations per clock per SM, compute capability 7.0 to
9.0 (CUDA C++ Programming Guide, throughput of native arithmetic instructions): half the fp32 rate of
an H100 or an RTX GPU, the fp32 rate of a V100 or an A100. Older GPUs emulate the 32-bit multiply in
several instructions, which is not modelled (their dropout is read as fast as a Volta's)."""

PHILOX_OPS_PER_ROUND = 8
"""Integer instructions of one Philox-4x32 round (Salmon et al., SC'11), as the algorithm reads: two
32-bit products, each high and low half (four), each product's high half xored with a counter word
and a key word (two 3-input xors), and the key's two Weyl increments (two adds; after the last
round, none). A count of the algorithm, not of the compiled code: a wide multiply giving both halves
would make the products two instructions."""


@dataclass(frozen=True)
class Draws:
    """How a kernel draws its dropout keep decisions: Philox ``rounds`` per call, ``per_call`` decisions
    from the call's 128 random bits, and whether each decision converts its number to a float."""

    rounds: int
    per_call: int
    to_float: bool


PHILOX = {
    # PyTorch's copy of the kernel (mem_eff_attention/kernel_forward.h, kernel_backward.h):
    # curand_uniform4 on a curandStatePhilox4_32_10_t, four floats per call, each compared to p.
    "efficient": Draws(rounds=10, per_call=4, to_float=True),
    # FlashAttention-2 (csrc/flash_attn/src/philox.cuh, dropout.h, read elsewhere: PyTorch's headers
    # hold only its API): seven rounds, the 128 bits read as sixteen bytes, each compared to p scaled
    # to 0..255.
    "flash": Draws(rounds=7, per_call=16, to_float=False),
    # cuDNN's kernels are closed; PyTorch hands them a Philox seed and offset (the recordings'
    # at::cuda::philox::unpack_cudnn). Read as curand's draws, one 32-bit number per decision: an
    # assumption (FlashAttention-2's draws would price a dropout score's draw a fifth as dear).
    "cudnn": Draws(rounds=10, per_call=4, to_float=True),
}
"""Each fused backend's dropout draws."""

SPLIT_OPS_PER_OPERAND = 2
"""CUDA-core operations per fp32 operand element a 3xTF32 warp loads (CUTLASS's ``FastF32``: the big
part rounded by adding half a TF32 ulp to its bits, the small part ``x - big``, truncated by the tensor
core for free)."""


def attention_kind(call: AttentionCall) -> str:
    """The tensor-core kind a call's products run at: its 16-bit dtype, or ``"tf32"`` for fp32 (the
    3xTF32 products)."""
    return "tf32" if call.dtype == "float32" else call.dtype


def _split_fp32(call: AttentionCall, device: Device) -> bool:
    """Whether fp32 products run as 3xTF32 on tensor cores (sm80 or newer with TF32 units)."""
    sm = (sm_version(device) or 0) if device.vendor == "NVIDIA" else 0
    return call.dtype == "float32" and device.tf32_tflops is not None and sm >= 80


def _mma_tflops(
    call: AttentionCall, backend: str, device: Device, sustained: float | None, share: float
) -> float | None:
    """The tensor (or CUDA-core) rate the kernel's products reach on ``device``, TFLOP/s, from the
    ``sustained`` rate of the call's :func:`attention_kind` (where None, ``share`` of the spec peak:
    what the power cap leaves a tensor-core kernel)."""
    sm = (sm_version(device) or 0) if device.vendor == "NVIDIA" else 0
    mma_sync = MMA_SYNC_SHARE_SM90 if sm >= 90 and backend != "cudnn" else 1.0
    if call.dtype == "float32":
        if _split_fp32(call, device):
            tf32 = sustained or (device.tf32_tflops or 0.0) * share
            return tf32 * mma_sync / 3  # 3xTF32 keeps fp32's accuracy
        return None if device.fp32_tflops is None else device.fp32_tflops * share
    peak = device.bf16_tflops if call.dtype == "bfloat16" else device.fp16_tflops
    rate = sustained or (None if peak is None else peak * share)
    return None if rate is None else rate * mma_sync


def _intensity(backend: str, call: AttentionCall) -> float | None:
    """FLOPs a warp does per byte it loads from shared memory; None where that sets no limit.

    FlashAttention-2's forward keeps Q and P in registers and reads only K and V: a warp owning 32
    query rows does 2·32 FLOPs per loaded 2-byte element, 32 per byte. Its backward and the CUTLASS
    kernels load both operands of a 32x32 warp tile: 32·32·2 / ((32 + 32)·2) = 16 per byte of 2-byte
    operands, 8 of 4-byte ones. cuDNN's Hopper kernel feeds ``wgmma`` from shared memory at 64-row
    warpgroup tiles, beyond what binds.
    """
    if backend == "cudnn":
        return None
    per_element = 2.0 * WARP_TILE if backend == "flash" and not call.backward else float(WARP_TILE)
    return per_element / itemsize(call.dtype)


def fused_attention_ms(
    call: AttentionCall,
    fused: FusedAttention,
    device: Device,
    sustained_tflops: float | None = None,
    serial: bool = False,
) -> float | None:
    """Kernel time of a fused attention call on ``device`` in ms, None where a rate is unknown.
    ``sustained_tflops``: the GPU's sustained tensor rate for the call's :func:`attention_kind` (what the
    tensor-core GEMMs are priced at); where None, the spec peak at the clock the kernel runs at (below).

    ``serial``: the same structure with nothing overlapped, the other end of what it allows: each
    tile's GEMMs and softmax one after the other (cuDNN's pipeline too), and the main kernel's DRAM
    traffic, every re-read from DRAM, after its compute rather than under it. Its time is never below
    the overlapped one; the recorded kernels fall between the two (``benchmarks/attention_nodes.py``),
    and :func:`fxcost.cost_models.heads.intervals.node_bounds` spans them.

    Example:
        >>> from fxcost.gpus import get_device
        >>> from fxcost.lowering.attention_kernels import fused_attention
        >>> call = AttentionCall(4, 16, 16, 2048, 2048, 128, 128, "bfloat16", True, False, 0.0, False, None)
        >>> 0.1 < fused_attention_ms(call, fused_attention(call, "flash"), get_device("H100-SXM")) < 1
        True
    """
    sms, clock_mhz, bandwidth = device.num_sms, device.boost_clock_mhz, device.mem_bandwidth_gbps
    # Every unit runs at the clock the power cap leaves a tensor-core kernel, where a source gives it.
    capped = tensor_clock(device)
    rate = _mma_tflops(call, fused.backend, device, sustained_tflops, capped.share if capped else 1.0)
    if not (sms and clock_mhz and bandwidth and rate and device.fp32_tflops):
        return None
    alu_per_clock = device.fp32_tflops * 1e12 / (2 * sms * clock_mhz * 1e6)  # the peak's, at the boost clock
    clock_hz = (capped.mhz if capped else clock_mhz) * 1e6
    intensity = _intensity(fused.backend, call)
    if intensity is not None:
        rate = min(rate, sms * clock_hz * SMEM_BYTES_PER_CLOCK * intensity / 1e12)
    if fused.backend == "efficient" and call.backward:
        rate *= EFFICIENT_BACKWARD_SHARE
    # Softmax: SFU results (exponential; packed 16-bit conversions, two per instruction) and fp32 ops.
    half = call.dtype != "float32"
    sfu = 1 + (1.0 if call.backward else 0.5) * half
    alu = 3 + (MASK_OPS_PER_SCORE if call.masked else 0)
    score_cycles = sfu / SFU_PER_CLOCK + alu / alu_per_clock
    if call.dropout:
        score_cycles += _dropout_cycles_per_score(PHILOX[fused.backend], alu_per_clock)
    mma_ms = fused.flops_per_tile / (rate * 1e9)
    if _split_fp32(call, device):  # the big/small split of every loaded operand, in the same warps
        split_ops = SPLIT_OPS_PER_OPERAND * fused.flops_per_tile / WARP_TILE  # a 32x32 tile: 32 FLOPs each
        mma_ms += split_ops / (alu_per_clock * sms * clock_hz) * 1e3
    softmax_ms = fused.scores_per_tile * score_cycles / (sms * clock_hz) * 1e3
    if fused.backend == "cudnn" and not serial and not call.backward:
        # The forward's two stages (the GEMMs, the softmax) overlapped across a block's tiles: n tiles
        # take n times the longer stage, and each block's first and last tile add the shorter once (the
        # pipeline's fill and drain).
        tile_ms, block_ms = max(mma_ms, softmax_ms), min(mma_ms, softmax_ms)
    else:
        tile_ms, block_ms = mma_ms + softmax_ms, 0.0
    per_sm = _blocks_per_sm(fused, device)
    # Waves: the busiest SM's tiles against a perfect spread of them.
    slots = per_sm * sms
    walked = fused.tiles_per_block
    if not walked or max(walked) <= 0:
        return None
    rounds = math.ceil(fused.blocks / slots)  # blocks the busiest slot runs
    busiest = max(rounds * sum(walked) / len(walked), max(walked))
    compute_ms = (busiest * tile_ms + rounds * block_ms) * slots  # a slot's tile: slots x its device time
    floor = device.launch_floor_ms or LAUNCH_FLOOR_MS
    if serial:
        main = max(compute_ms + (fused.bytes_main + fused.reread_bytes) / (bandwidth * 1e6), floor)
    else:
        rereads = fused.reread_bytes if _rereads_miss_l2(call, fused, device, slots) else 0
        main = max(compute_ms, (fused.bytes_main + rereads) / (bandwidth * 1e6), floor)
    return main + sum(max(b / (bandwidth * 1e6), floor) for b in fused.bytes_passes)


def _dropout_cycles_per_score(draws: Draws, alu_per_clock: float) -> float:
    """An SM's clocks per score for its dropout: the Philox call's rounds shared by its decisions on
    the integer units, and a byte decision's compare there too; a float draw's conversion (at the
    conversion units' 16 per clock, as the special functions'), its scale and its compare at the
    fp32 rate; the keep's select and the scale of a kept score at the fp32 rate."""
    integer = draws.rounds * PHILOX_OPS_PER_ROUND / draws.per_call + (0 if draws.to_float else 1)
    conversions = 1 if draws.to_float else 0
    floats = 2 + (2 if draws.to_float else 0)  # select, scale; a float draw's scale and compare
    return integer / INT32_PER_CLOCK + conversions / SFU_PER_CLOCK + floats / alu_per_clock


def _blocks_per_sm(fused: FusedAttention, device: Device) -> int:
    """Thread blocks of ``fused`` resident per SM: cuDNN's persistent launch one (its launches: as
    many 384-thread blocks as SMs), the others' as the occupancy calculator allows."""
    if fused.backend == "cudnn":
        return 1
    try:
        return blocks_per_sm(device, 32 * fused.warps, REGISTERS_PER_THREAD, fused.shared_memory_bytes)
    except ValueError:
        return 1


def _rereads_miss_l2(call: AttentionCall, fused: FusedAttention, device: Device, slots: int) -> bool:
    """Whether the blocks' re-reads (:attr:`FusedAttention.reread_bytes`) come from DRAM: the kernels
    launch a (batch, head)'s blocks next to each other (the grid's fastest index, or the persistent
    scheduler's), so the resident blocks walk the operands of the (batch, head)s they span, one more
    where they straddle two; while those stay in L2 the re-reads hit it. False without the L2 size.
    """
    if not device.l2_bytes or not fused.reread_bytes:
        return False
    per_head = len(fused.tiles_per_block)
    heads = min(math.ceil(min(fused.blocks, slots) / per_head) + 1, call.batch * call.heads)
    batches = min(math.ceil(heads / call.heads) + 1, call.batch)
    resident = heads * fused.head_bytes + batches * fused.batch_bytes
    return resident > device.l2_bytes
