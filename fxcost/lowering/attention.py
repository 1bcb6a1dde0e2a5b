"""Scaled-dot-product attention: its FLOPs, and the kernel a GPU runs for it.

**FLOPs.** Every attention kernel computes ``S = Q K^T`` and ``O = softmax(S) V``: the work of two
batched GEMMs, ``2·B·H·Sq·Sk·(D + Dv)`` FLOPs (``4·B·H·Sq·Sk·D`` when ``Dv = D``), half of it under
a causal mask. The backward recomputes ``S`` and runs four more GEMMs of the same sizes (``dV = P^T
dO``, ``dP = dO V^T``, ``dQ = dS K``, ``dK = dS^T Q``): 2.5 times the forward's work. The softmax is
not counted, as PyTorch's own formulas do not count it. Queries, keys and values are ``[B, H, S, D]``;
grouped-query attention gives keys and values fewer heads, and the work follows the queries' heads.

**Which kernel** (:func:`choose_backend`): PyTorch tries its backends in the order of
``torch._C._get_sdp_priority_order()`` (flash, memory-efficient, math, cuDNN by default; cuDNN first
on sm90/sm100 from PyTorch 2.8, :func:`priority`, read for the running torch, the one a capture ran in)
and takes the first whose constraints the call meets
(``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``): flash wants fp16/bf16 on sm80 or newer,
head dims equal and at most 256, no attention mask, a causal mask only on square scores, and on
sm86/sm89 no gradient for head dims above 192; memory-efficient wants sm50 or newer (bf16 from sm80),
head dims aligned to 16 bytes, and the same heads for queries and keys; math always runs. A graph
captured on a GPU records the kernel that ran (kept wherever the target can run it); one captured on
a CPU records ``_scaled_dot_product_flash_attention_for_cpu``, and the target GPU's choice is priced.

"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.fx.operator_schemas import normalize_function

from fxcost.gpus import Device
from fxcost.gpus.occupancy import sm_version
from fxcost.lowering.flops import register_flops
from fxcost.lowering.nodes import gemm_node
from fxcost.lowering.traffic import FLEX_OPS
from fxcost.precision import itemsize
from fxcost.records import NodeCost, Shape

__all__ = ["ATTENTION_BACKWARD_OPS", "ATTENTION_OPS", "FLEX_OPS", "AttentionCall", "Backend",
           "attention_call", "attention_flops", "choose_backend", "lower_attention", "priority"]  # fmt: skip

aten = torch.ops.aten

Backend = Literal["flash", "efficient", "cudnn", "math"]

PRIORITY: tuple[Backend, ...] = ("flash", "efficient", "math", "cudnn")
"""PyTorch's default backend order (``priority_order`` in ``sdp_utils.cpp``): cuDNN after math."""

CUDNN_FIRST: tuple[Backend, ...] = ("cudnn", "flash", "efficient", "math")
"""The order where PyTorch prefers cuDNN (``check_prefer_cudnn_attention``): sm90 and sm100."""

CUDNN_PREFERRED_SINCE = (2, 8)
"""The first PyTorch that prefers cuDNN on sm90/sm100 by default (it ships cuDNN >= 9.9, which the
preference requires; ``TORCH_CUDNN_SDPA_PREFERRED=0`` turns it off). 2.5.0 preferred it on Hopper too,
2.5.1 made it opt-in again (the same variable set to 1), until 2.8. The H100 recordings (torch 2.11)
ran cuDNN for masked and dropout calls, which the default order gives the memory-efficient kernel."""


