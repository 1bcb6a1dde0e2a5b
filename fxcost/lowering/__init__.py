"""Lowering: what an ATen op costs before any model looks at it.

FLOPs, bytes read and written, and whether the op launches a kernel at all.
"""

from fxcost.lowering.flops import count_flops, is_matmul_class, register_flops
from fxcost.lowering.kernels import MEMORY_BOUND, KernelSpec, lower, resolve_op
from fxcost.lowering.traffic import has_kernel, itemsize, recorded_bytes, size_hint, tensor_bytes

__all__ = [
    "MEMORY_BOUND",
    "KernelSpec",
    "count_flops",
    "has_kernel",
    "is_matmul_class",
    "itemsize",
    "lower",
    "recorded_bytes",
    "register_flops",
    "resolve_op",
    "size_hint",
    "tensor_bytes",
]
