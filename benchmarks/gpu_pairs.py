"""Cross-GPU accuracy on traces recorded on real GPUs (issue 10): each GPU's trace predicts the others.

Reads what ``record_gpu_traces.py`` wrote (``DIR/<gpu>/<case>-<precision>.{json.gz,meta.json}``). For
every case and precision recorded on two or more GPUs, and each ordered pair of them:

- ``runtime``: the origin GPU's trace predicts the target's eager step (kernel-alike nodes
  wave-scaled from their recorded kernel times, the rest scaled by the heads' ratio, run through the
  eager pipeline with the host time per op the origin's measured step implies; ``report.eager_ms``),
  against the target's measured step. This is what a user gets.
- ``same host``: the same GPU predictions, with the host time per op the *target's* step implies.
  The lent H100 and H200 sit in different machines whose hosts issue ops at different speeds
  (24 us against 4-8 us of launch overhead per op); this figure shows the GPU side of the prediction
  in step terms, as if both GPUs had one host. It uses the target's measurement and is no prediction.
- ``GPU time``: the predicted kernel time of the whole step against the target's recorded kernel
  time: the part of the step fxcost models from GPU specifications.
- ``origin-free``: the same graph with its measurements set aside, predicted from spec sheets and the
  heads alone, against the measured step on each GPU; ``OF GPU err%``: its predicted kernel time
  against the target's recorded kernel time (the GPU side of the origin-free prediction).
- per op class, for the bf16 steps' GEMMs, batched GEMMs and convolutions: the median and summed
  error of each node's origin-free kernel time against its recorded kernel time.
- capture fidelity: the origin's recorded kernel time over its measured step (1.0: the GPU was busy
  for the whole step; far less: the host bounds the step), and the isolated event-timed node times
  over the step (each includes a launch overhead the eager step hides).

    python benchmarks/gpu_pairs.py [--fixtures benchmarks/fixtures/gpu] [--check]

``--check`` fails (exit 1) when a figure is worse than :data:`LIMITS`, the guard CI runs.
Last line: ``mape_runtime_<o>_to_<d>=..`` per ordered GPU pair (e.g. ``mape_runtime_h100_to_h200``),
then ``mape_runtime_fp32 mape_runtime_bf16 mape_same_host_fp32 mape_same_host_bf16 mape_gpu_fp32
mape_gpu_bf16 mape_origin_free mape_origin_free_gpu_fp32 mape_origin_free_gpu_bf16 fidelity_mape
traces``. Without traces it says so and prints ``traces=0``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from fxcost.cost_models.eager import hidden_overhead_ms, kernel_ms
from fxcost.gpus import get_device
from fxcost.records import NodeCost
from fxcost.report import Report

# The op classes of the per-node table of bf16 tensor-core work.
TENSOR_CLASSES = {"aten.mm.default": "GEMM", "aten.addmm.default": "GEMM", "aten.bmm.default": "bmm",
                  "aten.baddbmm.default": "bmm", "aten.convolution.default": "conv",
                  "aten.convolution_backward.default": "conv"}  # fmt: skip

# What --check allows: the figures measured when the fixtures were recorded, with some room.
LIMITS = {
    "mape_gpu_fp32": 6.0,
    "mape_gpu_bf16": 8.0,
    "mape_same_host_fp32": 12.0,
    "mape_same_host_bf16": 15.0,
}


def load(fixtures: Path) -> dict[tuple[str, str], dict[str, tuple[dict[str, Any], Path]]]:
    """(case, precision) -> {canonical GPU name: (meta, trace path)}."""
    found: dict[tuple[str, str], dict[str, tuple[dict[str, Any], Path]]] = defaultdict(dict)
    for meta_path in sorted(fixtures.glob("*/*.meta.json")):
        meta = json.loads(meta_path.read_text())
        gpu = get_device(meta["gpu"]).name
        found[meta["case"], meta["precision"]][gpu] = (meta, meta_path.parent / meta["trace"])
    return found


def slug(gpu: str) -> str:
    """``H100-SXM`` -> ``h100``: the summary's short GPU names."""
    return gpu.split("-")[0].lower()


def origin_free(report: Report) -> Report:
    """The report as if captured without a GPU: no origin, no measured times."""
    blind = copy.deepcopy(report)
    blind.origin = "cpu"
    blind.step_ms = None
    for n in blind.nodes:
        n.origin_ms = None
        n.kernels = []
    return blind


def gpu_ms(report: Report, device: str) -> float:
    """The predicted kernel time of the step on ``device`` (``report`` predicted for it)."""
    target = get_device(device)
    hidden = hidden_overhead_ms(target)
    return sum(
        kernel_ms(n.pred_ms[target.name], n.pred_source.get(target.name), target, hidden)
        for n in report.nodes
        if n.has_kernel and n.pred_ms.get(target.name) is not None
    )


def recorded_gpu_ms(report: Report) -> float:
    """The kernel time the origin's profiler recorded for the step."""
    return sum(n.kernel_ms or 0.0 for n in report.nodes)


def node_kernel_ms(report: Report, device: str) -> list[tuple[NodeCost, float]]:
    """Each kernel-launching node of ``report`` (predicted for ``device``) with its predicted kernel time."""
    target = get_device(device)
    hidden = hidden_overhead_ms(target)
    return [
        (n, kernel_ms(n.pred_ms[target.name], n.pred_source.get(target.name), target, hidden))  # type: ignore[arg-type]
        for n in report.nodes
        if n.has_kernel and n.pred_ms.get(target.name) is not None
    ]


