"""What a printout says before its tables: the step captured (model, batch, sequence length,
precision, execution mode), its origin, the routing a mixture-of-experts model was captured under, and
where each GPU's predictions come from.

The *origin* is the device the step was captured on, and timed on if it was measured. A GPU origin's
times are scaled to other GPUs (runtime-based prediction); a CPU's never are: GPUs are then predicted
origin-free, from the graph alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from fxcost.cost_models.heads import measured_in_training, unlike_training
from fxcost.execution import check_execution
from fxcost.gpus import Device, UnknownDeviceError, get_device
from fxcost.lowering.flops import is_matmul_class
from fxcost.precision import HALF_DTYPES, is_float
from fxcost.records import NodeCost

if TYPE_CHECKING:
    from fxcost.report.trace import Report

__all__ = [
    "EXECUTION_TEXT",
    "captured_precision",
    "header_lines",
    "origin_gpu",
    "origin_name",
    "spec_sheet_only",
]

_SOURCES = {
    "mlp": "MLP heads",
    "mlp_ratio": "heads' ratio x measured",
    "wave_scaling": "wave scaling",
    "roofline": "roofline fallback",
}
_SHORT_NAMES = {"bfloat16": "bf16", "float16": "fp16"}
EXECUTION_TEXT = {
    "eager": "eager (op by op, no torch.compile fusion)",
    "compiled": "compiled (torch.compile with Inductor: fused kernels; the eager step beside it)",
    "cudagraphs": "CUDA graphs (the eager kernels without host gaps)",
}


def header_lines(report: Report) -> list[str]:
    """What a printout of ``report`` starts with: the step (model, batch, sequence length, precision,
    execution mode), its origin, and which models predicted each GPU."""
    phases = report.phases()
    step = "training step (" + " + ".join(phases) + ")" if "bw" in phases else "forward only (inference)"
    facts = [step, f"batch {report.batch}" if report.batch is not None else "batch unknown"]
    if report.seqlen is not None:
        facts.append(f"sequence length {report.seqlen}")
    facts += [captured_precision(report.nodes), EXECUTION_TEXT[check_execution(report.execution)]]
    lines = [f"{report.name or 'model'}: {', '.join(facts)}", _origin_line(report)]
    if report.routing:
        lines.append(
            f"mixture-of-experts routing assumed (meta tensors carry no token values): {report.routing}"
        )
    if report.devices:
        lines.append(_sources_line(report))
    unmeasured = [d for d in report.devices if _known(d) and spec_sheet_only(report, get_device(d))
                  and not unlike_training(get_device(d))]  # fmt: skip
    if unmeasured:  # (a GPU unlike every training GPU has its own caveat line)
        lines.append(
            f"never measured for the heads' fit: {', '.join(unmeasured)}; predicted from spec sheets "
            "(the totals' 80% interval is how far that has been off on GPUs left out of the fit)"
        )
    if report.execution == "eager" and any(n.op == MATH_ATTENTION for n in report.nodes):
        lines.append(MATH_ATTENTION_CAVEAT)
    return lines


MATH_ATTENTION = "aten._safe_softmax.default"
"""The softmax only ``scaled_dot_product_attention``'s math path runs: its presence means an SDPA call
was captured as matmuls and a softmax through memory."""

MATH_ATTENTION_CAVEAT = (
    "attention was captured on SDPA's math path (bmm, _safe_softmax), as torch.compile runs it; an eager "
    "step on a GPU may run a fused kernel there instead (BERT-large on an H100: eager 1.5x faster than "
    "its compiled math path)"
)


def captured_precision(nodes: Iterable[NodeCost]) -> str:
    """The precision a captured step ran in, read from its records: ``"fp32"``, ``"fp32 (TF32
    allowed)"`` (fp32 matmuls or convolutions PyTorch let run on TF32 tensor cores at capture; see
    ``NodeCost.tf32``), ``"bf16 autocast"`` (half-precision matmuls among float32 tensors: autocast's
    mix), ``"bf16"`` (no float32 tensor at all), or ``"no floating-point tensors"``.

    Example:
        >>> captured_precision([NodeCost("mm", "aten.mm.default", "fw", in_dtypes=["float32"] * 2)])
        'fp32'
    """
    floats: set[str] = set()
    matmul_floats: set[str] | None = None  # None: the step has no matmul-class node
    tf32 = False
    for n in nodes:
        dtypes = {d for d in (*n.in_dtypes, *n.out_dtypes) if is_float(d)}
        floats |= dtypes
        if is_matmul_class(n.op):
            matmul_floats = (matmul_floats or set()) | dtypes
            tf32 = tf32 or n.tf32
    # The matmuls' dtype is the step's precision: autocast leaves the rest (norms, losses) in fp32.
    half = sorted((floats if matmul_floats is None else matmul_floats) & HALF_DTYPES)
    if half:
        names = "/".join(_SHORT_NAMES.get(d, d) for d in half)
        return f"{names} autocast" if "float32" in floats else names
    if "float32" in floats:
        return "fp32 (TF32 allowed)" if tf32 else "fp32"
    return ", ".join(sorted(floats)) or "no floating-point tensors"


def spec_sheet_only(report: Report, device: Device) -> bool:
    """Whether nothing measured informs ``report``'s predictions on ``device``: no training GPU
    resembles it, or the heads were never fit on it and no GPU origin was timed to scale from."""
    if unlike_training(device):
        return True
    timed_on_gpu = report.origin_device() is not None and report.origin_ms() is not None
    return not timed_on_gpu and not measured_in_training(device)


def _known(name: str) -> bool:
    """Whether this process knows GPU ``name`` (a loaded trace may name one it does not)."""
    try:
        get_device(name)
    except UnknownDeviceError:
        return False
    return True


def origin_gpu(report: Report) -> str | None:
    """The origin's canonical name if it is a GPU of the database (``H100-SXM``), else None."""
    device = report.origin_device()
    return None if device is None else device.name


