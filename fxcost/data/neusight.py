"""NeuSight per-FX-node traces read as origin measurements, for runtime-based prediction.

A trace (``models/<Device>/<model>-<mode>-<seqlen>-<batch>.csv`` in the shared data) is a Hugging Face
model traced with ``torch.fx`` at module level: one row per FX node with its input shapes and its
forward time measured on the GPU. It covers the embeddings, the first layer and the head; the other
layers repeat the first. :func:`read_trace` turns it into a :class:`~fxcost.report.Report`:

- each node that launches kernels is lowered to the ATen ops eager PyTorch runs for it (the node
  re-run with meta tensors under ``make_fx``: a ``Linear`` becomes ``addmm``, a ``matmul`` of
  permuted heads becomes its copies and a ``bmm``), and its measured time is split over them in
  proportion to their roofline time on the measuring GPU;
- nodes that launch nothing (views, size queries, an inactive dropout, a conversion to the dtype a
  tensor already has) cost nothing: their trace time is the host overhead of timing them alone;
- the first layer's nodes are repeated for every layer of the model (``num_layer`` of the run).

The report's origin is the measuring GPU, so the default policy predicts other GPUs runtime-based:
kernel-alike ops wave-scaled from their measured time, matmuls by the MLP heads. Only forward times
are read: the traces of training runs are all from one GPU, so no pair of GPUs shares one.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from fxcost.gpus import get_device
from fxcost.records import META_KEY, NodeCost
from fxcost.report import Report

__all__ = ["read_trace"]

# Nodes that only look at or re-describe a tensor: no kernel in eager.
_NO_KERNEL = {"size", "dim", "getitem", "getattr", "view", "permute", "transpose", "expand", "unsqueeze",
              "squeeze", "split", "chunk", "finfo", "type", "type_as", "long", "float", "to", "bool",
              "dropout", "reshape", "contiguous"}  # fmt: skip
_DTYPES = {"torch.float32": torch.float32, "torch.float16": torch.float16, "torch.bfloat16": torch.bfloat16,
           "torch.int64": torch.int64, "torch.int32": torch.int32, "torch.bool": torch.bool}  # fmt: skip
_BINARY: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.div, "pow": torch.pow,
    "max": torch.maximum, "min": torch.minimum, "ne": torch.ne, "eq": torch.eq, "lt": torch.lt,
    "gt": torch.gt,
}  # fmt: skip
_UNARY: dict[str, Callable[..., torch.Tensor]] = {
    "tanh": torch.tanh, "gelu": F.gelu, "relu": torch.relu, "sigmoid": torch.sigmoid, "neg": torch.neg,
    "exp": torch.exp, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "cumsum": lambda x: torch.cumsum(x, -1),
    "softmax": lambda x: F.softmax(x, dim=-1),
}  # fmt: skip
_LAYER = re.compile(r"(?:^|[._])(?:h|layer|layers|block|blocks)[._]0[._]")


def read_trace(csv: str | Path, config: str | Path | dict[str, Any] | None = None) -> Report:
    """The trace ``csv`` (its run's JSON beside it gives ``num_layer``) as a report measured on the GPU
    of its folder. ``config`` is the model's Hugging Face config (default: ``model_configs/<model>.json``
    two folders up), used to look up the type of each module node."""
    from fxcost.zoo.hf import hf_step

    csv = Path(csv)
    device = get_device(csv.parent.name).name
    model_name, mode = csv.stem.split("-")[:2]
    run = json.loads(csv.with_suffix(".json").read_text())
    if config is None:
        config = csv.parent.parent.parent / "model_configs" / f"{model_name}.json"
    model = hf_step(config, batch=1, seqlen=1, train=mode == "train").model
    rows = pd.read_csv(csv)
    dtypes = dict(zip(rows["Name"], rows["dtype"], strict=True))
    layer = rows["Name"].str.contains(_LAYER) | rows["target"].astype(str).str.contains(_LAYER)
    first, last = layer.idxmax(), layer[::-1].idxmax()
    nodes: list[NodeCost] = []
    for i, row in rows.iterrows():
        if row["op"] not in ("call_module", "call_function", "call_method"):
            continue
        lowered = _lower(row, model, dtypes)
        _share(lowered, float(row["fw_latency"]), device)
        for node in lowered:
            node.name, node.module = f"{row['Name']}.{node.name}", str(row["target"])
        repeats = int(run.get("num_layer") or 1) if first <= i <= last else 1
        # Each repeat its own record: predictions are written per node.
        nodes += [dataclasses.replace(n, pred_ms={}, pred_source={}) for _ in range(repeats) for n in lowered]
    for i, node in enumerate(nodes):  # the trace keeps no edges: one chain, in the order measured
        node.name = f"{node.name}#{i}"
        node.inputs = [nodes[i - 1].name] if i else []
    return Report(nodes=nodes, devices=[], origin=device, model="auto")


def _lower(row: pd.Series, model: torch.nn.Module, dtypes: dict[str, Any]) -> list[NodeCost]:
    """The ATen nodes with kernels that eager PyTorch runs for one trace row."""
    shapes = [tuple(s) for s in ast.literal_eval(row["input_shapes"])]
    name = _name(row)
    out_dtype = _DTYPES.get(str(row["dtype"]), torch.float32)
    if row["op"] == "call_module":
        target = str(row["target"])
        stood_in = False
        try:
            module = model.get_submodule(target)
        except AttributeError:  # the traced model had a module this one lacks (e.g. BERT's pooler)
            module, stood_in = _stand_in(target, shapes[0], ast.literal_eval(str(row["output_shape"]))), True
        ids = isinstance(module, torch.nn.Embedding)
        inputs = [torch.empty(s, dtype=torch.long if ids else torch.float32, device="meta") for s in shapes]
        nodes = _aten(module, inputs)
        if stood_in:
            for n in nodes:
                n.note = (
                    f"module {target} not in the model of the config: a {type(module).__name__} stands in"
                )
        return nodes
    tensors = [torch.empty(s, device="meta") for s in shapes if s != (1,)]  # (1,): a Python scalar
    if name in ("contiguous", "reshape") and "False" in str(row.get("input_contiguous")):
        return _aten(lambda x: x.clone(), tensors[:1])  # a strided tensor made contiguous: a copy
    if name in ("to", "type", "type_as", "long", "float", "bool") and tensors:
        source = _DTYPES.get(str(dtypes.get(_first_input(row) or "")), torch.float32)
        return _aten(lambda x: x.to(out_dtype), [tensors[0].to(source)]) if source != out_dtype else []
    if name in ("full", "ones", "zeros", "arange", "tensor"):
        out = ast.literal_eval(str(row["output_shape"]))
        return _aten(lambda: torch.ones(out, device="meta"), [])  # a fill kernel
    if name in _NO_KERNEL or not tensors:
        return []
    for position, dtype in _INPUT_DTYPES.get(name, ()):
        if position < len(tensors):
            tensors[position] = tensors[position].to(dtype)
    fn = _function(name, len(tensors))
    if fn is not None:
        return _aten(fn, tensors)
    nodes = _aten(lambda x: x.clone(), tensors[:1])  # not modelled: one pass over the input, flagged
    for n in nodes:
        n.note = f"trace op {name!r} approximated by a copy of its input"
    return nodes


# Inputs that are masks or ids in the model (the trace records shapes, not dtypes).
_INPUT_DTYPES = {"where": [(0, torch.bool)], "masked_fill": [(1, torch.bool)],
                 "masked_fill_": [(1, torch.bool)], "embedding": [(0, torch.long)]}  # fmt: skip


def _stand_in(target: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> torch.nn.Module:
    """A module of the kind ``target``'s name and shapes say it is."""
    name = target.rsplit(".", 1)[-1].lower()
    with torch.device("meta"):
        if "norm" in name:
            return torch.nn.LayerNorm(in_shape[-1])
        if "dropout" in name:
            return torch.nn.Dropout().eval()
        if "activation" in name or name == "act":
            return torch.nn.Tanh()
        return torch.nn.Linear(in_shape[-1], out_shape[-1])


