"""Compiled-mode predictions of recorded eager steps against the same steps recorded under
``torch.compile`` (Inductor) on the same GPU.

For every ``<case>.inductor.json`` in ``DIR/<GPU>/`` (a compiled step: its timed ``step_ms``, its kernel
count and families, and the kernel listing beside it) whose eager trace ``<case>.json.gz`` is there
too, the eager trace is predicted in compiled mode on its own GPU (``report.compiled_ms``: Inductor's
fusion applied to the recorded ATen graphs; library kernels at their recorded times, generated
kernels priced from the bytes they move) and compared with the compiled step: the step time, the
number of kernels, and kernels and GPU time by family (Inductor's ``triton_poi_*`` pointwise,
``triton_red_*``/``triton_per_*`` reductions, the rest library calls; a split batch norm's
reductions count as reductions, its pointwise pass as pointwise, its time, one price, as a
reduction's). Nothing is fit on these
recordings (DESIGN.md).

    python -m benchmarks.compiled_steps [--fixtures benchmarks/fixtures/gpu]

(from the repository root: run as a file, ``python benchmarks/compiled_steps.py`` imports whichever
fxcost the environment installed, not necessarily this checkout's).

Last line: ``compiled_mape=.. eager_mape=.. kernels_ratio=.. rows=N`` (eager: the eager prediction of
the same trace against the compiled step, for comparison).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

from fxcost.gpus import get_device
from fxcost.report import Report

FAMILIES = {"triton_poi": "pointwise", "triton_red": "reduction", "triton_per": "reduction"}


def family(kernel_name: str) -> str:
    """The family of a recorded kernel by Inductor's naming: pointwise, reduction, or extern."""
    return next((f for prefix, f in FAMILIES.items() if kernel_name.startswith(prefix)), "extern")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", default=str(Path(__file__).parent / "fixtures" / "gpu"))
    args = parser.parse_args()
    rows = []
    for meta in sorted(Path(args.fixtures).glob("*/*.inductor.json")):
        recorded = json.loads(meta.read_text())
        trace = meta.with_name(meta.name.replace(".inductor.json", ".json.gz"))
        if not trace.exists():
            print(f"skip {meta.name}: no eager trace {trace.name}")
            continue
        report = Report.load(trace)
        device = get_device(report.origin).name
        predicted = report.predict([device])
        spans = predicted.compiled_timeline(device)
        listing = meta.with_name(str(recorded["kernel_listing"]))
        kernels = json.loads(gzip.decompress(listing.read_bytes())) if listing.exists() else []
        measured_count, measured_ms = Counter[str](), Counter[str]()
        for name, us in kernels:
            measured_count[family(name)] += 1
            measured_ms[family(name)] += us / 1000
        count, ms = Counter[str](), Counter[str]()
        for span in spans:
            kind = "extern" if span.kernel.kind in ("extern", "attention") else span.kernel.kind
            count[kind] += 1 if span.launches == 1 else span.launches - 1  # a split's reductions
            count["pointwise"] += span.launches > 1  # and its pointwise pass; its time, one price, above
            ms[kind] += span.end_ms - span.start_ms
        rows.append((meta.parent.name, recorded["case"], recorded.get("mode", ""), recorded["step_ms"],
                     predicted.compiled_ms(device), predicted.eager_ms(device),
                     sum(s.launches for s in spans),
                     int(recorded["kernels"])))  # fmt: skip
        case = f"{meta.parent.name} {recorded['case']} {recorded['precision']} ({recorded.get('mode', '')})"
        print(f"\n{case}: step measured {recorded['step_ms']:.1f} ms, compiled predicted "
              f"{predicted.compiled_ms(device):.1f}, eager predicted {predicted.eager_ms(device):.1f} "
              f"(eager measured {report.step_ms or float('nan'):.1f})")  # fmt: skip
        print(f"  {'family':<10} {'kernels rec':>11} {'pred':>6} {'ms rec':>9} {'pred':>9}")
        for kind in ("pointwise", "reduction", "extern"):
            print(f"  {kind:<10} {measured_count[kind]:>11} {count[kind]:>6} {measured_ms[kind]:>9.2f} "
                  f"{ms[kind]:>9.2f}")  # fmt: skip
    if not rows:
        print(f"no compiled recordings with eager traces under {args.fixtures}", file=sys.stderr)
        return 2
    compiled = [abs(r[4] - r[3]) / r[3] * 100 for r in rows]
    eager = [abs(r[5] - r[3]) / r[3] * 100 for r in rows]
    ratio = sum(r[6] for r in rows) / sum(r[7] for r in rows)
    print(f"\ncompiled_mape={sum(compiled) / len(rows):.2f} eager_mape={sum(eager) / len(rows):.2f} "
          f"kernels_ratio={ratio:.3f} rows={len(rows)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
