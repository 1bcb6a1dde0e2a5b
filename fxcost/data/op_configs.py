"""What ``fxcost collect`` measures: the ops of the shared data, their CSV columns, and the sequence
of random configurations each op is measured at.

Configuration ``i`` of an op is drawn from its own generator, seeded by ``(seed, family, i)``, so it is
the same whatever was measured before; the elementwise ops, ``ln`` and ``softmax`` share one family and
so one sequence of ``[B, H]`` shapes, as in the shared data. Ranges, uniform integers, inclusive:

=========== =================================================================================
linear      B = 1 (as in the shared data), M 1-3500, N 1-32768, K 1-32768 (Habitat §4.3.1:
            batch 1-3500, in/out features 1-32768); no bias (the schema has no bias column)
bmm         B 1-128, M, N, K 1-1024 (Habitat)
conv        B 1-64, Input_Channel 3-2048, Output_Channel 16-2048, Kernel_Szie 1-11, Input_Size
            1-256 (square), Stride 1-4, Padding 0-3 (Habitat), no bias; configurations whose
            kernel exceeds the padded image are redrawn
elementwise B 1-16384, H 1-4096 (the range of the shared data; Habitat has no such ops); the
ln, softmax "u" ops take the scalar 2.0
=========== =================================================================================
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxcost.data.datasets import ELEMENTWISE

__all__ = ["OPS", "build_call", "expand_ops", "header", "sample_config"]

_META = ["OPName", "Latency", "Device", "Torch Version", "CUDNN Version", "Kernel Name", "Warps per SM",
         "Blocks per SM", "Grid x", "Grid y", "Grid z", "Block x", "Block y", "Block z",
         "CUDA Version"]  # fmt: skip

_GEMM_DIMS = ["B", "M", "N", "K"]

_CONV_DIMS = ["B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"]

_VEC_DIMS = ["B", "H"]

# Op -> (sampling family, dims, whether the shared files have a "Kernels" column).
OPS: dict[str, tuple[str, list[str], bool]] = {
    "linear": ("linear", _GEMM_DIMS, True),
    "bmm": ("bmm", _GEMM_DIMS, True),
    "conv": ("conv", _CONV_DIMS, True),
    "ln": ("vec", _VEC_DIMS, True),
    "softmax": ("vec", _VEC_DIMS, False),
    **{op: ("vec", _VEC_DIMS, False) for op in ELEMENTWISE},
}

_SCALAR = 2.0


def header(op: str) -> list[str]:
    """The CSV columns of ``op``, in the order of the shared data."""
    _, dims, kernels = OPS[op]
    return [*_META, *(["Kernels"] if kernels else []), *dims]


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
    return {"B": r(1, 16384), "H": r(1, 4096)}


def build_call(op: str, cfg: dict[str, int], device: torch.device) -> Callable[[], Any]:
    """The forward call of ``op`` at ``cfg`` on fresh fp32 tensors, as a ``functools.partial``."""
    import torch.nn.functional as F

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, device=device, dtype=torch.float32)

    if op == "linear":
        return functools.partial(F.linear, rand(cfg["B"], cfg["M"], cfg["K"]), rand(cfg["N"], cfg["K"]))
    if op == "bmm":
        b, m, n, k = (cfg[d] for d in _GEMM_DIMS)
        return functools.partial(torch.bmm, rand(b, m, k), rand(b, k, n))
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
