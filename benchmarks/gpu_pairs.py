"""Cross-GPU accuracy on traces recorded on real GPUs (issue 10): each GPU's trace predicts the others.

Reads what ``record_gpu_traces.py`` wrote (``DIR/<gpu>/<case>-<precision>.{json.gz,meta.json}``). For
every case and precision recorded on two or more GPUs:

- runtime-based: the origin GPU's measured trace predicts the destination's step (kernel-alike nodes
  wave-scaled from their measured time, the rest scaled by the heads' ratio; ``report.eager_ms``),
  against the destination's measured eager step;
- origin-free: the same graph with its measurements set aside, predicted from spec sheets and the
  heads alone, against the measured step on each GPU;
- capture fidelity: the sum of one trace's isolated node times over its measured step (1.0 is
  perfect; its error is ``|fidelity - 1|``).

    python benchmarks/gpu_pairs.py [--fixtures benchmarks/fixtures/gpu]

Last line: ``mape_runtime_<o>_to_<d>=..`` per ordered GPU pair (e.g. ``mape_runtime_h100_to_h200``),
``mape_origin_free=.. fidelity_mape=.. traces=N``. Without traces it says so and prints ``traces=0``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from fxcost.devices import get_device
from fxcost.report import Report


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
    """The report as if captured without a GPU: no origin, no measured node times."""
    blind = copy.deepcopy(report)
    blind.origin = "cpu"
    for n in blind.nodes:
        n.origin_ms = None
        n.kernels = []
    return blind


def _pct(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, default=Path(__file__).parent / "fixtures" / "gpu")
    args = parser.parse_args(argv)
    runs = load(args.fixtures)
    traces = sum(len(gpus) for gpus in runs.values())
    if not traces:
        print(f"no GPU traces under {args.fixtures} (record them with benchmarks/record_gpu_traces.py)")
        print("traces=0")
        return 0

    runtime: dict[tuple[str, str], list[float]] = defaultdict(list)
    free, fidelity = [], []
    print(f"{'case':24s} {'prec':5s} {'origin':>10s} {'target':>10s} {'measured':>10s} {'runtime':>10s} "
          f"{'err %':>7s} {'origin-free':>11s} {'err %':>7s}")  # fmt: skip
    for (case, precision), gpus in sorted(runs.items()):
        reports = {gpu: Report.load(path) for gpu, (_, path) in gpus.items()}
        fidelity += [abs(meta["fidelity"] - 1) * 100 for meta, _ in gpus.values() if meta.get("fidelity")]
        for target, (meta, _) in gpus.items():
            measured = float(meta["step_ms"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                blind_ms = origin_free(reports[target]).predict([target]).eager_ms(target)
            free.append(abs(_pct(blind_ms, measured)))
            for origin, report in reports.items():
                if origin == target:
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    predicted = report.predict([target]).eager_ms(target)
                error, blind_error = _pct(predicted, measured), _pct(blind_ms, measured)
                runtime[origin, target].append(abs(error))
                print(f"{case:24s} {precision:5s} {slug(origin):>10s} {slug(target):>10s} {measured:10.2f} "
                      f"{predicted:10.2f} {error:+7.1f} {blind_ms:11.2f} {blind_error:+7.1f}")  # fmt: skip
    summary = {
        f"mape_runtime_{slug(o)}_to_{slug(d)}": statistics.mean(e) for (o, d), e in sorted(runtime.items())
    }
    summary["mape_origin_free"] = statistics.mean(free)
    summary["fidelity_mape"] = statistics.mean(fidelity) if fidelity else float("nan")
    print(" ".join(f"{k}={v:.2f}" for k, v in summary.items()) + f" traces={traces}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