def _version(text: str) -> tuple[int, ...]:
    """``"2.11.0+cu130"`` -> ``(2, 11, 0)``; the numeric head of each dot-separated part."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x) for x in found.groups() if x is not None) if found else ()


def priority(device: Device, torch_version: str | None = None) -> tuple[Backend, ...]:
    """The order PyTorch ``torch_version`` (default: the running one, which a capture runs in) tries
    its attention backends in on ``device``.

    Example:
        >>> from fxcost.gpus import get_device
        >>> priority(get_device("H100-SXM"), "2.11.0+cu130")[0], priority(get_device("H100-SXM"), "2.6.0")[0]
        ('cudnn', 'flash')
    """
    version = _version(torch_version or torch.__version__)
    if device.vendor != "NVIDIA" or sm_version(device) not in (90, 100):
        return PRIORITY
    preferred = version >= CUDNN_PREFERRED_SINCE or version[:3] == (2, 5, 0)
    return CUDNN_FIRST if preferred else PRIORITY


def _packets(*names: str) -> tuple[Any, ...]:
    """The aten packets of ``names`` this torch has (the cuDNN and overrideable kernels are newer
    than the oldest torch fxcost supports)."""
    return tuple(getattr(aten, n) for n in names if hasattr(aten, n))


_KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable")  # fmt: skip
_FORWARD = _packets(*_KERNELS)
_BACKWARD = _packets(*(f"{k}_backward" for k in _KERNELS))
_BACKWARD_NAMES = frozenset(f"{p}.default" for p in _BACKWARD)

ATTENTION_BACKWARD_OPS = frozenset({*_BACKWARD_NAMES, FLEX_OPS[1]})
ATTENTION_OPS = frozenset({*(f"{p}.default" for p in (*_FORWARD, *_BACKWARD)), *FLEX_OPS})
"""The fused attention ops (canonical names), forward and backward (:data:`ATTENTION_BACKWARD_OPS`)."""

# Per op: the kernel it records (None: a CPU kernel, the target chooses), and where its attention
# mask sits among its tensor inputs with how many tensors it has without one (None: it takes none).
_RECORDED: dict[str, Backend | None] = {
    "_scaled_dot_product_flash_attention_for_cpu": None, "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient", "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": None,
}  # fmt: skip
_MASK_AT: dict[str, tuple[int, int] | None] = {
    "_scaled_dot_product_flash_attention_for_cpu": (3, 3),
    "_scaled_dot_product_flash_attention_for_cpu_backward": (6, 6),
    "_scaled_dot_product_flash_attention": None, "_scaled_dot_product_flash_attention_backward": None,
    "_scaled_dot_product_efficient_attention": (3, 3),
    "_scaled_dot_product_efficient_attention_backward": (4, 8),
    "_scaled_dot_product_cudnn_attention": (3, 3), "_scaled_dot_product_cudnn_attention_backward": (8, 8),
    "_scaled_dot_product_fused_attention_overrideable": (3, 3),
    "_scaled_dot_product_fused_attention_overrideable_backward": (4, 8),
}  # fmt: skip
# A capture records the tensors it was given: an absent mask, and the nested-tensor offsets (cum_seq_q,
# cum_seq_k) of a dense call, are None and take no place among the shapes; the philox seed and offset
# are 0-d tensors that are always there. So the backwards' counts are those of grad_out, q, k, v, out,
# logsumexp and the two philox tensors: 8.


def attention_flops(q: Shape, k: Shape, v: Shape, causal: bool, backward: bool) -> int:
    """FLOPs of attention over queries ``q``, keys ``k`` and values ``v`` (``[..., S, D]`` shapes).

    Example:
        >>> attention_flops((2, 4, 128, 64), (2, 4, 128, 64), (2, 4, 128, 64), causal=False, backward=False)
        33554432
    """
    heads, sq, d = math.prod(q[:-2]), q[-2], q[-1]
    sk, dv = k[-2], v[-1]
    # Forward: S (D), O (Dv). Backward: S (D), dV (Dv), dP (Dv), dQ (D), dK (D).
    flops = 2 * heads * sq * sk * ((3 * d + 2 * dv) if backward else (d + dv))
    return flops // 2 if causal else flops


def _formula(packet: Any, backward: bool) -> Any:
    first = 1 if backward else 0  # a backward's first argument is the output's gradient

    def formula(args: Any, kwargs: Any, out: Any) -> int:
        q, k, v = (tuple(t.shape) for t in args[first : first + 3])
        normalized = normalize_function(packet.default, args, kwargs, normalize_to_only_use_kwargs=True)
        causal = bool(normalized.kwargs.get("is_causal", False)) if normalized is not None else False
        return attention_flops(q, k, v, causal, backward)

    return formula


def _flex_formula(backward: bool) -> Any:
    """FLOPs of a FlexAttention call, counted dense: a capture's tensors carry no values, so the block
    mask's skipped blocks are unknown and the count is an upper bound. Queries, keys and values are the
    op's first three arguments, forward and backward alike."""

    def formula(args: Any, kwargs: Any, out: Any) -> int:
        q, k, v = (tuple(t.shape) for t in args[:3])
        return attention_flops(q, k, v, causal=False, backward=backward)

    return formula


