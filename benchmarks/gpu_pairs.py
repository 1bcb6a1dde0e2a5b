"""Accuracy on traces recorded on real GPUs (issues 10, 20, 23): each recorded step predicted from
its graph alone, and each GPU's trace predicting the others.

Reads what ``record_gpu_traces.py`` wrote (``DIR/<gpu>/<case>-<precision>.{json.gz,meta.json}``, and the
compiled steps ``<case>-<precision>.<execution>.json``). Every step is classed by what bounds it, from
its recorded kernel time over its measured time (``busy``): the GPU (:data:`GPU_BOUND` to
:data:`MAX_BUSY`), the host (less), or ``differs`` (more: the captured graph is not the step that ran
eagerly). ``repeat%`` is how far its timing repeats: the two timed blocks, and a retiming on another
machine of the same kind (``<stem>.retime-<n>.json``). Tables:

- each recorded step, predicted ``origin-free``: its graph with the measurements set aside, predicted
  from spec sheets and the heads alone, against the measured step; ``GPU err%``: the predicted kernel
  time against the recorded kernel time (the GPU side of the prediction).
- runtime-based, for every case and precision recorded on two or more GPUs and each ordered pair:
  ``runtime``: the origin GPU's trace predicts the target's eager step (kernel-alike nodes
  wave-scaled from their recorded kernel times, the rest scaled by the heads' ratio, run through the
  eager pipeline with the host time per op the origin's measured step implies; ``report.eager_ms``).
  This is what a user gets. ``same host``: the same GPU predictions with the host time per op the
  *target's* step implies (the lent H100 and H200 sit in machines whose hosts issue ops at different
  speeds); it uses the target's measurement and is no prediction. ``GPU err%``: the predicted kernel
  time against the target's recorded kernel time.
- per op class, for the bf16 steps' GEMMs, batched GEMMs and convolutions: the median and summed
  error of each node's origin-free kernel time against its recorded kernel time.
- compiled steps (Inductor, default and max-autotune modes): the eager trace beside each, predicted
  origin-free in compiled mode (``report.compiled_ms``) and, for comparison, as an eager step.

    python benchmarks/gpu_pairs.py [--fixtures benchmarks/fixtures/gpu] [--check]

``--check`` fails (exit 1) when a figure is worse than :data:`LIMITS`, the guard CI runs.
Last line: ``mape_runtime_<o>_to_<d>=..`` per ordered GPU pair (e.g. ``mape_runtime_h100_to_h200``),
then ``mape_runtime_fp32 mape_runtime_bf16 mape_same_host_fp32 mape_same_host_bf16 mape_gpu_fp32
mape_gpu_bf16 mape_runtime_gpu_bound_<precision> mape_origin_free mape_origin_free_gpu_<precision>
mape_origin_free_gpu_bound mape_origin_free_gpu_bound_<precision> mape_origin_free_compiled
mape_origin_free_compiled_as_eager fidelity_mape coverage80_origin_free repeat_spread_gpu_bound traces``
(figures without rows left out; ``coverage80_origin_free``: the share of measured steps inside their
origin-free prediction's nominal 80% interval, marked ``!`` in the table where outside;
``coverage80_origin_free_gpu``: the share of recorded kernel times inside the interval of the
predicted kernel time, the part of a step the interval speaks for). Without
traces it says so and prints ``traces=0``.
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

from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.gpus import get_device
from fxcost.lowering.attention import ATTENTION_OPS
from fxcost.propagate.eager import eager_kernel_ms
from fxcost.records import NodeCost
from fxcost.report import Report

# The op classes of the per-node table of tensor-core work: GEMMs, batched GEMMs, convolutions, attention.
TENSOR_CLASSES = {"aten.mm.default": "GEMM", "aten.addmm.default": "GEMM", "aten.bmm.default": "bmm",
                  "aten.baddbmm.default": "bmm", "aten.convolution.default": "conv",
                  "aten.convolution_backward.default": "conv",
                  **{op: "SDPA" for op in ATTENTION_OPS}}  # fmt: skip

# A step is bound by the GPU when its recorded kernels fill this share of it; kernels past MAX_BUSY of
# the step mean the captured graph is not the step that ran (isolated kernels run up to ~25% longer
# than inside the step, with the L2 flushed before each).
GPU_BOUND, MAX_BUSY = 0.85, 1.25

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
        eager_kernel_ms(n, target, hidden) or 0.0  # a prediction there: never None
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
        (n, eager_kernel_ms(n, target, hidden) or 0.0)
        for n in report.nodes
        if n.has_kernel and n.pred_ms.get(target.name) is not None
    ]


def add_class_rows(
    rows: dict[str, list[tuple[float, float]]], truth: Report, blind: Report, target: str, precision: str
) -> None:
    """Append each tensor-core node of ``truth`` whose kernels were recorded, as (origin-free predicted,
    recorded) kernel ms, to ``rows`` under ``"<precision> <class>"`` (``blind``: ``truth`` predicted
    origin-free for ``target``)."""
    timed = {(n.graph, n.name): n.kernel_ms for n in truth.nodes}
    for node, ms in node_kernel_ms(blind, target):
        name, recorded_ms = TENSOR_CLASSES.get(node.op), timed.get((node.graph, node.name))
        if name is not None and recorded_ms:
            rows[f"{precision} {name}"].append((ms, recorded_ms))


def class_table(rows: dict[str, list[tuple[float, float]]]) -> list[str]:
    """Lines of the per-class table: nodes, the median and mean absolute error of predicted against
    recorded per node, and the error of their sums."""
    lines = [f"  {'class':10s} {'nodes':>6s} {'median err%':>11s} {'mean |err|%':>11s} {'recorded ms':>11s} "
             f"{'predicted ms':>12s} {'sum err%':>9s}"]  # fmt: skip
    for name, pairs in sorted(rows.items()):
        errors = [_pct(p, r) for p, r in pairs]
        median, mean_abs = statistics.median(errors), statistics.fmean(abs(e) for e in errors)
        predicted, recorded = sum(p for p, _ in pairs), sum(r for _, r in pairs)
        lines.append(f"  {name:10s} {len(pairs):6d} {median:+11.1f} {mean_abs:11.1f} {recorded:11.2f} "
                     f"{predicted:12.2f} {_pct(predicted, recorded):+9.1f}")  # fmt: skip
    return lines


def _pct(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100


def regime(busy: float) -> str:
    """What bounds a recorded eager step, from its recorded kernel time over its measured time: ``gpu``
    (the kernels fill the step), ``host`` (the GPU waits for the host), or ``differs`` (the kernels of the
    captured graph outlast the step: the graph is not what ran eagerly, e.g. attention captured as its
    math path where eager ran a fused kernel)."""
    if busy > MAX_BUSY:
        return "differs"
    return "gpu" if busy >= GPU_BOUND else "host"


def repeats(meta: dict[str, Any], folder: Path, stem: str) -> float | None:
    """How far the step's timing repeats, percent: the larger of the two timed blocks' disagreement and
    each later session's retiming against it (``<stem>.retime-<n>.json``); None where it was timed once."""
    timed = meta.get("timed")
    if not timed:
        return None
    spreads = [float(timed["spread_pct"])]
    for path in sorted(folder.glob(f"{stem}.retime-*.json")):
        again = json.loads(path.read_text())
        spreads += [float(again["spread_pct"]), abs(_pct(float(again["step_ms"]), float(timed["step_ms"])))]
    return max(spreads)


