"""Readers for measurement directories in the layout of ``shared/data/neusight`` (see its README).

A directory holds ``ops/<op>/<Device>.csv`` (training configurations) and ``ops_test/<file>.csv``
(held-out configurations), one row per measured configuration with its latency in ms and the launch
configuration of its dominant kernel; ``models/<Device>/<run>.json`` holds end-to-end runs
(:func:`read_model_runs`). The readers return pandas frames with canonical device names
(``device``), the element count (``numel``) and the DRAM traffic of the kernel-alike ops (``bytes``).
pandas is needed here: ``pip install 'fxcost[df]'``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxcost.gpus import get_device
from fxcost.lowering.nodes import conv_node, gemm_node, synthetic_node
from fxcost.precision import itemsize
from fxcost.records import NodeCost

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ELEMENTWISE",
    "GEMM_COLUMNS",
    "KERNEL_ALIKE",
    "data_root",
    "kernel_alike_node",
    "op_class",
    "read_model_runs",
    "read_ops",
    "read_ops_test",
    "row_node",
]

# Op names used by the data set, with the number of [B, H] tensors the kernel reads and writes:
# binary ops read two and write one; unary ops and ops with a scalar operand ("u") read one.
ELEMENTWISE = {
    "add": 3, "mul": 3, "div": 3, "pow": 3,
    "addu": 2, "mulu": 2, "divu": 2, "powu": 2, "relu": 2, "gelu": 2, "tanh": 2,
}  # fmt: skip
KERNEL_ALIKE = {**ELEMENTWISE, "ln": 2, "softmax": 2}

_REQUIRED = ("OPName", "Latency", "Device")


def op_class(op: str) -> str:
    """``"ew"``, ``"ln"``, ``"softmax"`` or the op itself (``"linear"``, ``"bmm"``, ``"conv"``)."""
    return "ew" if op in ELEMENTWISE else op


def read_ops(data: str | Path, ops: Iterable[str]) -> pd.DataFrame:
    """Training rows of ``ops`` from ``<data>/neusight/ops/<op>/*.csv`` (or ``<data>/ops/...``)."""
    root = _root(data)
    files = [f for op in ops for f in sorted((root / "ops" / op).glob("*.csv"))]
    return _read(files, root / "ops")


def read_ops_test(data: str | Path, files: Iterable[str]) -> pd.DataFrame:
    """Held-out rows from ``<data>/neusight/ops_test/<file>.csv``, duplicates across files dropped."""
    root = _root(data)
    frame = _read([root / "ops_test" / f"{name}.csv" for name in files], root / "ops_test")
    dims = [c for c in ("B", "H", "M", "N", "K") if c in frame.columns]
    return frame.drop_duplicates(["OPName", "device", *dims]).reset_index(drop=True)


def _root(data: str | Path, kinds: tuple[str, ...] = ("ops", "ops_test")) -> Path:
    data = Path(data)
    for root in (data / "neusight", data):
        if any((root / kind).is_dir() for kind in kinds):
            return root
    wanted = " or ".join(f"{kind}/" for kind in kinds)
    raise FileNotFoundError(f"{data}: no {wanted} directory (expected the shared/data layout)")


def data_root(data: str | Path) -> Path:
    """The directory of ``data`` that holds ``models/`` and ``model_configs/`` (``data/neusight`` in
    the shared layout, or ``data`` itself)."""
    return _root(data, ("models", "model_configs"))


_RUN = re.compile(r"^(?P<model>.+)-(?P<mode>train|inf)-(?P<seqlen>\d+)-(?P<batch>\d+)$")
# Multi-GPU runs and fused-kernel variants: not single-GPU eager iterations.
_NOT_SINGLE_GPU = ("-fusion", "-dp4", "-tp4", "-pp4")


def read_model_runs(data: str | Path, *, fusion: bool = False) -> pd.DataFrame:
    """One row per single-GPU end-to-end run in ``models/<Device>/<model>-<mode>-<seqlen>-<batch>.json``:
    ``device`` (the folder name), ``model``, ``mode`` (train or inf), ``seqlen``, ``batch``, the measured
    ``e2e``, ``fw`` and ``bw`` ms, and ``trace``, the per-node CSV beside it (None if there is none).
    ``fusion``: the fused-kernel runs (``...-<batch>-fusion.json``) instead of the eager ones."""
    import pandas as pd

    rows = []
    for path in sorted((data_root(data) / "models").glob("*/*.json")):
        stem = path.stem.removesuffix("-fusion") if fusion else path.stem
        match = _RUN.match(stem)
        if match is None or (stem == path.stem and fusion) or any(tag in stem for tag in _NOT_SINGLE_GPU):
            continue
        measured = json.loads(path.read_text())
        trace = path.with_suffix(".csv")
        rows.append({"device": path.parent.name, "model": match["model"], "mode": match["mode"],
                     "seqlen": int(match["seqlen"]), "batch": int(match["batch"]),
                     "e2e": measured["e2e_latency"], "fw": measured.get("fw_latency"),
                     "bw": measured.get("bwall_latency"),
                     "trace": trace if trace.exists() else None})  # fmt: skip
    return pd.DataFrame(rows)