for _name, _backward in zip(FLEX_OPS, (False, True), strict=True):
    register_flops(_name, matmul=True)(_flex_formula(_backward))
for _packet in _FORWARD:
    register_flops(_packet, replace_torch=True, matmul=True)(_formula(_packet, backward=False))
for _packet in _BACKWARD:
    register_flops(_packet, replace_torch=True, matmul=True)(_formula(_packet, backward=True))


@dataclass(frozen=True)
class AttentionCall:
    """One attention node's problem, as PyTorch's backend selection and the kernels see it.

    Attributes:
        batch: the product of the leading dims (B).
        heads, kv_heads: heads of the queries and of the keys and values.
        sq, sk: query and key lengths. d, dv: head dims of queries/keys and of values.
        dtype: the inputs' dtype name. causal: ``is_causal``. masked: an attention mask is passed.
        dropout: ``dropout_p``. backward: the backward op.
        recorded: the kernel a GPU capture recorded; None for a CPU kernel (the target chooses).
        mask_bytes: bytes of the additive mask as passed (0 without one; a mask broadcast over the
            heads, ``[B, 1, Sq, Sk]`` as Hugging Face's models pass it, counts once).
        mask_heads: heads the mask carries (its dim -3; 1 where it is broadcast over the heads).
    """

    batch: int
    heads: int
    kv_heads: int
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str
    causal: bool
    masked: bool
    dropout: float
    backward: bool
    recorded: Backend | None
    mask_bytes: int = 0
    mask_heads: int = 1


def attention_call(node: NodeCost) -> AttentionCall | None:
    """The problem of an attention node; None for other ops or inputs of other ranks."""
    if node.op not in ATTENTION_OPS:
        return None
    backward = node.op in ATTENTION_BACKWARD_OPS
    if node.op in FLEX_OPS:
        return _flex_call(node, backward)
    packet = node.op.split(".")[1]
    forward_name = packet.removesuffix("_backward")
    first = 1 if backward else 0
    q, k, v = node.in_shapes[first : first + 3]
    if len(q) < 3 or len(k) != len(q) or len(v) != len(q):
        return None
    where = _MASK_AT.get(packet)
    masked = where is not None and len(node.in_shapes) > where[1] and len(node.in_shapes[where[0]]) >= 2
    mask_bytes, mask_heads = 0, 1
    if masked and where is not None:
        mask_dtype = node.in_dtypes[where[0]] if len(node.in_dtypes) > where[0] else node.in_dtypes[first]
        mask_shape = node.in_shapes[where[0]]
        mask_bytes = math.prod(mask_shape) * itemsize(mask_dtype)
        mask_heads = mask_shape[-3] if len(mask_shape) >= 3 else 1
    return AttentionCall(
        batch=math.prod(q[:-3]), heads=q[-3], kv_heads=k[-3], sq=q[-2], sk=k[-2], d=q[-1], dv=v[-1],
        dtype=node.in_dtypes[first], causal=bool(node.args.get("is_causal")), masked=masked,
        dropout=float(node.args.get("dropout_p") or 0.0), backward=backward,
        recorded=_RECORDED.get(forward_name), mask_bytes=mask_bytes,
        mask_heads=mask_heads,
    )  # fmt: skip


