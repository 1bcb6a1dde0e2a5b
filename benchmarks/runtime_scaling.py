"""Runtime-based prediction across GPUs: one GPU's per-node trace predicts another GPU's iteration.

For each (model, mode, seqlen, batch) measured on two or more GPUs, every GPU's NeuSight trace
(``DIR/models/<Device>/<run>.csv``, read by :func:`fxcost.data.neusight.read_trace`) is the origin for every
other GPU: kernel-alike nodes are wave-scaled from their measured time, kernel-varying ones scaled by
the MLP heads' ratio between the GPUs (the default ``auto`` policy with an origin). The prediction is
compared with the other GPU's measured ``e2e_latency``.

Two figures per pair: ``trace`` is the scaled nodes run as an eager pipeline (``report.eager_ms``);
``calibrated`` also uses the origin's own measured iteration time, scaling the prediction by
``e2e_origin / trace_origin`` (the trace times each node alone, which on some runs adds up to more or
less than the measured iteration). Both use only measurements from the origin GPU.

    python benchmarks/runtime_scaling.py --data ../shared/data [--out rows.csv]

Last line: ``mape_runtime=.. mape_runtime_calibrated=.. pairs=N``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import pandas as pd

from fxcost.data.datasets import read_model_runs
from fxcost.data.neusight import read_trace
from fxcost.gpus import get_device
from fxcost.report import Report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--out", help="write one row per (origin, target) pair to this CSV")
    args = parser.parse_args()
    start = time.perf_counter()
    runs = read_model_runs(args.data)
    runs = runs[runs["trace"].notna()]

    rows = []
    for key, group in runs.groupby(["model", "mode", "seqlen", "batch"], sort=True):
        if len(group) < 2:
            continue
        run = "-".join(map(str, key))
        traces: dict[str, tuple[Report, float]] = {}
        for path, origin_e2e in zip(group["trace"], group["e2e"], strict=True):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    report = read_trace(path)
            except Exception as e:  # a trace the adapter cannot lower: reported, not fatal
                print(f"skip {path.parent.name}/{path.name}: {type(e).__name__}: {e}")
                continue
            traces[get_device(path.parent.name).name] = (report, float(origin_e2e))
        for origin, (report, origin_e2e) in traces.items():
            predicted = report.predict(list(traces))
            trace_ms = predicted.eager_ms(origin)  # the origin's measured nodes, run as a pipeline
            for target, (_, measured) in traces.items():
                if target == origin:
                    continue
                ms = predicted.eager_ms(target)
                rows.append({"run": run, "origin": origin, "target": target, "measured_ms": measured,
                             "trace_ms": ms, "calibrated_ms": ms * origin_e2e / trace_ms,
                             "origin_trace_vs_e2e": trace_ms / origin_e2e})  # fmt: skip
    table = pd.DataFrame(rows)
    if table.empty:
        print(f"no run measured on two GPUs under {args.data}", file=sys.stderr)
        return 2
    for method in ("trace", "calibrated"):
        table[f"{method}_err"] = (table[f"{method}_ms"] - table["measured_ms"]) / table["measured_ms"] * 100
    print("Predicted (from the origin's trace) vs measured end-to-end ms on the target")
    print(table.to_string(index=False, float_format=lambda v: f"{v:8.2f}"))
    print("\nMAPE (%) by origin GPU")
    print(table.groupby("origin")[["trace_err", "calibrated_err"]].agg(lambda e: e.abs().mean())
          .to_string(float_format=lambda v: f"{v:8.1f}"))  # fmt: skip
    if args.out:
        table.to_csv(args.out, index=False)
    print(f"({time.perf_counter() - start:.0f} s)")
    trace, calibrated = table["trace_err"].abs().mean(), table["calibrated_err"].abs().mean()
    print(f"mape_runtime={trace:.2f} mape_runtime_calibrated={calibrated:.2f} pairs={len(table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