def class_table(rows: dict[str, list[tuple[float, float]]]) -> list[str]:
    """Lines of the per-class table: nodes, median and summed error of predicted against recorded."""
    lines = [f"  {'class':6s} {'nodes':>6s} {'median err%':>11s} {'recorded ms':>11s} {'predicted ms':>12s} "
             f"{'sum err%':>9s}"]  # fmt: skip
    for name, pairs in sorted(rows.items()):
        median = statistics.median(_pct(p, r) for p, r in pairs)
        predicted, recorded = sum(p for p, _ in pairs), sum(r for _, r in pairs)
        lines.append(f"  {name:6s} {len(pairs):6d} {median:+11.1f} {recorded:11.2f} {predicted:12.2f} "
                     f"{_pct(predicted, recorded):+9.1f}")  # fmt: skip
    return lines


def _pct(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, default=Path(__file__).parent / "fixtures" / "gpu")
    parser.add_argument("--check", action="store_true", help="exit 1 when a figure is worse than LIMITS")
    args = parser.parse_args(argv)
    runs = load(args.fixtures)
    traces = sum(len(gpus) for gpus in runs.values())
    if not traces:
        print(f"no GPU traces under {args.fixtures} (record them with benchmarks/record_gpu_traces.py)")
        print("traces=0")
        return 0

    errors: dict[str, list[float]] = defaultdict(list)
    columns = ("measured", "runtime", "err%", "same host", "err%", "GPU err%", "origin-free", "err%",
               "OF GPU err%")  # fmt: skip
    header = " ".join(f"{c:>11s}" if c in ("origin-free", "OF GPU err%") else f"{c:>9s}" for c in columns)
    tensor_rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    print(f"{'case':20s} {'prec':4s} {'origin':>6s} {'target':>6s} {header}")
    fidelity_rows = []
    for (case, precision), gpus in sorted(runs.items()):
        reports = {gpu: Report.load(path) for gpu, (_, path) in gpus.items()}
        for target, (meta, _) in gpus.items():
            measured = float(meta["step_ms"])
            truth = reports[target]
            recorded = recorded_gpu_ms(truth)  # 0 for a trace recorded without the profiler
            target_host_ms = truth.pipeline().host_ms
            busy, isolated = recorded / measured, (truth.origin_ms() or 0.0) / measured
            fidelity_rows.append((case, precision, slug(target), measured, busy, isolated))
            errors["fidelity"].append(abs(busy - 1) * 100)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                blind = origin_free(truth).predict([target])
                blind_ms = blind.eager_ms(target)
            blind_error = _pct(blind_ms, measured)
            errors["origin_free"].append(abs(blind_error))
            blind_gpu_error = _pct(gpu_ms(blind, target), recorded) if recorded else math.nan
            if recorded:
                errors[f"origin_free_gpu_{precision}"].append(abs(blind_gpu_error))
            if precision == "bf16":
                timed = {(n.graph, n.name): n.kernel_ms for n in truth.nodes}
                for node, ms in node_kernel_ms(blind, target):
                    name, recorded_ms = TENSOR_CLASSES.get(node.op), timed.get((node.graph, node.name))
                    if name is not None and recorded_ms:
                        tensor_rows[name].append((ms, recorded_ms))
            for origin, report in reports.items():
                if origin == target:
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    predicted = report.predict([target])
                runtime = predicted.eager_ms(target)
                same_host = predicted.eager_ms(target, host_ms=target_host_ms)
                runtime_error, same_host_error = _pct(runtime, measured), _pct(same_host, measured)
                gpu_error = _pct(gpu_ms(predicted, target), recorded) if recorded else math.nan
                errors[f"runtime_{slug(origin)}_to_{slug(target)}"].append(abs(runtime_error))
                errors[f"runtime_{precision}"].append(abs(runtime_error))
                errors[f"same_host_{precision}"].append(abs(same_host_error))
                if recorded:
                    errors[f"gpu_{precision}"].append(abs(gpu_error))
                cells = (f"{measured:9.2f}", f"{runtime:9.2f}", f"{runtime_error:+9.1f}", f"{same_host:9.2f}",
                         f"{same_host_error:+9.1f}", f"{gpu_error:+9.1f}", f"{blind_ms:11.2f}",
                         f"{blind_error:+9.1f}", f"{blind_gpu_error:+11.1f}")  # fmt: skip
                print(f"{case:20s} {precision:4s} {slug(origin):>6s} {slug(target):>6s} " + " ".join(cells))

    print("\ncapture fidelity (recorded kernel time / measured step; isolated node times / step)")
    for case, precision, gpu, measured, busy, isolated in fidelity_rows:
        print(f"  {case:20s} {precision:4s} {gpu:>5s}  step {measured:8.2f} ms  kernels {busy:5.2f}  "
              f"isolated {isolated:5.2f}")  # fmt: skip

    if tensor_rows:
        print("\nbf16 tensor-core nodes: origin-free kernel time against the recorded one (all cases, GPUs)")
        print("\n".join(class_table(tensor_rows)))

    pairs = sorted(k for k in errors if k.startswith("runtime_") and "_to_" in k)
    names = [*pairs, "runtime_fp32", "runtime_bf16", "same_host_fp32", "same_host_bf16", "gpu_fp32",
             "gpu_bf16", "origin_free", "origin_free_gpu_fp32", "origin_free_gpu_bf16"]  # fmt: skip
    summary = {f"mape_{k}": statistics.mean(errors[k]) for k in names if errors[k]}
    summary["fidelity_mape"] = statistics.mean(errors["fidelity"])
    failed = [f"{k}={summary[k]:.2f} > {limit}" for k, limit in LIMITS.items() if summary.get(k, 0) > limit]
    if args.check and failed:
        print("cross-GPU accuracy regressed: " + ", ".join(failed))
    print(" ".join(f"{k}={v:.2f}" for k, v in summary.items()) + f" traces={traces}")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
