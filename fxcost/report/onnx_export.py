"""A report as an ONNX model, to look at the captured step in Netron with its costs on every node.

Every node of the report becomes one ONNX node, views and tuple accesses included: they carry the
data dependencies (``addmm_1`` reads ``getitem``, which reads ``native_layer_norm``), so leaving them
out would cut the graph; their ``has_kernel`` attribute is 0. The op ``aten.mm.default`` is op type
``mm`` in domain ``fxcost.aten`` (``operator.getitem``: ``getitem`` in ``fxcost.operator``); custom
domains have no schemas, so the model passes ``onnx.checker.check_model`` but cannot run.

Names are ``g<graph>/<node>``, as FX names are unique only within a graph. A node has one output per
tensor it returns (``g0/native_layer_norm:1`` when it returns several), typed with its shape and
dtype; a consumer reads every output of each producer in ``NodeCost.inputs``, as ``in_shapes``
flattens tuples. Graph inputs (parameters, the batch) are not recorded as producers, so they draw no
edge: the ``in_shapes`` attribute lists them. Typed outputs nobody reads become graph outputs.

Costs are node attributes (Netron lists them beside the node): ``op``, ``phase``, ``module``,
``has_kernel``, ``flops``, ``bytes_read``, ``bytes_written``, ``origin_ms``, ``pred_ms[<device>]`` and
``pred_source[<device>]``; unknown values (``None``) are left out rather than written as 0. Times
are float32 attributes, exact enough to read; the model's ``metadata_props`` hold the exact totals.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx
from onnx import TensorProto, helper

from fxcost._version import __version__
from fxcost.records import NodeCost

if TYPE_CHECKING:
    from fxcost.report.trace import Report

__all__ = ["onnx_model"]

_DTYPES = {
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "float8_e4m3fn": TensorProto.FLOAT8E4M3FN,
    "float8_e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ,
    "float8_e5m2": TensorProto.FLOAT8E5M2,
    "float8_e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ,
    "complex64": TensorProto.COMPLEX64,
    "complex128": TensorProto.COMPLEX128,
    "int8": TensorProto.INT8,
    "int16": TensorProto.INT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "uint8": TensorProto.UINT8,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
    "uint64": TensorProto.UINT64,
    "bool": TensorProto.BOOL,
}


def onnx_model(report: Report, devices: Sequence[str]) -> onnx.ModelProto:
    """The nodes of ``report`` as an ONNX model, with predictions for ``devices`` (canonical names
    the report predicted).

    Raises:
        ValueError: a node lists an input that no earlier node of its graph produces.

    Example:
        >>> model = onnx_model(report, ["T4"])
        >>> onnx.save(model, "step.onnx")  # or report.to_onnx("step.onnx"), which writes atomically
    """
    outputs: dict[tuple[int, str], list[str]] = {}  # (graph, node name) -> its output value names
    read: set[str] = set()
    nodes, typed = [], []
    for n in report.nodes:
        inputs = []
        for producer in n.inputs:
            if (n.graph, producer) not in outputs:
                raise ValueError(
                    f"node {n.name!r} of graph {n.graph} reads {producer!r}, which no earlier node "
                    f"of that graph produces"
                )
            inputs += outputs[n.graph, producer]
        read.update(inputs)
        name = f"g{n.graph}/{n.name}"
        names = [name] if len(n.out_shapes) <= 1 else [f"{name}:{i}" for i in range(len(n.out_shapes))]
        outputs[n.graph, n.name] = names
        namespace, _, overload = n.op.partition(".")  # "aten", "mm.default"
        op_type = overload.partition(".")[0] or namespace
        node = helper.make_node(op_type, inputs, names, name=name, domain=f"fxcost.{namespace}")
        node.attribute.extend(helper.make_attribute(k, v) for k, v in _attributes(n, devices).items())
        nodes.append(node)
        # A node returning no tensor (a size, None) still has one output, untyped, for its readers.
        typed += [
            helper.make_tensor_value_info(value, _DTYPES.get(dtype, TensorProto.UNDEFINED), shape)
            for value, shape, dtype in zip(names, n.out_shapes, n.out_dtypes, strict=False)
        ]
    graph = helper.make_graph(
        nodes,
        "fxcost",
        inputs=[],
        outputs=[v for v in typed if v.name not in read],
        value_info=[v for v in typed if v.name in read],
    )
    # The checker wants the standard domain imported even where no standard op is used.
    domains = sorted({node.domain for node in nodes})
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", onnx.defs.onnx_opset_version()),
            *(helper.make_opsetid(d, 1) for d in domains),
        ],
        producer_name="fxcost",
        producer_version=__version__,
    )
    props = {
        "fxcost_version": __version__,
        "origin": report.origin,
        "model": report.model,
        "devices": ",".join(devices),
    }
    props |= {f"total_ms[{d}]": repr(report.total_ms(d)) for d in devices}
    helper.set_model_props(model, props)
    return model


def _attributes(n: NodeCost, devices: Sequence[str]) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "op": n.op,
        "phase": n.phase,
        "module": n.module,
        "has_kernel": int(n.has_kernel),
        "flops": n.flops,
        "bytes_read": n.bytes_read,
        "bytes_written": n.bytes_written,
        "origin_ms": n.origin_ms,
        "in_shapes": json.dumps(n.in_shapes),
        "args": json.dumps(n.args),
        "note": n.note,
    }
    for d in devices:
        attrs[f"pred_ms[{d}]"] = n.pred_ms.get(d)
        attrs[f"pred_source[{d}]"] = n.pred_source.get(d)
    return {k: v for k, v in attrs.items() if v is not None}
