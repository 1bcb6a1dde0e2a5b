"""Capture fidelity: do the isolated node times add up to the measured step?

For each built-in model, captures one training step with fxcost (every node re-run in isolation,
Habitat §4.1), and compares the sum of node times with (a) the eager training step timed whole and
(b) the captured graphs timed whole, all measured in the same run on this machine's device. Repeats
each capture and reports medians; times on a shared CPU are noisy, ratios within one run less so.

On a CPU every node of the step runs again in isolation: on a loaded 2-core machine three captures
of ResNet-50 at batch 8 did not finish in 10 minutes, one took 7, and one at batch 2 still 5. There
the default is a reduced protocol: one capture per model, ResNet-50 at batch 2 and GPT-2 with 2
layers of 128 tokens (:data:`REDUCED`). ``--full`` runs the sizes above, three
captures each, as a GPU does by default. The output says which ran.

    python benchmarks/capture_fidelity.py [--full | --repeats N] [--device cpu|cuda] [--out rows.csv]

Last line: ``fidelity_median=.. fidelity_min=.. fidelity_max=.. fidelity_graphs_median=.. models=N device=..
repeats=N protocol=reduced|full``
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

import torch

import fxcost
from fxcost import zoo

# Sizes that keep one capture under about a minute on a 2-core CPU.
MODELS: dict[str, tuple[int, dict]] = {
    "mlp": (64, {}),
    "resnet50": (8, {}),
    "lstm": (8, {"seq": 32}),
    "transformer_block": (8, {"seq": 128}),
    "gpt2": (4, {"layers": 4, "seq": 256}),
}
FULL_REPEATS = 3
# On a CPU by default (see the module docstring).
REDUCED: dict[str, tuple[int, dict]] = {
    "resnet50": (2, {}),  # smaller images make its eager step a different workload (fidelity 27)
    "gpt2": (4, {"layers": 2, "seq": 128}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, help=f"captures per model ({FULL_REPEATS}; on a CPU 1)")
    parser.add_argument("--full", action="store_true", help="the GPU protocol on a CPU too (slow)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", help="write one row per model and repeat to this CSV")
    args = parser.parse_args()
    device = torch.device(args.device)
    full = args.full or device.type == "cuda"
    args.repeats = args.repeats or (FULL_REPEATS if full else 1)
    sizes = MODELS if full else MODELS | REDUCED
    if not full or args.repeats < FULL_REPEATS:
        print(f"REDUCED protocol (--full for the complete one): {args.repeats} capture(s) per model, not "
              f"{FULL_REPEATS}" + ("" if full else ", " + ", ".join(f"{m} at batch {b} {c}" for m, (b, c) in
                                                                    REDUCED.items())))  # fmt: skip

    rows = []
    print(f"device: {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")  # fmt: skip
    header = f"{'model':18s} {'nodes':>6s} {'node sum ms':>12s} {'eager step ms':>14s} {'graphs ms':>10s} "
    print(header + f"{'fidelity':>9s} {'vs graphs':>10s} {'capture s':>10s}")
    for name in args.models:
        batch, config = sizes[name]
        model, inputs = zoo.build(name, batch, **config)
        model = model.to(device)
        inputs = tuple(t.to(device) for t in inputs)
        per_repeat = []
        for repeat in range(args.repeats):
            torch._dynamo.reset()
            start = time.perf_counter()
            report = fxcost.profile(model, inputs, devices=["H100-SXM"])
            seconds = time.perf_counter() - start
            graphs_ms = sum(g.measured_ms or 0.0 for g in report.graphs)
            nodes_ms = report.origin_ms() or 0.0
            row = dict(model=name, repeat=repeat, nodes=len(report.nodes), node_sum_ms=nodes_ms,
                       step_ms=report.step_ms, graphs_ms=graphs_ms, fidelity=report.capture_fidelity,
                       fidelity_graphs=nodes_ms / graphs_ms, capture_s=seconds)  # fmt: skip
            per_repeat.append(row)
            rows.append(row)
        med = {k: statistics.median(r[k] for r in per_repeat) for k in per_repeat[0] if k != "model"}
        print(f"{name:18s} {int(med['nodes']):6d} {med['node_sum_ms']:12.2f} {med['step_ms']:14.2f} "
              f"{med['graphs_ms']:10.2f} {med['fidelity']:9.3f} {med['fidelity_graphs']:10.3f} "
              f"{med['capture_s']:10.1f}", flush=True)  # fmt: skip

    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    by_model = [statistics.median(r["fidelity"] for r in rows if r["model"] == m) for m in args.models]
    by_model_graphs = [
        statistics.median(r["fidelity_graphs"] for r in rows if r["model"] == m) for m in args.models
    ]
    print(f"fidelity_median={statistics.median(by_model):.3f} fidelity_min={min(by_model):.3f} "
          f"fidelity_max={max(by_model):.3f} fidelity_graphs_median={statistics.median(by_model_graphs):.3f} "
          f"models={len(args.models)} device={device.type} repeats={args.repeats} "
          f"protocol={'full' if full and args.repeats >= FULL_REPEATS else 'reduced'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
