"""Readers for measurement directories in the layout of ``shared/data/neusight`` (see its README).

A directory holds ``ops/<op>/<Device>.csv`` (training configurations) and ``ops_test/<file>.csv``
(held-out configurations), one row per measured configuration with its latency in ms and the launch
configuration of its dominant kernel. The readers return pandas frames with canonical device names
(``device``), the element count (``numel``) and the DRAM traffic of the kernel-alike ops (``bytes``).
pandas is needed here: ``pip install 'fxcost[df]'``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fxcost.devices import get_device

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ELEMENTWISE", "KERNEL_ALIKE", "read_ops", "read_ops_test"]

# Op names used by the data set, with the number of [B, H] tensors the kernel reads and writes:
# binary ops read two and write one; unary ops and ops with a scalar operand ("u") read one.
ELEMENTWISE = {
    "add": 3, "mul": 3, "div": 3, "pow": 3,
    "addu": 2, "mulu": 2, "divu": 2, "powu": 2, "relu": 2, "gelu": 2, "tanh": 2,
}  # fmt: skip
KERNEL_ALIKE = {**ELEMENTWISE, "ln": 2, "softmax": 2}
# The data set is fp32 throughout (shared/data/README.md).
ITEMSIZE = 4

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


def _root(data: str | Path) -> Path:
    data = Path(data)
    for root in (data / "neusight", data):
        if (root / "ops").is_dir() or (root / "ops_test").is_dir():
            return root
    raise FileNotFoundError(f"{data}: no ops/ or ops_test/ directory (expected the shared/data layout)")


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
        out["bytes"] = out["numel"] * ITEMSIZE * operands  # NaN for ops that are not kernel-alike
    return out
