"""Lowering: what an ATen op costs before any model looks at it.

FLOPs, bytes read and written, whether the op launches a kernel at all, the kernels it launches
(``kernels``; the memory passes of indexing, sorting and bag ops in ``memory_ops``, batch norm's
and max pooling's kernels in ``batch_norm`` and ``max_pool``), the GEMMs a cuDNN RNN, fused
attention or a grouped MoE GEMM runs (``composite``: ``rnn``, ``attention``, ``experts``), and the
synthetic nodes cost models price in place of a recorded one (``nodes``).
"""

from fxcost.lowering import batch_norm, composite, max_pool, memory_ops  # noqa: F401  (they register FLOPs and passes)
from fxcost.lowering.flops import count_flops, is_matmul_class, register_flops
from fxcost.lowering.kernels import MEMORY_BOUND, KernelSpec, is_pointwise, lower, resolve_op
from fxcost.lowering.traffic import bound_sizes, has_kernel, recorded_bytes, size_hint, tensor_bytes

__all__ = [
    "MEMORY_BOUND",
    "KernelSpec",
    "bound_sizes",
    "count_flops",
    "has_kernel",
    "is_matmul_class",
    "is_pointwise",
    "lower",
    "recorded_bytes",
    "register_flops",
    "resolve_op",
    "size_hint",
    "tensor_bytes",
]
