"""Fused attention nodes of recorded GPU traces: origin-free per-node prediction against the kernels.

Loads every trace (``*.json.gz`` other than the compiled steps' kernel listings,
:meth:`fxcost.report.Report.load`) under a fixtures directory, and for
each SDPA node (forward and backward) whose kernels the origin's profiler timed, predicts it as if the
trace had been captured on a CPU (no origin, no measured times) on the GPU it was recorded on, and
compares the predicted kernel time (``kernel_ms`` of the prediction: the per-op overhead an eager step
hides taken off) with the recorded one (``NodeCost.kernel_ms``). It also prints the backend fxcost
chose for that GPU against the names of the kernels that ran. Recordings validate; nothing is fit on
them (DESIGN.md).

    python benchmarks/attention_nodes.py [--fixtures DIR] [--rows 20] [--sweeps [--sweep-rows]]

(``--fixtures`` defaults to ``benchmarks/fixtures/gpu``; ``--sweep-rows`` lists every sweep row with its
recorded and predicted TFLOP/s.)

With ``--sweeps`` it also reads the op sweeps ``collect`` recorded beside the traces
(``<gpu>/collect/[<precision>/]ops/sdpa{,_bwd}/*.csv``: one row per unmasked call without dropout,
its latency and kernel names) and predicts each row's call on the GPU of the row, as a capture on that
GPU would see it: the kernel the row ran where fxcost can price it, else the kernel the row's torch
would choose. One line per sweep file and ``sweep_median_err=.. sweep_sum_err=.. sweep_interval_coverage=..
sweep_bmm_interval_coverage=.. sweep_rows=N`` (coverage as the traces' below), printed
before the traces' lines.

Last line: ``sdpa_node_median_err=.. sdpa_sum_err=.. sdpa_interval_coverage=.. sdpa_bmm_interval_coverage=..
sdpa_nodes=N`` (percent, absolute per-node median; signed error of the summed kernel time; the share of
nodes whose recorded time lies inside their nominal 80% interval, and inside the ``bmm`` class's
interval alone, the one fused attention had before its own spread:
:func:`fxcost.cost_models.heads.intervals.node_bounds`).
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from fxcost.cost_models.attention import attention_kind, fused_attention_ms
from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads import default_heads
from fxcost.cost_models.heads.intervals import attention_high, node_bounds, shipped_intervals
from fxcost.gpus import Device, UnknownDeviceError, get_device
from fxcost.lowering.attention import (
    ATTENTION_OPS,
    AttentionCall,
    Backend,
    attention_call,
    attention_flops,
    choose_backend,
)
from fxcost.lowering.attention_kernels import fused_attention
from fxcost.propagate.eager import eager_kernel_ms
from fxcost.records import NodeCost
from fxcost.report import Report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, default=Path("benchmarks/fixtures/gpu"))
    parser.add_argument("--rows", type=int, default=20, help="node rows printed per trace")
    parser.add_argument("--device", help="predict on this GPU instead of each trace's origin (a CPU trace)")
    parser.add_argument("--sweeps", action="store_true", help="also compare the collect sweeps' SDPA rows")
    parser.add_argument("--sweep-rows", action="store_true", help="with --sweeps: every row and its TFLOP/s")
    args = parser.parse_args(argv)
    if args.sweeps:
        sweeps(args.fixtures, args.sweep_rows)
    errors: list[float] = []
    covered: list[bool] = []
    covered_bmm: list[bool] = []  # the baseline: the bmm class's interval alone
    predicted_sum = recorded_sum = 0.0
    traces = (p for p in args.fixtures.rglob("*.json.gz") if not p.name.endswith("-kernels.json.gz"))
    for path in sorted(traces):
        report = Report.load(path)
        try:
            target = get_device(args.device or report.origin)
        except UnknownDeviceError:
            print(f"{path.name}: origin {report.origin!r} is no known GPU; pass --device")
            continue
        sdpa = [i for i, n in enumerate(report.nodes) if n.op in ATTENTION_OPS and n.has_kernel]
        if not sdpa:
            continue
        blind = copy.deepcopy(report)
        blind.origin, blind.step_ms = "cpu", None
        for n in blind.nodes:
            n.origin_ms, n.kernels = None, []
        blind = blind.predict([target.name])
        print(f"\n{path.relative_to(args.fixtures)} on {target.name}: {len(sdpa)} SDPA nodes")
        print(f"  {'node':28s} {'phase':5s} {'shape (B,H,Sq,D)':22s} {'backend':9s} {'pred ms':>9s} "
              f"{'rec ms':>9s} {'err %':>7s}  kernels")  # fmt: skip
        for row, i in enumerate(sdpa):
            node, guess = report.nodes[i], blind.nodes[i]
            call = attention_call(guess)
            backend = choose_backend(call, target) if call is not None else "?"
            predicted = eager_kernel_ms(guess, target, hidden_overhead_ms(target))
            recorded = node.kernel_ms if args.device is None else None
            err = None
            if predicted is not None and recorded is not None:
                err = (predicted - recorded) / recorded * 100
                errors.append(abs(err))
                covered.append(_inside(guess, target, predicted, recorded))
                covered_bmm.append(_inside(guess, target, predicted, recorded, spread=False))
                predicted_sum += predicted
                recorded_sum += recorded
            if row < args.rows:
                shape = f"({call.batch},{call.heads},{call.sq},{call.d})" if call is not None else "?"
                names = ",".join(sorted({k.name[:40] for k in node.kernels})) or "-"
                print(f"  {node.name[:28]:28s} {node.phase:5s} {shape:22s} {backend:9s} "
                      f"{_fmt(predicted):>9s} {_fmt(recorded):>9s} {_fmt(err, 1):>7s}  {names}")  # fmt: skip
    median = statistics.median(errors) if errors else float("nan")
    total = (predicted_sum - recorded_sum) / recorded_sum * 100 if recorded_sum else float("nan")
    coverage, baseline = (statistics.fmean(c) if c else float("nan") for c in (covered, covered_bmm))
    print(f"sdpa_node_median_err={median:.1f} sdpa_sum_err={total:.1f} sdpa_interval_coverage={coverage:.2f} "
          f"sdpa_bmm_interval_coverage={baseline:.2f} sdpa_nodes={len(errors)}")  # fmt: skip
    return 0


def _inside(
    node: NodeCost, device: Device, kernel_ms: float, recorded_ms: float, spread: bool = True
) -> bool:
    """Whether ``recorded_ms`` lies inside the nominal 80% interval of ``node``'s predicted kernel time
    ``kernel_ms`` on ``device``: the node's interval (:func:`node_bounds`, the op timed alone) less
    the overhead its kernel time leaves out. ``spread=False``: the ``bmm`` class's interval alone,
    without the fused kernel's own spread (the interval before it had one)."""
    name = device.name
    ms = node.pred_ms[name] or 0.0
    sources = [node.pred_source.get(name)]
    low, high = node_bounds([node], np.array([ms]), sources, device=device if spread else None)
    return bool(low[0] - ms + kernel_ms <= recorded_ms <= high[0] - ms + kernel_ms)