def origin_name(report: Report) -> str:
    """The origin's canonical name if it is a GPU of the database, else as recorded (``cpu``)."""
    return origin_gpu(report) or report.origin


def _origin_line(report: Report) -> str:
    """Where the step was captured, what was timed there, and whether predictions use it."""
    measured = any(n.origin_ms is not None for n in report.nodes)
    gpu = origin_gpu(report)
    where = f"origin: {origin_name(report)} (where the step was captured)"
    if gpu is None and measured:
        return f"{where}; node times shown for reference: GPU predictions never use CPU times"
    if gpu is None:
        return f"{where}; nothing timed: GPU predictions are origin-free, never from CPU times"
    if measured:
        return f"{where}, each node timed there; other GPUs are predicted from those times"
    return f"{where}; nothing timed: GPU predictions are origin-free"


def _sources_line(report: Report) -> str:
    """The share of each GPU's predicted time that each cost model gave, and nodes left unpredicted."""
    kernels = [n for n in report.nodes if n.has_kernel]
    parts = {}
    for device in report.devices:
        time: dict[str, float] = {}
        for n in kernels:
            source = n.pred_source.get(device, "unsupported")
            time[source] = time.get(source, 0.0) + (n.pred_ms.get(device) or 0.0)
        total = sum(time.values()) or 1.0
        shares = sorted(time.items(), key=lambda item: -item[1])
        text = ", ".join(f"{_SOURCES.get(s, s)} {t / total:.0%}" for s, t in shares if s != "unsupported")
        missing = sum(n.pred_ms.get(device) is None for n in kernels)
        parts[device] = text + (f", {missing} kernel nodes unpredicted" if missing else "")
    head = f"predicted by {report.model} (share of predicted time)"
    if len(set(parts.values())) == 1:
        return f"{head}: {next(iter(parts.values()))} on every GPU"
    return f"{head}: " + "; ".join(f"{d}: {text}" for d, text in parts.items())
