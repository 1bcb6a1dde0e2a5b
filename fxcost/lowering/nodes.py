"""Synthetic nodes and operand readers: GEMMs, convolutions and memory passes as records.

Cost models price work that no captured node stands for: a cuDNN RNN's GEMMs, the forward
convolution a ``convolution_backward`` runs once per gradient, a memory-bound op as the elementwise
passes its kernels make. The measured data set's rows are such nodes too (``fxcost.data``). This
module builds them, and reads the operands of GEMM and convolution nodes in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fxcost.lowering.flops import count_flops
from fxcost.lowering.kernels import resolve_op
from fxcost.lowering.traffic import recorded_bytes
from fxcost.precision import itemsize
from fxcost.records import NodeCost, Shape

__all__ = [
    "MATMULS",
    "batch_norm_node",
    "conv_dims",
    "conv_gradients",
    "conv_node",
    "forward_conv",
    "gemm_dims",
    "gemm_node",
    "is_conv_backward",
    "matmul_operands",
    "memory_pass",
    "synthetic_node",
]

MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default")
_CONV_BACKWARD = "aten.convolution_backward.default"


def synthetic_node(
    aten_name: str,
    in_shapes: list[Shape],
    out_shapes: list[Shape],
    args: dict[str, Any] | None = None,
    extra: tuple[Any, ...] = (),
    flops: int | None = None,
    dtype: str = "float32",
) -> NodeCost:
    """A node of ``aten_name`` on ``dtype`` tensors of ``in_shapes``; ``extra`` are the op's other call
    arguments, after the tensors, for counting its FLOPs (unless ``flops`` gives them)."""
    if flops is None:
        import torch

        ins = [torch.empty(s, device="meta") for s in in_shapes]
        outs = [torch.empty(s, device="meta") for s in out_shapes]
        out = outs[0] if len(outs) == 1 else tuple(outs)
        counted = count_flops(resolve_op(aten_name), (*ins, *extra), {}, out)
        flops = None if counted is None else int(counted)
    in_dtypes, out_dtypes = [dtype] * len(in_shapes), [dtype] * len(out_shapes)
    return NodeCost(
        name=aten_name.split(".")[1],
        op=aten_name,
        phase="fw",
        in_shapes=in_shapes,
        in_dtypes=in_dtypes,
        out_shapes=out_shapes,
        out_dtypes=out_dtypes,
        args=args or {},
        flops=flops,
        bytes_read=recorded_bytes(in_shapes, in_dtypes),
        bytes_written=recorded_bytes(out_shapes, out_dtypes),
    )


def gemm_node(op: str, batch: int, m: int, n: int, k: int, dtype: str = "float32") -> NodeCost:
    """A ``linear`` ([B, M, K] x [N, K]^T, one GEMM of B*M rows) or ``bmm`` problem as a node."""
    flops = 2 * batch * m * n * k  # a multiply-add per output element per reduced element
    if op == "linear":
        return synthetic_node("aten.mm.default", [(batch * m, k), (k, n)], [(batch * m, n)], flops=flops,
                              dtype=dtype)  # fmt: skip
    return synthetic_node("aten.bmm.default", [(batch, m, k), (batch, k, n)], [(batch, m, n)], flops=flops,
                          dtype=dtype)  # fmt: skip


def conv_node(
    batch: int, c_in: int, c_out: int, kernel: int, size: int, stride: int, padding: int
) -> NodeCost:
    """A 2-D convolution (square input and kernel, no bias) as an ``aten.convolution`` node."""
    out = (size + 2 * padding - kernel) // stride + 1
    args = {"stride": [stride, stride], "padding": [padding, padding], "dilation": [1, 1],
            "transposed": False, "output_padding": [0, 0], "groups": 1}  # fmt: skip
    # A multiply-add per output element per filter tap, as torch.utils.flop_counter counts it;
    # written out because the heads build one of these per backward convolution they predict.
    flops = 2 * batch * c_out * out * out * c_in * kernel * kernel
    x, w = (batch, c_in, size, size), (c_out, c_in, kernel, kernel)
    return synthetic_node("aten.convolution.default", [x, w], [(batch, c_out, out, out)], args, flops=flops)


def batch_norm_node(shape: Shape, dtype: str = "float32", backward: bool = False) -> NodeCost:
    """Training batch norm over an NCHW input of ``shape`` (statistics and weights in fp32 as under
    autocast), forward or, with ``backward``, the gradients of input, weight and bias."""
    c = tuple(shape[1:2])
    if backward:
        node = synthetic_node("aten.native_batch_norm_backward.default", [shape, shape, c, c, c, c, c],
                              [shape, c, c], {"train": True, "eps": 1e-5, "output_mask": [True] * 3},
                              extra=(True, 1e-5, [True] * 3))  # fmt: skip
    else:
        node = synthetic_node("aten._native_batch_norm_legit_functional.default", [shape, c, c, c, c],
                              [shape, c, c, c, c], {"training": True, "momentum": 0.1, "eps": 1e-5},
                              extra=(True, 0.1, 1e-5))  # fmt: skip
    dtypes = [dtype if s == shape else "float32" for s in node.in_shapes]
    out_dtypes = [dtype if s == shape else "float32" for s in node.out_shapes]
    return dataclasses.replace(
        node,
        phase="bw" if backward else "fw",
        in_dtypes=dtypes,
        out_dtypes=out_dtypes,
        bytes_read=recorded_bytes(node.in_shapes, dtypes),
        bytes_written=recorded_bytes(node.out_shapes, out_dtypes),
    )


def memory_pass(nbytes: float, dtype: str) -> NodeCost:
    """A memory pass moving ``nbytes``, as the elementwise head knows it: a ``relu`` over ``dtype``
    elements, half of the bytes read and half written."""
    numel = max(round(nbytes / (2 * itemsize(dtype))), 1)
    return NodeCost(
        name="relu",
        op="aten.relu.default",
        phase="fw",
        in_shapes=[(numel,)],
        in_dtypes=[dtype],
        out_shapes=[(numel,)],
        out_dtypes=[dtype],
        flops=numel,
        bytes_read=numel * itemsize(dtype),
        bytes_written=numel * itemsize(dtype),
    )


# -- operands of recorded nodes ---------------------------------------------------------------------


def matmul_operands(node: NodeCost) -> tuple[Shape, Shape]:
    """The two multiplied operands of a (batched) GEMM node: its last two inputs (the first input of
    ``addmm`` and ``baddbmm`` is the added tensor)."""
    return node.in_shapes[-2], node.in_shapes[-1]


def gemm_dims(node: NodeCost) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a GEMM-like node."""
    a, b = matmul_operands(node)
    if len(a) == 3:
        return a[0], a[1], b[2], a[2]
    return 1, a[0], b[1], a[1]


def is_conv_backward(node: NodeCost) -> bool:
    return node.op == _CONV_BACKWARD


def conv_dims(node: NodeCost) -> tuple[int, int, int, int, int, int]:
    """(batch, C_in, C_out, kernel, input size, stride) of a 2-D convolution (or its backward)."""
    first = 1 if is_conv_backward(node) else 0  # the backward's first input is the output's gradient
    x, w = node.in_shapes[first], node.in_shapes[first + 1]
    stride = node.args.get("stride") or [1]
    return x[0], x[1], w[0], w[-1], x[-1], int(stride[0])


def conv_gradients(node: NodeCost) -> int:
    """How many convolutions a ``convolution_backward`` runs: grad of the input and/or the weight."""
    mask = node.args.get("output_mask") or [True, True, False]
    return max(int(bool(mask[0])) + int(bool(mask[1])), 1)


def forward_conv(node: NodeCost) -> NodeCost:
    """The forward convolution whose gradients a ``convolution_backward`` node computes."""
    b, cin, cout, kernel, size, stride = conv_dims(node)
    return conv_node(b, cin, cout, kernel, size, stride, int((node.args.get("padding") or [0])[0]))