def _recorded(kernels: str) -> Backend | None:
    """The backend a sweep row's kernel names show (None: one fxcost does not read)."""
    if "cudnn_generated" in kernels or "sdpa_sm90" in kernels:
        return "cudnn"
    if "fmha_cutlass" in kernels:
        return "efficient"
    if "flash_fwd" in kernels or "flash_bwd" in kernels:
        return "flash"
    return None


def sweep_call(row: dict[str, str]) -> AttentionCall:
    """The call of one sweep row (``B, H, S_q, S_k, D, causal``; ``Precision`` bf16, else fp32)."""
    b, h, sq, sk, d = (int(row[k]) for k in ("B", "H", "S_q", "S_k", "D"))
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(row.get("Precision") or "fp32", "float32")
    kernels = f"{row.get('Kernel Name', '')};{row.get('Kernels', '')}"
    return AttentionCall(b, h, h, sq, sk, d, d, dtype, row["causal"] in ("1", "True", "true"), False, 0.0,
                         row["OPName"].endswith("_bwd"), _recorded(kernels))  # fmt: skip


def sweeps(fixtures: Path, every_row: bool = False) -> None:
    """Print predicted against recorded latency of every SDPA sweep row under ``fixtures``; with
    ``every_row``, each row too (sorted by its recorded rate; FLOPs as fxcost counts them,
    :func:`fxcost.lowering.attention.attention_flops`: a causal call's half)."""
    heads = default_heads()
    errors: list[float] = []
    inside: list[tuple[bool, bool]] = []  # (in the interval, in the bmm class's alone)
    intervals = shipped_intervals()
    low_q, high_q = intervals.quantiles["bmm"] if intervals is not None else (0.0, 0.0)
    predicted_sum = recorded_sum = 0.0
    for path in sorted(fixtures.rglob("ops/sdpa*/*.csv")):
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        file_errors: list[float] = []
        listed: list[tuple[float, AttentionCall, Backend, float, float]] = []
        for row in rows:
            try:
                device = get_device(row["Device"])
            except UnknownDeviceError:
                continue
            call = sweep_call(row)
            backend = choose_backend(call, device, row.get("Torch Version", "").lstrip("p") or None)
            if backend == "math":
                continue
            sustained = heads.tiled.sustained_tflops(device, attention_kind(call))
            fused = fused_attention(call, backend)
            ms = fused_attention_ms(call, fused, device, sustained)
            serial = fused_attention_ms(call, fused, device, sustained, serial=True)
            recorded = float(row["Latency"])
            if ms is None or serial is None or recorded <= 0:
                continue
            low, bmm_high = ms * math.exp(low_q), ms * math.exp(high_q)
            high = ms * attention_high(math.exp(high_q), ms, serial - ms)
            inside.append((low <= recorded <= high, low <= recorded <= bmm_high))
            file_errors.append((ms - recorded) / recorded * 100)
            predicted_sum += ms
            recorded_sum += recorded
            listed.append((_flops(call) / recorded / 1e9, call, backend, recorded, ms))
        errors += [abs(e) for e in file_errors]
        if every_row and listed:
            print(f"  {'B*H':>5s} {'S_q':>5s} {'S_k':>5s} {'D':>4s} causal {'backend':9s} {'rec ms':>8s} "
                  f"{'pred ms':>8s} {'rec TF/s':>8s} {'pred TF/s':>9s}")  # fmt: skip
            for rate, c, chosen, recorded, ms in sorted(listed, key=lambda x: x[0]):
                shape = f"{c.batch * c.heads:5d} {c.sq:5d} {c.sk:5d} {c.d:4d} {int(c.causal):6d}"
                predicted_rate = _flops(c) / ms / 1e9
                print(f"  {shape} {chosen:9s} {recorded:8.3f} {ms:8.3f} {rate:8.0f} {predicted_rate:9.0f}")
        if file_errors:
            print(f"sweep {path.relative_to(fixtures)}: rows={len(file_errors)} "
                  f"median_err={statistics.median(abs(e) for e in file_errors):.1f} "
                  f"median_signed={statistics.median(file_errors):.1f} "
                  f"range={min(file_errors):.1f}..{max(file_errors):.1f}")  # fmt: skip
    median = statistics.median(errors) if errors else float("nan")
    total = (predicted_sum - recorded_sum) / recorded_sum * 100 if recorded_sum else float("nan")
    coverage, baseline = (statistics.fmean(c[k] for c in inside) if inside else float("nan") for k in (0, 1))
    print(f"sweep_median_err={median:.1f} sweep_sum_err={total:.1f} sweep_interval_coverage={coverage:.2f} "
          f"sweep_bmm_interval_coverage={baseline:.2f} sweep_rows={len(errors)}")  # fmt: skip


def _flops(call: AttentionCall) -> int:
    q = (call.batch, call.heads, call.sq, call.d)
    k, v = (call.batch, call.kv_heads, call.sk, call.d), (call.batch, call.kv_heads, call.sk, call.dv)
    return attention_flops(q, k, v, call.causal, call.backward)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
