"""The subcommands about measurements and learned models: collect, calibrate, train, compare, fit-runs.

Each function takes the parsed arguments and imports what it needs (torch among them) when it runs.
"""

from __future__ import annotations

import argparse

from fxcost._progress import progress_bars
from fxcost.cli.status import OK

__all__ = ["calibrate_command", "collect_command", "compare_command", "fit_runs_command", "train_command"]


def collect_command(args: argparse.Namespace) -> int:
    """Measure random op configurations here into CSVs of the shared-data schema.

    Measure random configurations of each op on this machine and append them to
    DIR/ops/<op>/<Device>.csv (the layout and columns of shared/data/neusight/ops); a --precision other
    than fp32 writes DIR/<precision>/ops/<op>/<Device>.csv."""
    from fxcost.data.collect import collect

    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    stats = collect(ops, args.samples, args.out, device=args.device, resume=args.resume, seed=args.seed,
                    kernels=args.kernels, precision=args.precision,
                    max_seconds=args.max_seconds)  # fmt: skip
    for op, path in stats.paths.items():
        done = stats.written[op] + stats.skipped_oom[op]
        rate = f", {done / stats.seconds[op]:.1f} configs/s" if stats.seconds[op] > 0 else ""
        print(f"{op}: {stats.existing[op]} rows kept, {stats.written[op]} measured, "
              f"{stats.skipped_oom[op]} out of memory{rate} -> {path}")  # fmt: skip
    if stats.unfinished:
        print(f"stopped after --max-seconds {args.max_seconds:g}: {', '.join(stats.unfinished)} not finished "
              "(run the same command again to go on)")  # fmt: skip
    return OK


def calibrate_command(args: argparse.Namespace) -> int:
    """Measure this GPU's bandwidth, FMA and tensor-core rates, launch floor; write a device profile.

    Times Triton copy/triad (several sizes), FMA, tl.dot, empty and L2 kernels on the GPU and prints
    them; --out writes a YAML device file (load it with FXCOST_DEVICES or fxcost.gpus.load_devices)."""
    import torch

    from fxcost.kernels_triton.calibrate import calibrate, torch_copy_bandwidth_gbps
    from fxcost.kernels_triton.device_profile import bandwidth_check, describe, to_yaml

    if not torch.cuda.is_available():
        raise RuntimeError(
            "no CUDA GPU: `fxcost calibrate` measures a GPU and needs one (none is visible here)"
        )
    cal = calibrate(args.device, sizes=args.sizes, repeats=args.repeats)
    print(describe(cal))
    print(
        bandwidth_check(cal, torch_copy_bandwidth_gbps(args.device, sizes=args.sizes, repeats=args.repeats))
    )
    if args.out:
        print(f"device profile written to {to_yaml(cal, args.out, name=args.name, base=args.base)}")
    return OK


def train_command(args: argparse.Namespace) -> None:
    """Train the cost heads on measurement directories (resumable).

    Trains one MLP head per op class on DIR/ops and evaluates it on DIR/ops_test; the GEMM classes
    (linear, bmm) are one tiled model fit to both. Writes heads.npz, gemm.json and manifest.json to
    --out. Interrupted runs resume from the checkpoints in --out. GPUs held out by
    DESIGN.md (H100, L4, A100-80GB) are excluded unless --include-held-out."""
    import dataclasses

    from fxcost.cost_models.heads import HEADS
    from fxcost.gpus import HELD_OUT_DEVICES, get_device
    from fxcost.train.heads import TrainConfig, train

    config = TrainConfig(seed=args.seed)
    if args.epochs is not None:
        config = dataclasses.replace(config, epochs=args.epochs)
    exclude = {get_device(d).name for d in args.exclude_devices}
    if not args.include_held_out:
        exclude |= HELD_OUT_DEVICES
    with progress_bars() as on_progress:

        def on_epoch(head: str, epoch: int, epochs: int) -> None:
            on_progress(f"training {head}", epoch, epochs)

        manifest = train(args.data, args.out, heads=args.ops or HEADS, exclude=exclude, config=config,
                         progress=on_epoch)  # fmt: skip
    for head, facts in manifest["heads"].items():
        for name, rows in facts.get("left_out_rows", {}).items():
            held_out = name in HELD_OUT_DEVICES
            why = "held out by DESIGN.md (--include-held-out keeps it)" if held_out else "as asked"
            print(f"{head}: leaving out {name} ({rows} rows): {why}")
        test = facts["test_mape"].get("all", float("nan"))
        train_mape = facts["train_mape"]["all"]
        print(f"{head:8s} train rows {facts['train_rows']:6d}  train MAPE {train_mape:6.1f}%  "
              f"test rows {facts['test_rows']:5d}  test MAPE {test:6.1f}%")  # fmt: skip
    print(f"heads and manifest written to {args.out}")


def compare_command(args: argparse.Namespace) -> None:
    """Every op-level predictor on the same held-out rows, one table.

    MAPE (%) per op class of the roofline, Justus et al., Habitat's wave scaling, and fxcost's default
    without and with an origin GPU, on DIR's held-out rows (see fxcost.train.compare)."""
    from fxcost.cost_models.heads import HEADS
    from fxcost.train.compare import compare_ops

    unknown = set(args.ops or ()) - set(HEADS)
    if unknown:
        raise ValueError(f"unknown op classes {sorted(unknown)}; accepted: {', '.join(HEADS)}")
    with progress_bars() as on_progress:
        ops = args.ops or list(HEADS)
        done: list[str] = []

        def step(head: str) -> None:
            on_progress("comparing", len(done), len(ops))
            done.append(head)

        table = compare_ops(args.data, heads=ops, progress=step)
        on_progress("comparing", len(ops), len(ops))
    print("MAPE (%) on held-out rows, mean over devices (NaN: the predictor does not cover the op)")
    print(table.to_string(float_format=lambda v: f"{v:8.1f}"))
    print("\nLattuada et al. predicts whole runs: python benchmarks/seed_models.py --data DIR")


def fit_runs_command(args: argparse.Namespace) -> None:
    """Fit Lattuada et al.'s stepwise regression to a table of measured runs.

    Fits a linear regression of --target on the run features present (I iterations, B batch, G GPUs,
    P GFLOPS, T loader threads, D loading delay, N inner modules), their reciprocals and products,
    selected stepwise (Lattuada et al. §3.3); prints the terms."""
    import numpy as np
    import pandas as pd

    from fxcost.cost_models.lattuada import LattuadaRegression

    runs = pd.read_csv(args.runs)
    model = LattuadaRegression(p_enter=args.p_enter, p_remove=args.p_remove)
    model.fit(runs, target=args.target, features=args.features)
    predicted = model.predict(runs)
    measured = runs[args.target].to_numpy(dtype=float)
    print(model.summary())
    mape = float(np.mean(np.abs(predicted - measured) / measured) * 100)
    print(f"\n{len(runs)} runs, features {' '.join(model.features)}; in-sample MAPE {mape:.2f}%")