def _read(files: list[Path], where: Path) -> pd.DataFrame:
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError("reading measurement data needs pandas: pip install 'fxcost[df]'") from e
    if not files:
        raise FileNotFoundError(f"{where}: no CSV files for the requested ops")
    frames = []
    for path in files:
        frame = pd.read_csv(path)
        missing = [c for c in _REQUIRED if c not in frame.columns]
        if missing:
            raise ValueError(f"{path}: missing columns {missing}; required: {list(_REQUIRED)}")
        if (frame["Latency"] <= 0).any():
            raise ValueError(
                f"{path}: non-positive latencies in rows {list(frame.index[frame['Latency'] <= 0])}"
            )
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    names = {name: get_device(name).name for name in out["Device"].unique()}
    out["device"] = out["Device"].map(names)
    if {"B", "H"} <= set(out.columns):
        out["numel"] = out["B"] * out["H"]
        operands = out["OPName"].map(KERNEL_ALIKE)
        # NaN for ops that are not kernel-alike; the data set is fp32 throughout (shared/data/README.md).
        out["bytes"] = out["numel"] * itemsize("float32") * operands
    return out


# Each data-set op as the ATen call PyTorch 2.1 makes for it on a [B, H] fp32 tensor: the ATen op,
# whether it takes a second [B, H] tensor (else a Python scalar), and its other outputs.
_ATEN = {
    "add": ("aten.add.Tensor", True), "mul": ("aten.mul.Tensor", True), "div": ("aten.div.Tensor", True),
    "pow": ("aten.pow.Tensor_Tensor", True), "addu": ("aten.add.Tensor", False),
    "mulu": ("aten.mul.Tensor", False), "divu": ("aten.div.Tensor", False),
    "powu": ("aten.pow.Tensor_Scalar", False), "relu": ("aten.relu.default", False),
    "gelu": ("aten.gelu.default", False), "tanh": ("aten.tanh.default", False),
    "ln": ("aten.native_layer_norm.default", False), "softmax": ("aten._softmax.default", False),
}  # fmt: skip


def kernel_alike_node(op: str, batch: int, hidden: int) -> NodeCost:
    """The annotated node a kernel-alike data-set row stands for (``op`` on a [B, H] fp32 tensor)."""
    aten_name, binary = _ATEN[op]
    x = (batch, hidden)
    if op == "ln":
        args: dict[str, Any] = {"normalized_shape": [hidden], "eps": 1e-5}
        return synthetic_node(aten_name, [x, (hidden,), (hidden,)], [x, (batch, 1), (batch, 1)], args)
    args = {"dim": -1, "half_to_float": False} if op == "softmax" else {}
    scalar = (2.0,) if op.endswith("u") else ()  # the "u" ops take a Python scalar operand
    return synthetic_node(aten_name, [x, x] if binary else [x], [x], args, scalar)


GEMM_COLUMNS = "B, M, N, K: B problems of an [M, N] input times an [N, K] matrix (N reduced)"
"""What the GEMM columns of the data set mean. The kernels the rows record say so: every row's grid
tiles an M x K output (``ampere_sgemm_128x64_tn`` over grid (ceil(K/128), ceil(M/64)), for one), and
so do the rows ``fxcost collect`` writes. A ``linear`` row is ``F.linear`` of a [B, M, N] input with a
[K, N] weight, a ``bmm`` row ``torch.bmm`` of [B, M, N] and [B, N, K]."""


def row_node(row: Any) -> NodeCost:
    """The node a data-set row measures (any op of the data set), with FLOPs and bytes counted."""
    op = row.OPName
    if op in KERNEL_ALIKE:
        return kernel_alike_node(op, int(row.B), int(row.H))
    if op in ("linear", "bmm"):
        # The data set's N is the reduced dimension and K the output's columns (GEMM_COLUMNS).
        return gemm_node(op, int(row.B), int(row.M), n=int(row.K), k=int(row.N))
    if op == "conv":
        return conv_node(int(row.B), int(row.Input_Channel), int(row.Output_Channel), int(row.Kernel_Szie),
                         int(row.Input_Size), int(row.Stride), int(row.Padding))  # fmt: skip
    raise ValueError(f"unknown data-set op {op!r}")
