"""Origin-free accuracy of the memory-bound ops the heads price through lowering, on real GPU traces.

The shared data measures no reduction, concatenation, gather, pooling or batch norm, so the heads
price those ops as the elementwise passes their kernels make (``lowering.MEMORY_BOUND``): each pass
a ``relu`` moving the bytes it moves, predicted by the elementwise head. Nothing is fit for them.
Before, they fell to the roofline. This benchmark checks both against the kernel times recorded on
the lent H100 and H200 (``benchmarks/fixtures/gpu``), GPUs held out of every shipped model: per op,
the nodes, the median absolute error of each model's predicted kernel time, and each model's
predicted total over the recorded total. As a reference it prints the same figures for the nodes
the elementwise head predicts directly.

    python benchmarks/lowered_ops.py [--fixtures benchmarks/fixtures/gpu]

Last line: ``nodes=N mape_lowered=.. mape_roofline=.. total_ratio_lowered=.. total_ratio_roofline=..
mape_ew_reference=..`` (MAPE: median absolute percentage error over the nodes; ratio: sum predicted
over sum recorded).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from collections import defaultdict
from pathlib import Path

from fxcost.cost_models import predict
from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads import LOWERED, head_of
from fxcost.gpus import get_device
from fxcost.lowering import MEMORY_BOUND
from fxcost.propagate.eager import eager_kernel_ms
from fxcost.records import NodeCost
from fxcost.report import Report

MODELS = ("mlp", "roofline")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, default=Path(__file__).parent / "fixtures" / "gpu")
    args = parser.parse_args(argv)
    # (op or "elementwise head") -> model -> [(predicted kernel ms, recorded kernel ms)]
    pairs: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for meta_path in sorted(args.fixtures.glob("*/*.meta.json")):
        meta = json.loads(meta_path.read_text())
        gpu = get_device(meta["gpu"])
        nodes = [n for n in Report.load(meta_path.parent / meta["trace"]).nodes if _timed(n)]
        for model in MODELS:
            blind = [n.replace(origin_ms=None, kernels=[], pred_ms={}, pred_source={}) for n in nodes]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                predict(blind, [gpu], model=model)
            for truth, node in zip(nodes, blind, strict=True):
                ms = node.pred_ms.get(gpu.name)
                if ms is None:
                    continue
                key = truth.op if truth.op in MEMORY_BOUND else "elementwise head"
                pairs[key][model].append(
                    (eager_kernel_ms(node, gpu, hidden_overhead_ms(gpu)), truth.kernel_ms)
                )
    if not pairs:
        print(f"no GPU traces under {args.fixtures}")
        print("nodes=0")
        return 0

    print(f"{'op':52s} {'nodes':>5s} {'MAPE lowered':>12s} {'MAPE roofline':>13s} "
          f"{'sum lowered':>11s} {'sum roofline':>12s}")  # fmt: skip
    lowered_ops = sorted(
        (op for op in pairs if op != "elementwise head"), key=lambda op: -len(pairs[op]["mlp"])
    )
    for op in [*lowered_ops, "elementwise head"]:
        mlp, roof = pairs[op]["mlp"], pairs[op]["roofline"]
        print(f"{op:52s} {len(mlp):5d} {_mape(mlp):11.1f}% {_mape(roof):12.1f}% "
              f"{_ratio(mlp):11.2f} {_ratio(roof):12.2f}")  # fmt: skip
    every = {m: [p for op in lowered_ops for p in pairs[op][m]] for m in MODELS}
    print(f"nodes={len(every['mlp'])} mape_lowered={_mape(every['mlp']):.1f} "
          f"mape_roofline={_mape(every['roofline']):.1f} total_ratio_lowered={_ratio(every['mlp']):.2f} "
          f"total_ratio_roofline={_ratio(every['roofline']):.2f} "
          f"mape_ew_reference={_mape(pairs['elementwise head']['mlp']):.1f}")  # fmt: skip
    return 0


def _timed(node: NodeCost) -> bool:
    """A node the heads price through lowering, or directly with the elementwise head, whose kernels
    the profiler timed."""
    head = head_of(node)
    lowered = head == LOWERED and node.op in MEMORY_BOUND
    return (lowered or head == "ew") and node.kernel_ms is not None


def _mape(pairs: list[tuple[float, float]]) -> float:
    return statistics.median(abs(p - m) / m * 100 for p, m in pairs) if pairs else float("nan")


def _ratio(pairs: list[tuple[float, float]]) -> float:
    return sum(p for p, _ in pairs) / sum(m for _, m in pairs) if pairs else float("nan")


if __name__ == "__main__":
    sys.exit(main())
