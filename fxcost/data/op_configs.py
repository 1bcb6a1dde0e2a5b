"""What ``fxcost collect`` measures: the ops of the shared data, their CSV columns, and the sequence
of random configurations each op is measured at.

Configuration ``i`` of an op is drawn from its own generator, seeded by ``(seed, family, i)``, so it is
the same whatever was measured before; the elementwise ops, ``ln`` and ``softmax`` share one family and
so one sequence of ``[B, H]`` shapes, as in the shared data. Ranges, uniform integers, inclusive:

=========== =================================================================================
linear      B = 1 (as in the shared data), M 1-3500, N 1-32768, K 1-32768 (Habitat §4.3.1:
            batch 1-3500, in/out features 1-32768); no bias (the schema has no bias column); N
            is reduced, K the output's columns, as in the shared data (``datasets.GEMM_COLUMNS``)
bmm         B 1-128, M, N, K 1-1024 (Habitat); [B, M, N] @ [B, N, K]
conv        B 1-64, Input_Channel 3-2048, Output_Channel 16-2048, Kernel_Szie 1-11, Input_Size
            1-256 (square), Stride 1-4, Padding 0-3 (Habitat), no bias; configurations whose
            kernel exceeds the padded image are redrawn
elementwise B 1-16384, H 1-4096 (the range of the shared data; Habitat has no such ops); the
ln, softmax "u" ops take the scalar 2.0
sdpa,       B 1-64, H 1-64, D in {64, 80, 96, 128}, S_q and S_k among :data:`SEQ_LENS` (powers of
sdpa_bwd    two 128-8192 and lengths of real models), causal 0/1 with S_k = S_q when causal, else
            S_k = S_q half the time (self-attention) and drawn on its own otherwise; B is capped so
            q, k and v take at most :data:`SDPA_QKV_BYTES` in fp32
=========== =================================================================================

The configurations do not depend on the precision, so one seed gives the same shapes in every one.
``sdpa`` is the forward of ``torch.nn.functional.scaled_dot_product_attention``; ``sdpa_bwd`` is its
backward alone: the forward runs once when the inputs are built, and the call is
``torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxcost.data.datasets import ELEMENTWISE

__all__ = ["OPS", "SDPA_QKV_BYTES", "SEQ_LENS", "build_call", "expand_ops", "header", "sample_config"]

_META = ["OPName", "Latency", "Device", "Torch Version", "CUDNN Version", "Kernel Name", "Warps per SM",
         "Blocks per SM", "Grid x", "Grid y", "Grid z", "Block x", "Block y", "Block z",
         "CUDA Version"]  # fmt: skip

_GEMM_DIMS = ["B", "M", "N", "K"]

_CONV_DIMS = ["B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"]

_VEC_DIMS = ["B", "H"]

_SDPA_DIMS = ["B", "H", "S_q", "S_k", "D", "causal"]

# Powers of two, and lengths of real models: ViT-B/16 at 224 and 384 (197, 577), BERT-style 384,
# Whisper's 1500 encoder frames, and a few round context lengths.
SEQ_LENS = (128, 197, 256, 384, 512, 577, 1000, 1024, 1500, 2048, 3000, 4096, 6144, 8192)
_HEAD_DIMS = (64, 80, 96, 128)
SDPA_QKV_BYTES = 4 * 2**30

# Op -> (sampling family, dims, whether the shared files have a "Kernels" column).
OPS: dict[str, tuple[str, list[str], bool]] = {
    "linear": ("linear", _GEMM_DIMS, True),
    "bmm": ("bmm", _GEMM_DIMS, True),
    "conv": ("conv", _CONV_DIMS, True),
    "ln": ("vec", _VEC_DIMS, True),
    "softmax": ("vec", _VEC_DIMS, False),
    **{op: ("vec", _VEC_DIMS, False) for op in ELEMENTWISE},
    "sdpa": ("sdpa", _SDPA_DIMS, True),
    "sdpa_bwd": ("sdpa", _SDPA_DIMS, True),
}

_SCALAR = 2.0


def header(op: str, precision: str = "fp32") -> list[str]:
    """The CSV columns of ``op``, in the order of the shared data; a trailing ``Precision`` column for
    any precision but fp32 (fp32 files keep the shared data's columns exactly)."""
    _, dims, kernels = OPS[op]
    return [*_META, *(["Kernels"] if kernels else []), *dims, *(["Precision"] if precision != "fp32" else [])]


def sample_config(op: str, index: int, seed: int = 0) -> dict[str, int]:
    """Configuration ``index`` of ``op``'s sequence: its dims by column name (see the module docstring)."""
    family = OPS[op][0]
    rng = random.Random(f"fxcost-collect:{seed}:{family}:{index}")  # str seeds hash stably (sha512)
    r = rng.randint
    if family == "linear":
        return {"B": 1, "M": r(1, 3500), "N": r(1, 32768), "K": r(1, 32768)}
    if family == "bmm":
        return {"B": r(1, 128), "M": r(1, 1024), "N": r(1, 1024), "K": r(1, 1024)}
    if family == "conv":
        while True:  # Habitat ignores invalid configurations; redraw from the same generator
            cfg = {"B": r(1, 64), "Input_Channel": r(3, 2048), "Output_Channel": r(16, 2048),
                   "Kernel_Szie": r(1, 11), "Input_Size": r(1, 256), "Stride": r(1, 4),
                   "Padding": r(0, 3)}  # fmt: skip
            if cfg["Kernel_Szie"] <= cfg["Input_Size"] + 2 * cfg["Padding"]:
                return cfg
    if family == "sdpa":
        d, s_q, causal = rng.choice(_HEAD_DIMS), rng.choice(SEQ_LENS), r(0, 1)
        s_k = s_q if causal or r(0, 1) else rng.choice(SEQ_LENS)
        h = r(1, 64)
        qkv_per_batch = h * (s_q + 2 * s_k) * d * 4  # fp32 bytes, so every precision gets the same B
        return {"B": r(1, min(64, SDPA_QKV_BYTES // qkv_per_batch)), "H": h, "S_q": s_q, "S_k": s_k,
                "D": d, "causal": causal}  # fmt: skip
    return {"B": r(1, 16384), "H": r(1, 4096)}


def build_call(
    op: str, cfg: dict[str, int], device: torch.device, dtype: torch.dtype = torch.float32
) -> Callable[[], Any]:
    """The call of ``op`` at ``cfg`` on fresh tensors of ``dtype``, as a ``functools.partial`` (the
    forward, but for ``sdpa_bwd``: the backward of a forward run here)."""
    import torch.nn.functional as F

    def rand(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=grad)

    if op in ("sdpa", "sdpa_bwd"):
        b, h, s_q, s_k, d = (cfg[dim] for dim in ("B", "H", "S_q", "S_k", "D"))
        bwd = op == "sdpa_bwd"
        qkv = (rand(b, h, s_q, d, grad=bwd), rand(b, h, s_k, d, grad=bwd), rand(b, h, s_k, d, grad=bwd))
        attend = functools.partial(F.scaled_dot_product_attention, *qkv, is_causal=bool(cfg["causal"]))
        if not bwd:
            return attend
        with torch.enable_grad():  # the forward, outside the call measured, records its graph
            out = attend()
        grad_out = torch.randn_like(out)
        return functools.partial(torch.autograd.grad, out, qkv, grad_out, retain_graph=True)

    # The shared data's GEMM columns: N is reduced, K is the output's columns (datasets.GEMM_COLUMNS).
    if op == "linear":
        return functools.partial(F.linear, rand(cfg["B"], cfg["M"], cfg["N"]), rand(cfg["K"], cfg["N"]))
    if op == "bmm":
        b, m, n, k = (cfg[d] for d in _GEMM_DIMS)
        return functools.partial(torch.bmm, rand(b, m, n), rand(b, n, k))
    if op == "conv":
        x = rand(cfg["B"], cfg["Input_Channel"], cfg["Input_Size"], cfg["Input_Size"])
        w = rand(cfg["Output_Channel"], cfg["Input_Channel"], cfg["Kernel_Szie"], cfg["Kernel_Szie"])
        return functools.partial(F.conv2d, x, w, stride=cfg["Stride"], padding=cfg["Padding"])
    x = rand(cfg["B"], cfg["H"])
    if op == "ln":
        return functools.partial(F.layer_norm, x, (cfg["H"],), rand(cfg["H"]), rand(cfg["H"]))
    if op == "softmax":
        return functools.partial(torch.softmax, x, -1)
    unary: dict[str, Callable[..., Any]] = {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh}
    if op in unary:
        return functools.partial(unary[op], x)
    binary: dict[str, Callable[..., Any]] = {"add": torch.add, "mul": torch.mul, "div": torch.div,
                                             "pow": torch.pow}  # fmt: skip
    fn = binary[op.removesuffix("u")]
    other: torch.Tensor | float = _SCALAR if op.endswith("u") else rand(cfg["B"], cfg["H"])
    return functools.partial(fn, x, other)


def expand_ops(ops: Sequence[str]) -> list[str]:
    """Op names with ``elementwise`` standing for all eleven elementwise ops, each once.

    Raises:
        ValueError: an unknown op.
    """
    names: list[str] = []
    for op in ops:
        for name in ELEMENTWISE if op == "elementwise" else [op]:
            if name not in OPS:
                raise ValueError(f"unknown op {name!r}; known: elementwise, {', '.join(OPS)}")
            if name not in names:
                names.append(name)
    return names
