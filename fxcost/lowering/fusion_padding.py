"""Inductor's shape padding: a GEMM with a dimension its tensor cores cannot load aligned runs padded.

cuBLAS runs a GEMM whose dimensions are not multiples of 16 bytes on narrow-load kernels, several
times slower (GPT-2's 50,257-word vocabulary: the H100's eager ``lm_head`` GEMMs ran
``cutlass_75_tensorop_bf16_s1688gemm`` kernels at 100-150 TFLOP/s). Inductor's ``pad_mm`` pass
(``torch/_inductor/fx_passes/pad_mm.py``, on under ``torch._inductor.config.shape_padding``) instead
copies the operands into zero-padded tensors whose dimensions are multiples of 8 (16-bit floats) or 4
(fp32) elements, runs the aligned GEMM and reads the result through a slice. It does so for ``mm``,
``addmm`` and ``bmm`` when the GEMM is compute bound (arithmetic intensity above half the GPU's
FLOP-to-byte balance) and the padded GEMM with its copies benchmarks more than 1.1 times faster than
the GEMM as it is: the compiled H100 GPT-2 steps ran the padded GEMMs on the fast kernels, with one
copy kernel per padded operand.

:func:`padded_gemm` gives the aligned GEMM and the bytes of the copies for a node, so that the
compiled step's pricing can make the same choice (:mod:`fxcost.propagate.compiled`). Not modelled: a
pad Inductor fuses into the kernel producing the operand, or shares between two GEMMs reading one
operand (each GEMM here pays its own copies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxcost.gpus import Device
from fxcost.lowering.nodes import synthetic_node
from fxcost.precision import itemsize
from fxcost.records import NodeCost, Shape

__all__ = ["PADDED_GEMMS", "PAD_SPEEDUP", "PaddedGemm", "alignment", "compute_bound", "padded_gemm"]

PADDED_GEMMS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default"})
PAD_SPEEDUP = 1.1  # pad_mm.is_padded_faster: the padded GEMM must be this much faster
_BALANCE_SHARE = 0.5  # pad_mm.is_mm_compute_bound: half the machine balance (for cached operands)


@dataclass(frozen=True, slots=True)
class PaddedGemm:
    """A GEMM as ``pad_mm`` rewrites it.

    Attributes:
        gemm: the GEMM at the padded dimensions (a synthetic node of the same op and dtype).
        copy_bytes: per padded operand, the DRAM bytes of its copy (read as it is, written padded).
        dtype: the operands' dtype.
    """

    gemm: NodeCost
    copy_bytes: tuple[int, ...]
    dtype: str


def alignment(dtype: str) -> int:
    """The elements a dimension is padded to a multiple of (``get_alignment_size``): 8 for 16-bit
    floats, 4 for fp32, 0 (never padded) for others."""
    return {"float16": 8, "bfloat16": 8, "float32": 4}.get(dtype, 0)


def padded_gemm(node: NodeCost) -> PaddedGemm | None:
    """What ``pad_mm`` makes of ``node``: None unless it is an ``mm``, ``addmm`` or ``bmm`` over
    floating operands of one dtype with a dimension to pad (one of 1 is never padded)."""
    if node.op not in PADDED_GEMMS or len(node.in_shapes) < 2 or len(set(node.in_dtypes)) != 1:
        return None
    dtype = node.in_dtypes[0]
    align = alignment(dtype)
    a, b = node.in_shapes[-2], node.in_shapes[-1]
    batched = node.op == "aten.bmm.default"
    if align == 0 or len(a) != 2 + batched or len(b) != 2 + batched:
        return None
    m, k, n = a[-2], a[-1], b[-1]
    pm, pk, pn = (_up(x, align) for x in (m, k, n))
    if (pm, pk, pn) == (m, k, n):
        return None
    lead = tuple(a[:-2])
    pa, pb, out = (*lead, pm, pk), (*lead, pk, pn), (*lead, pm, pn)
    ins: list[Shape] = [pa, pb]
    if node.op == "aten.addmm.default":
        ins.insert(0, (pn,) if len(node.in_shapes[0]) == 1 else (pm, pn))
    flops = 2 * math.prod(out) * pk
    gemm = synthetic_node(node.op, ins, [out], flops=flops, dtype=dtype)
    gemm.tf32 = node.tf32
    size = itemsize(dtype)
    copies = tuple(
        (math.prod(given) + math.prod(padded)) * size
        for given, padded in ((a, pa), (b, pb))
        if tuple(given) != padded
    )
    return PaddedGemm(gemm, copies, dtype)


def compute_bound(node: NodeCost, device: Device) -> bool:
    """``pad_mm.is_mm_compute_bound``: the GEMM's FLOPs per element moved above half the device's
    peak FLOPs per byte (tensor-core peak for 16-bit floats and TF32, else fp32); True where the
    device lacks the figures (Inductor's answer when it cannot tell)."""
    a, b = node.in_shapes[-2], node.in_shapes[-1]
    m, k, n = a[-2], a[-1], b[-1]
    moved = m * k + n * k + m * n
    dtype = node.in_dtypes[0]
    peaks = {"bfloat16": device.bf16_tflops, "float16": device.fp16_tflops}
    peak = peaks.get(dtype, device.tf32_tflops if node.tf32 else device.fp32_tflops)
    if not peak or not device.mem_bandwidth_gbps or moved == 0:
        return True
    balance = 1000 * peak / device.mem_bandwidth_gbps * _BALANCE_SHARE
    return m * n * k / moved > balance


def _up(x: int, align: int) -> int:
    """``x`` rounded up to a multiple of ``align`` (``get_padded_length``: a dimension of 1 stays)."""
    return x if x == 1 or x % align == 0 else (x // align + 1) * align