def _function(name: str, tensors: int) -> Callable[..., Any] | None:
    if name in _BINARY:
        op = _BINARY[name]
        # A scalar operand (a Python number or a 0-d tensor in the model) as a 0-d tensor: a broadcast
        # read of one element, for every binary op alike.
        return (lambda x, y: op(x, y)) if tensors > 1 else (lambda x: op(x, torch.tensor(2.0, device="meta")))
    if name in _UNARY:
        return _UNARY[name]
    if name in ("matmul", "bmm"):
        return torch.matmul
    if name in ("addmm", "baddbmm"):
        return lambda bias, a, b: bias + torch.matmul(a, b) if a.dim() > 2 else torch.addmm(bias, a, b)
    if name == "where":
        return lambda c, x, *y: torch.where(c, x, y[0] if y else 0.0)
    if name in ("masked_fill", "masked_fill_") and tensors > 1:
        return lambda x, mask: x.masked_fill(mask, 0.0)
    if name == "embedding":
        return lambda ids, weight: F.embedding(ids, weight)
    return None


def _aten(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> list[NodeCost]:
    """Annotated ATen nodes that launch kernels when ``fn`` runs on ``inputs`` (meta tensors)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcost.passes import annotate

    with torch.no_grad():
        gm = make_fx(fn)(*inputs)
    annotate.run(gm, "fw")
    return [n.meta[META_KEY] for n in gm.graph.nodes if META_KEY in n.meta and n.meta[META_KEY].has_kernel]


def _share(nodes: list[NodeCost], measured_ms: float, device: str) -> None:
    """Split a trace row's measured time over its kernel nodes by their roofline time on ``device``."""
    if not nodes:
        return
    from fxcost.cost_models import NodeBatch
    from fxcost.cost_models.roofline import Roofline

    weights = Roofline().predict(NodeBatch.of(nodes), get_device(device))
    total = float(weights.sum())
    for node, weight in zip(nodes, weights.tolist(), strict=True):
        share = weight / total if total > 0 and math.isfinite(total) else 1 / len(nodes)
        node.origin_ms = measured_ms * share


def _name(row: pd.Series) -> str:
    target = str(row["target"])
    match = re.search(r"(?:method|function) (\w+)", target)
    return match.group(1) if match else target.rsplit(".", 1)[-1]


def _first_input(row: pd.Series) -> str | None:
    names = re.findall(r"(\w+):", str(row["_input_nodes"]))
    return names[0] if names else None