def _flex_call(node: NodeCost, backward: bool) -> AttentionCall | None:
    """A FlexAttention node as the call of the FlashAttention-2 kernel its Triton kernel follows:
    dense (as its FLOPs are counted), its score and mask functions' own work not counted."""
    q, k, v = [*node.in_shapes, (), (), ()][:3]
    if len(q) < 3 or len(k) != len(q) or len(v) != len(q):
        return None
    return AttentionCall(
        batch=math.prod(q[:-3]), heads=q[-3], kv_heads=k[-3], sq=q[-2], sk=k[-2], d=q[-1], dv=v[-1],
        dtype=node.in_dtypes[0], causal=False, masked=False, dropout=0.0, backward=backward, recorded="flash",
    )  # fmt: skip


def _supports(backend: Backend, call: AttentionCall, device: Device) -> bool:
    """Whether PyTorch's constraints for ``backend`` (sdp_utils.cpp, dense inputs) admit ``call``."""
    if backend == "math":
        return True
    half = call.dtype in ("float16", "bfloat16")
    if device.vendor != "NVIDIA":  # ROCm's AOTriton kernels: flash and efficient on fp16/bf16
        return backend in ("flash", "efficient") and half and not (backend == "flash" and call.masked)
    sm = sm_version(device)
    if sm is None:
        return False
    if backend == "flash":
        return (
            sm >= 80 and half and not call.masked and call.d == call.dv and call.d <= 256
            and not (call.causal and call.sq != call.sk)
            and not (call.backward and sm in (86, 89) and call.d > 192)
        )  # fmt: skip
    if backend == "efficient":
        align = 16 // itemsize(call.dtype)  # the CUTLASS kernels load 16-byte vectors
        return (
            sm >= 50 and call.dtype in ("float32", "float16", "bfloat16")
            and not (call.dtype == "bfloat16" and sm < 80)
            and call.d % align == 0 and call.dv % align == 0 and call.heads == call.kv_heads
        )  # fmt: skip
    return sm >= 80 and half and call.d == call.dv and call.d <= 128 and call.d % 8 == 0  # cuDNN


def choose_backend(call: AttentionCall, device: Device, torch_version: str | None = None) -> Backend:
    """The kernel PyTorch runs ``call`` with on ``device``: the recorded one if the target can run it,
    else the first backend in the :func:`priority` order of ``torch_version`` (default: the running
    torch) whose constraints admit the call.

    Example:
        >>> from fxcost.gpus import get_device
        >>> call = AttentionCall(2, 8, 8, 512, 512, 64, 64, "bfloat16", True, False, 0.0, False, None)
        >>> a100, v100, h100 = (get_device(n) for n in ("A100-SXM4-80GB", "V100-SXM2-16GB", "H100-SXM"))
        >>> choose_backend(call, a100), choose_backend(call, v100)
        ('flash', 'math')
        >>> choose_backend(call, h100, "2.11.0"), choose_backend(call, h100, "2.7.1")
        ('cudnn', 'flash')
    """
    if call.recorded is not None and _supports(call.recorded, call, device):
        return call.recorded
    return next(b for b in priority(device, torch_version) if _supports(b, call, device))


def lower_attention(node: NodeCost) -> list[tuple[NodeCost, int]]:
    """The batched GEMMs an attention node runs, as (``bmm`` node, repetitions), on no GPU in
    particular: what the intervals and features of the GEMM heads read. Empty for other ops."""
    call = attention_call(node)
    if call is None:
        return []
    sk = max(math.ceil(call.sk / 2), 1) if call.causal else call.sk
    bh = call.batch * call.heads
    scores = gemm_node("bmm", bh, call.sq, sk, call.d, call.dtype)  # S = Q K^T
    if not call.backward:
        return [(scores, 1), (gemm_node("bmm", bh, call.sq, call.dv, sk, call.dtype), 1)]  # O = P V
    return [
        (scores, 1),
        (gemm_node("bmm", bh, sk, call.dv, call.sq, call.dtype), 1),  # dV = P^T dO
        (gemm_node("bmm", bh, call.sq, sk, call.dv, call.dtype), 1),  # dP = dO V^T
        (gemm_node("bmm", bh, call.sq, call.d, sk, call.dtype), 1),  # dQ = dS K
        (gemm_node("bmm", bh, sk, call.d, call.sq, call.dtype), 1),  # dK = dS^T Q
    ]
