"""Annotation pass: one :class:`~fxcost.records.NodeCost` per call node of a captured ATen graph.

Reads the fake tensors AOTAutograd leaves in ``node.meta["val"]`` (no tensor is computed) and records
the canonical op, phase, shapes and dtypes, FLOPs, bytes read and written, whether a kernel runs, and
the owning module path. Backward nodes get the module of the forward op they differentiate, which
AOTAutograd keeps in ``node.meta["fwd_nn_module_stack"]``.

The graph is what eager PyTorch runs, with one exception this pass corrects: AOTAutograd turns an
inactive dropout (eval mode, ``p=0``) into a ``clone``, where eager returns its input and launches
nothing; such a clone is recorded without a kernel.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from fxcost.lowering import count_flops, has_kernel, is_matmul_class, size_hint, tensor_bytes
from fxcost.records import META_KEY, NodeCost, Phase, Shape

__all__ = ["Operands", "op_name", "operands", "run"]

log = logging.getLogger(__name__)


def run(gm: torch.fx.GraphModule, phase: Phase, graph_index: int = 0) -> torch.fx.GraphModule:
    """Annotate every ``call_function`` node of ``gm`` with a fresh ``NodeCost``.

    Raises:
        RuntimeError: a node could not be annotated; the message names it.
    """
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        try:
            node.meta[META_KEY] = _annotate(node, phase, graph_index)
        except Exception as e:
            raise RuntimeError(f"fxcost annotate failed on node={node.format_node()}") from e
    return gm


def op_name(target: Any) -> str:
    """Canonical name of a call target: ``"aten.mm.default"`` or ``"operator.getitem"``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or type(target).__module__
    if module in {"_operator", "builtins"}:
        module = "operator"
    return f"{module}.{getattr(target, '__name__', repr(target))}"


@dataclass(frozen=True)
class Operands:
    """The (fake) values a call node reads and writes: its arguments, its result, the tensors among
    them (lists of tensors flattened, in schema order), and the tensors it writes (its outputs, or
    for in-place ops that return nothing, such as the optimizer's ``_foreach_add_``, the arguments
    its schema marks as written)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    ins: list[torch.Tensor]
    outs: list[torch.Tensor]
    written: list[torch.Tensor]


def operands(node: torch.fx.Node) -> Operands:
    """The values of ``node``'s arguments and result, from the fake tensors in ``node.meta["val"]``."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), _value)
    out = node.meta.get("val")
    ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    written = outs or _mutated_args(node.target, args, kwargs)
    return Operands(args, kwargs, out, ins, outs, written)


def _launches_kernel(node: torch.fx.Node) -> bool:
    """Whether ``node`` runs a kernel in eager PyTorch (see the module docstring for the exception)."""
    return has_kernel(node.target) and not _inactive_dropout(node)


def _annotate(node: torch.fx.Node, phase: Phase, graph_index: int) -> NodeCost:
    v = operands(node)
    record = NodeCost(
        name=node.name,
        op=op_name(node.target),
        phase=phase,
        graph=graph_index,
        module=_module_path(node),
        in_shapes=[_shape(t) for t in v.ins],
        in_dtypes=[_dtype(t) for t in v.ins],
        out_shapes=[_shape(t) for t in v.outs],
        out_dtypes=[_dtype(t) for t in v.outs],
        args=_scalar_args(node),
        has_kernel=_launches_kernel(node),
        inputs=[a.name for a in node.all_input_nodes if a.op == "call_function"],
    )
    if any(isinstance(s, torch.SymInt) for t in (*v.ins, *v.outs) for s in t.shape):
        record.note = "dynamic shape: sizes and costs at the sizes of the graph's latest run"
    if not record.has_kernel:
        record.flops, record.bytes_read, record.bytes_written = 0, 0, 0
        return record
    try:
        flops = count_flops(node.target, v.args, v.kwargs, v.out)
        # Under dynamic shapes the count is a SymInt expression: its value at the traced sizes.
        record.flops = None if flops is None else size_hint(flops)
    except Exception as e:  # a formula that cannot handle these arguments: unknown, not zero
        log.debug("no FLOP count for %s: %s", node.format_node(), e)
        record.flops = None
    if record.flops is None:
        record.note = f"no FLOP formula for {record.op}"  # replaces a dynamic-shape note: more urgent
    record.tf32 = _tf32(node.target, v.outs)
    record.bytes_read = sum(size_hint(tensor_bytes(t)) for t in v.ins)
    record.bytes_written = sum(size_hint(tensor_bytes(t)) for t in v.written)
    return record


_F = torch.nn.functional
_DROPOUTS = (_F.dropout, _F.dropout1d, _F.dropout2d, _F.dropout3d, _F.alpha_dropout, _F.feature_alpha_dropout,
             torch.dropout, torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
             torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)  # fmt: skip


def _inactive_dropout(node: torch.fx.Node) -> bool:
    """Whether ``node`` is the clone an inactive dropout became (a no-op in eager): a clone whose
    source function (the module class or function Dynamo traced) is a dropout."""
    if node.target is not torch.ops.aten.clone.default:
        return False
    stack = node.meta.get("source_fn_stack") or []
    return bool(stack) and any(stack[-1][1] is d for d in _DROPOUTS)


_CONVOLUTIONS = frozenset({torch.ops.aten.convolution, torch.ops.aten.convolution_backward,
                           torch.ops.aten._convolution})  # fmt: skip


def _tf32(target: Any, outs: list[torch.Tensor]) -> bool:
    """Whether an fp32 matmul-class op may run on TF32 tensor cores under the process's settings."""
    if not isinstance(target, torch._ops.OpOverload) or not is_matmul_class(str(target)):
        return False
    if not outs or outs[0].dtype != torch.float32:
        return False
    if target.overloadpacket in _CONVOLUTIONS:
        return bool(torch.backends.cudnn.allow_tf32)
    return bool(torch.backends.cuda.matmul.allow_tf32)


def _mutated_args(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """Tensors the op's schema marks as written (``Tensor(a!)``)."""
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return []
    written: list[Any] = []
    for i, arg in enumerate(target._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written.append(args[i] if i < len(args) else kwargs.get(arg.name))
    return [t for t in tree_leaves(written) if isinstance(t, torch.Tensor)]


def _scalar_args(node: torch.fx.Node) -> dict[str, Any]:
    """The op's non-tensor arguments by schema name, as JSON-friendly values (ints, floats, lists)."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return {}
    normalized = torch.fx.operator_schemas.normalize_function(
        node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True
    )
    if normalized is None:
        return {}
    return {k: v for k, v in normalized.kwargs.items() if _is_plain(v)}


def _is_plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _value(n: torch.fx.Node) -> Any:
    return n.meta.get("val")


def _shape(t: torch.Tensor) -> Shape:
    return tuple(size_hint(s) for s in t.shape)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


_DYNAMO_ROOT = re.compile(r"^L\['[^']*'\]\.?")
_MODULES_ITEM = re.compile(r"\._modules\['([^']*)'\]")
_INDEX = re.compile(r"\[['\"]?([^\]'\"]+)['\"]?\]")


def _module_path(node: torch.fx.Node) -> str:
    """Dotted path of the innermost module that owns ``node``, relative to the compiled root."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    path = _DYNAMO_ROOT.sub("", str(path))
    path = _MODULES_ITEM.sub(r".\1", path)
    return _INDEX.sub(r".\1", path).strip(".")