def compiled_rows(fixtures: Path) -> list[tuple[str, str, str, str, float, float, float]]:
    """(case, precision, execution, GPU, measured ms, origin-free predicted ms, eager predicted ms) of
    every compiled step recorded beside its eager trace."""
    rows = []
    for path in sorted(fixtures.glob("*/*.inductor*.json")):
        meta = json.loads(path.read_text())
        trace = path.parent / f"{meta['case']}-{meta['precision']}.json.gz"
        if not trace.exists():
            continue
        target = get_device(meta["gpu"]).name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            blind = origin_free(Report.load(trace)).predict([target])
        rows.append((meta["case"], meta["precision"], meta["execution"], target, float(meta["step_ms"]),
                     blind.compiled_ms(target), blind.eager_ms(target)))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, default=Path(__file__).parent / "fixtures" / "gpu")
    parser.add_argument("--check", action="store_true", help="exit 1 when a figure is worse than LIMITS")
    parser.add_argument("--classes-only", action="store_true",
                        help="only the per-class table of tensor-core nodes")  # fmt: skip
    args = parser.parse_args(argv)
    runs = load(args.fixtures)
    if args.classes_only:
        rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for (_, precision), gpus in sorted(runs.items()):
            for target, (_, path) in gpus.items():
                truth = Report.load(path)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    add_class_rows(rows, truth, origin_free(truth).predict([target]), target, precision)
        print("\n".join(class_table(rows)))
        return 0
    traces = sum(len(gpus) for gpus in runs.values())
    if not traces:
        print(f"no GPU traces under {args.fixtures} (record them with benchmarks/record_gpu_traces.py)")
        print("traces=0")
        return 0

    errors: dict[str, list[float]] = defaultdict(list)
    tensor_rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    print("each recorded step, predicted origin-free (from the graph and spec sheets alone)")
    print(f"  {'case':22s} {'prec':4s} {'gpu':>5s} {'measured':>9s} {'bound':>7s} {'busy':>5s} "
          f"{'repeat%':>7s} {'origin-free':>11s} {'err%':>7s} {'GPU err%':>8s}  80% interval")  # fmt: skip
    pair_lines = []
    for (case, precision), gpus in sorted(runs.items()):
        reports = {gpu: Report.load(path) for gpu, (_, path) in gpus.items()}
        for target, (meta, path) in gpus.items():
            measured = float(meta["step_ms"])
            truth = reports[target]
            recorded = recorded_gpu_ms(truth)  # 0 for a trace recorded without the profiler
            busy = recorded / measured
            bound = regime(busy) if recorded else "?"
            spread = repeats(meta, path.parent, f"{case}-{precision}")
            errors["fidelity"].append(abs(busy - 1) * 100)
            if bound == "gpu" and spread is not None:
                errors["repeat_spread_gpu_bound"].append(spread)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                blind = origin_free(truth).predict([target])
            eager, kernel, total = blind.eager_ms(target), gpu_ms(blind, target), blind.total_ms(target)
            blind_error = _pct(eager, measured)
            # The isolated sum's interval, scaled as the step (Report.eager_interval_ms) and the kernels.
            interval = blind.interval_ms(target)
            low, high = (eager / total * b for b in interval)
            errors["interval"].append(float(low <= measured <= high))
            blind_gpu_error = _pct(kernel, recorded) if recorded else math.nan
            errors["origin_free"].append(abs(blind_error))
            if recorded:
                errors["interval_gpu"].append(
                    float(kernel * interval[0] <= recorded * total <= kernel * interval[1])
                )
                errors[f"origin_free_gpu_{precision}"].append(abs(blind_gpu_error))
            if bound == "gpu":
                errors["origin_free_gpu_bound"].append(abs(blind_error))
                errors[f"origin_free_gpu_bound_{precision}"].append(abs(blind_error))
            add_class_rows(tensor_rows, truth, blind, target, precision)
            print(f"  {case:22s} {precision:4s} {slug(target):>5s} {measured:9.2f} {bound:>7s} {busy:5.2f} "
                  f"{'-' if spread is None else f'{spread:.2f}':>7s} {eager:11.2f} "
                  f"{blind_error:+7.1f} {blind_gpu_error:+8.1f}  {low:.2f}-{high:.2f}"
                  f"{'' if low <= measured <= high else ' !'}")  # fmt: skip
            target_host_ms = truth.pipeline().host_ms
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
                if bound == "gpu":
                    errors[f"runtime_gpu_bound_{precision}"].append(abs(runtime_error))
                if recorded:
                    errors[f"gpu_{precision}"].append(abs(gpu_error))
                cells = (f"{measured:9.2f}", f"{runtime:9.2f}", f"{runtime_error:+9.1f}", f"{same_host:9.2f}",
                         f"{same_host_error:+9.1f}", f"{gpu_error:+9.1f}")  # fmt: skip
                pair_lines.append(f"  {case:22s} {precision:4s} {slug(origin):>6s} {slug(target):>6s} "
                                  f"{bound:>7s} " + " ".join(cells))  # fmt: skip

    print(f"\nruntime-based: each GPU's trace predicts the other's step (bound by the GPU: "
          f"{GPU_BOUND:.2f} <= busy <= {MAX_BUSY:.2f})")  # fmt: skip
    columns = ("measured", "runtime", "err%", "same host", "err%", "GPU err%")
    print(f"  {'case':22s} {'prec':4s} {'origin':>6s} {'target':>6s} {'bound':>7s} "
          + " ".join(f"{c:>9s}" for c in columns))  # fmt: skip
    print("\n".join(pair_lines))

    if tensor_rows:
        print("\ntensor-core work: each node's origin-free kernel time against its recorded one")
        print("\n".join(class_table(tensor_rows)))

    compiled = compiled_rows(args.fixtures)
    if compiled:
        print("\ncompiled steps (Inductor) predicted origin-free in compiled mode, against the measured step")
        print(f"  {'case':22s} {'prec':4s} {'execution':22s} {'gpu':>5s} {'measured':>9s} {'compiled':>9s} "
              f"{'err%':>7s} {'eager':>9s} {'err%':>7s}")  # fmt: skip
        for case, precision, execution, gpu, measured, compiled_ms, eager in compiled:
            error = _pct(compiled_ms, measured)
            errors["origin_free_compiled"].append(abs(error))
            errors["origin_free_compiled_as_eager"].append(abs(_pct(eager, measured)))
            print(f"  {case:22s} {precision:4s} {execution:22s} {slug(gpu):>5s} {measured:9.2f} "
                  f"{compiled_ms:9.2f} {error:+7.1f} {eager:9.2f} {_pct(eager, measured):+7.1f}")  # fmt: skip

    pairs = sorted(k for k in errors if k.startswith("runtime_") and "_to_" in k)
    names = [*pairs, "runtime_fp32", "runtime_bf16", "same_host_fp32", "same_host_bf16", "gpu_fp32",
             "gpu_bf16", "runtime_gpu_bound_fp32", "runtime_gpu_bound_bf16", "origin_free",
             "origin_free_gpu_fp32", "origin_free_gpu_bf16", "origin_free_gpu_bound",
             "origin_free_gpu_bound_fp32", "origin_free_gpu_bound_tf32", "origin_free_gpu_bound_bf16",
             "origin_free_compiled", "origin_free_compiled_as_eager"]  # fmt: skip
    summary = {f"mape_{k}": statistics.mean(errors[k]) for k in names if errors[k]}
    summary["fidelity_mape"] = statistics.mean(errors["fidelity"])
    summary["coverage80_origin_free"] = statistics.mean(errors["interval"])
    if errors["interval_gpu"]:
        summary["coverage80_origin_free_gpu"] = statistics.mean(errors["interval_gpu"])
    if errors["repeat_spread_gpu_bound"]:
        summary["repeat_spread_gpu_bound"] = max(errors["repeat_spread_gpu_bound"])
    failed = [f"{k}={summary[k]:.2f} > {limit}" for k, limit in LIMITS.items() if summary.get(k, 0) > limit]
    if args.check and failed:
        print("cross-GPU accuracy regressed: " + ", ".join(failed))
    print(" ".join(f"{k}={v:.2f}" for k, v in summary.items()) + f" traces={traces}")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
