"""How long simulating a parallel training plan takes (Proteus Table VI: 0.26 s at 1 GPU to 6.3 s at 32).

GPT-2 (the 117M model of Proteus Table II, ``fxcost.zoo``'s ``gpt2``, seq 1024, 8 samples per GPU)
and GPT-2 1.5B (``model_configs/gpt2_xl.json``) data parallel on 1, 2, 4, 8, 16 and 32 A100s (8 per
node), and a GPT-3-class 3D plan (``gpt3_27``, 2.7B: tp=8 inside nodes, pp=4, dp=2, 8 micro-batches)
on 64. Each model is traced once (reported apart: seconds of Dynamo and AOTAutograd, cached for every
later plan); the figure per plan is the wall time of ``fxcost.simulate`` after that: compiling the
per-stage plan, pricing the nodes, and the event simulation. Medians of ``--repeats``.

Last line: ``sim_s_gpt2_dp32=.. sim_s_gpt2xl_dp32=.. sim_s_3d_64=..`` (and the trace times).

    python benchmarks/sim_speed.py --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from typing import Any

from fxcost import zoo
from fxcost.data.datasets import data_root
from fxcost.sim import simulate

GPUS = (1, 2, 4, 8, 16, 32)
DEVICE = "A100-SXM4-80GB"


def cluster_of(gpus: int) -> str:
    return f"{gpus}x{DEVICE}" if gpus <= 8 else f"{gpus // 8}x8x{DEVICE}"


def timed(repeats: int, run: Any) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data", help="shared data directory (model configs)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    configs = data_root(args.data) / "model_configs"
    summary: dict[str, float] = {}

    model, inputs = zoo.build("gpt2", 8, seq=1024)
    xl = json.loads((configs / "gpt2_xl.json").read_text())
    gpt3 = json.loads((configs / "gpt3_27.json").read_text())

    def gpt2_dp(n: int) -> Any:
        return lambda: simulate(model, f"dp={n}", cluster_of(n), example_inputs=inputs, batch=8 * n)

    def xl_dp(n: int) -> Any:
        return lambda: simulate(xl, f"dp={n}", cluster_of(n), batch=8 * n, seqlen=1024)

    three_d = "dp=2,tp=8,pp=4,mb=8"
    plans: list[tuple[str, str, Any]] = [("gpt2", f"dp={n}", gpt2_dp(n)) for n in GPUS]
    plans += [("gpt2xl", f"dp={n}", xl_dp(n)) for n in GPUS]
    plans.append(("3d", three_d, lambda: simulate(gpt3, three_d, f"8x8x{DEVICE}", batch=16, seqlen=2048)))

    header = ["model".ljust(8), "strategy".ljust(22), "GPUs".rjust(5), "first call s".rjust(12)]
    print(" ".join([*header, "simulate s".rjust(11), "iteration ms".rjust(13)]))
    for name, strategy, run in plans:
        start = time.perf_counter()
        run()  # the first call may trace the model (once per model and micro-batch size)
        first = time.perf_counter() - start
        seconds, result = timed(args.repeats, run)
        gpus = result.strategy.world_size
        print(
            f"{name:8s} {strategy:22s} {gpus:5d} {first:12.2f} {seconds:11.3f} {result.iteration_ms:13.1f}",
            flush=True,
        )
        key = {"gpt2": "gpt2_dp", "gpt2xl": "gpt2xl_dp", "3d": "3d_"}[name] + str(gpus)
        summary[f"sim_s_{key}"] = seconds
        if gpus == 1 or name == "3d":
            summary[f"trace_s_{name}"] = first - seconds
    print(
        "first call: includes tracing the model when its micro-batch size is new; simulate: median after it"
    )
    keys = [
        "sim_s_gpt2_dp32",
        "sim_s_gpt2xl_dp32",
        "sim_s_3d_64",
        "trace_s_gpt2",
        "trace_s_gpt2xl",
        "trace_s_3d",
    ]
    print(" ".join(f"{k}={summary[k]:.3f}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
