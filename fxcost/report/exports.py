"""A report as tables and timelines for other tools: pandas, CSV, and a Chrome trace for Perfetto.

(The ONNX graph for Netron is :mod:`fxcost.report.onnx_export`.)
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fxcost.records import NodeCost

if TYPE_CHECKING:
    import pandas as pd

    from fxcost.report.trace import Report

__all__ = ["chrome_trace", "csv_text", "dataframe"]


def dataframe(report: Report) -> pd.DataFrame:
    """One row per node: its record's fields, with one ``pred_ms[<device>]`` column per device."""
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError("Report.to_dataframe needs pandas: pip install 'fxcost[df]'") from e
    return pd.DataFrame([_row(n, report.devices) for n in report.nodes])


def csv_text(report: Report, devices: Sequence[str]) -> str:
    """The rows of :func:`dataframe` as CSV, with ``pred_ms[<device>]`` columns for ``devices``."""
    # A blank record gives the header, so an empty report still names its columns.
    columns = list(_row(NodeCost(name="", op="", phase="fw"), devices))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for n in report.nodes:
        row = _row(n, devices)
        writer.writerow(
            {k: json.dumps(v) if isinstance(v, list | tuple | dict) else v for k, v in row.items()}
        )
    return out.getvalue()


def chrome_trace(report: Report, device: str, host_ms: float | None = None) -> dict[str, Any]:
    """The predicted eager step on ``device`` as a Chrome trace (open in Perfetto or chrome://tracing):
    one track for the host issuing ops, one for the GPU stream running them, microseconds."""
    spans = report.timeline(device, host_ms=host_ms)
    issue_ms = spans[0].issued_ms if spans else 0.0  # every op takes the host as long as the first
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"fxcost prediction: {device}"}},
        {"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "host (issue)"}},
        {"ph": "M", "pid": 0, "tid": 1, "name": "thread_name", "args": {"name": "GPU stream"}},
    ]
    for span in spans:
        n = span.node
        label = n.op.removeprefix("aten.").removesuffix(".default")
        args = {"node": n.name, "module": n.module, "phase": n.phase, "model": n.pred_source.get(device),
                "flops": n.flops, "bytes": n.bytes, "shapes": str(n.in_shapes)}  # fmt: skip
        events.append({"ph": "X", "pid": 0, "tid": 0, "name": label, "cat": n.phase,
                       "ts": (span.issued_ms - issue_ms) * 1e3, "dur": issue_ms * 1e3})  # fmt: skip
        events.append({"ph": "X", "pid": 0, "tid": 1, "name": label, "cat": n.phase, "args": args,
                       "ts": span.start_ms * 1e3, "dur": (span.end_ms - span.start_ms) * 1e3})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _row(n: NodeCost, devices: Sequence[str]) -> dict[str, Any]:
    """A node as a table row: its record's fields without kernels, plus ``bytes`` and one
    ``pred_ms[<device>]`` per device."""
    row = n.to_json()
    del row["kernels"], row["pred_ms"], row["pred_source"]
    row["bytes"] = n.bytes
    for device in devices:
        row[f"pred_ms[{device}]"] = n.pred_ms.get(device)
    return row
