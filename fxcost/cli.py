"""The ``fxcost`` command: demo, profile a model, show a saved trace, compare GPUs, train and compare
cost models, list devices (``fxcost --help`` lists every subcommand)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fxcost.report import Report

__all__ = ["main"]

DEMO_MODELS: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("resnet50", 8, {}),
    ("gpt2", 4, {"layers": 4, "seq": 256}),
)
DEMO_DEVICES = ("H100-SXM", "A100-SXM4-80GB", "L4", "T4")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fxcost`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args) or 0)
    except (ValueError, TypeError, KeyError, FileNotFoundError, RuntimeError) as e:
        print(f"fxcost: error: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    from fxcost import __version__

    parser = argparse.ArgumentParser(
        prog="fxcost",
        description="Predict how long a PyTorch training iteration takes on GPUs you may not have.",
    )
    parser.add_argument("--version", action="version", version=f"fxcost {__version__}")
    sub = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="capture ResNet-50 and a GPT-2-style model, predict on several GPUs")
    _add_devices(demo, DEMO_DEVICES)
    demo.add_argument("--top", type=int, default=15, help="rows of the node table per model (default 15)")
    demo.set_defaults(run=_demo)

    profile = sub.add_parser(
        "profile",
        help="capture one step of a model, measure it here, predict it, save the trace",
        description=f"MODEL is a built-in example ({', '.join(_zoo_names())}), 'module:callable' "
        "returning (model, inputs) (the callable receives batch=N if it takes a 'batch' argument), or a "
        "Hugging Face config.json: that model is captured on meta tensors (any size; nothing is measured) "
        "with --seqlen tokens of input.",
    )
    profile.add_argument("model", metavar="MODEL")
    profile.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    profile.add_argument(
        "--seqlen", type=int, default=512, help="tokens per sequence, HF configs (default 512)"
    )
    profile.add_argument(
        "--train", action=argparse.BooleanOptionalAction, default=True,
        help="a training step: forward, loss, backward (default); --no-train for inference",
    )  # fmt: skip
    profile.add_argument("--measure", action=argparse.BooleanOptionalAction, default=True,
                         help="time every node on this machine's device (default on)")  # fmt: skip
    _add_devices(profile, ("H100-SXM", "A100-SXM4-80GB", "L4"))
    profile.add_argument("--out", help="write the trace here (JSON; .json.gz compresses)")
    profile.add_argument(
        "--model",
        dest="cost_model",
        default="auto",
        help="cost model or comma-separated fallback chain (default: auto, the prediction policy: on a "
        "GPU wave scaling for measured kernel-alike nodes and MLP heads for matmuls/convolutions, "
        "elsewhere the heads; the roofline for the rest)",
    )
    profile.add_argument("--top", type=int, default=20, help="rows of the node table (default 20)")
    profile.add_argument("--device", default=None, help="run on this torch device (default: cuda if present)")
    profile.set_defaults(run=_profile)

    show = sub.add_parser("show", help="print a saved trace, predicted for any GPUs")
    show.add_argument("trace")
    show.add_argument("--devices", nargs="+", metavar="GPU", help="GPUs to predict (default: the trace's)")
    show.add_argument("--top", type=int, default=None, help="only the N most expensive nodes")
    show.add_argument(
        "--model",
        help="cost model or comma-separated fallback chain (default: the trace's, normally 'auto': "
        "a trace measured on a GPU is scaled runtime-based to the others)",
    )
    show.set_defaults(run=_show)

    train = sub.add_parser(
        "train",
        help="train the MLP cost heads on measurement directories (resumable)",
        description="Trains one MLP head per op class on DIR/ops and evaluates it on DIR/ops_test; writes "
        "heads.npz and manifest.json to --out. Interrupted runs resume from the checkpoints in --out. GPUs "
        "held out by DESIGN.md (H100, L4, A100-80GB) are excluded unless --include-held-out.",
    )
    train.add_argument(
        "--data", action="append", required=True, metavar="DIR", help="data directory (repeatable)"
    )
    train.add_argument("--out", required=True, metavar="DIR")
    train.add_argument("--ops", nargs="+", metavar="HEAD", help="heads to train (default: all)")
    train.add_argument(
        "--exclude-devices", nargs="+", default=[], metavar="GPU", help="also leave these GPUs out"
    )
    train.add_argument(
        "--include-held-out",
        action="store_true",
        help="train on H100, L4 and A100-80GB rows too (your own heads; the shipped ones never are)",
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--epochs", type=int, default=None, help="epochs per head (default: the study's choice)"
    )
    train.set_defaults(run=_train)

    devices = sub.add_parser("devices", help="list the GPUs fxcost knows")
    devices.set_defaults(run=_devices)

    fit_runs = sub.add_parser(
        "fit-runs",
        help="fit Lattuada et al.'s stepwise regression to a table of measured runs",
        description="Fits a linear regression of --target on the run features present (I iterations, "
        "B batch, G GPUs, P GFLOPS, T loader threads, D loading delay, N inner modules), their "
        "reciprocals and products, selected stepwise (Lattuada et al. §3.3); prints the terms.",
    )
    fit_runs.add_argument("runs", help="CSV with one row per run")
    fit_runs.add_argument("--target", required=True, help="column to predict, e.g. time_s")
    fit_runs.add_argument(
        "--features", nargs="+", help="feature columns (default: those of I B G P T D N present)"
    )
    fit_runs.add_argument("--p-enter", type=float, default=0.05)
    fit_runs.add_argument("--p-remove", type=float, default=0.10)
    fit_runs.set_defaults(run=_fit_runs)

    compare = sub.add_parser(
        "compare",
        help="every op-level predictor on the same held-out rows, one table",
        description="MAPE (%%) per op class of the roofline, Justus et al., Habitat's wave scaling, and "
        "fxcost's default without and with an origin GPU, on DIR's held-out rows (see fxcost.compare).",
    )
    compare.add_argument("--data", required=True, metavar="DIR", help="measurement directory (shared layout)")
    compare.add_argument("--ops", nargs="+", help="op classes (default: all)")
    compare.set_defaults(run=_compare)

    gpus = sub.add_parser(
        "compare-gpus",
        help="which GPU to rent: predicted throughput and samples per dollar of a model's step",
        description="Captures MODEL once (as 'profile' does; or reads a saved trace, .json with a "
        "schema_version or .json.gz) and ranks GPUs by predicted samples per dollar, as in Habitat's "
        "case studies (Yu et al. §5.3). The step time is the predicted eager step (the ops back to back, "
        "their launch overhead hidden by the GPU queue), not the sum of ops timed alone; throughput is "
        "the batch size per step.",
    )
    gpus.add_argument("model", metavar="MODEL", help="zoo name, 'module:callable', HF config.json or trace")
    gpus.add_argument(
        "--batch", type=int, default=None, help="batch size (default 8; a trace's own if it records one)"
    )
    gpus.add_argument("--seqlen", type=int, default=512, help="tokens per sequence, HF configs (default 512)")
    gpus.add_argument(
        "--train", action=argparse.BooleanOptionalAction, default=True,
        help="a training step: forward, loss, backward (default); --no-train for inference",
    )  # fmt: skip
    gpus.add_argument(
        "--measure", action=argparse.BooleanOptionalAction, default=False,
        help="time every node on this machine's device first (default off: one capture predicts every GPU)",
    )  # fmt: skip
    gpus.add_argument(
        "--devices", nargs="+", metavar="GPU",
        help="GPUs to compare (default: every GPU with a price); see 'fxcost devices'",
    )  # fmt: skip
    gpus.add_argument(
        "--prices", metavar="YAML", help="USD per hour by GPU name, overriding the database's prices"
    )
    gpus.add_argument("--plot", metavar="PNG", help="write throughput and samples-per-$ bar charts here")
    gpus.set_defaults(run=_compare_gpus)

    sim = sub.add_parser(
        "simulate",
        help="simulate a multi-GPU training iteration: data, tensor and pipeline parallel, ZeRO",
        description="Traces one step of MODEL (no GPU needed), splits it over the cluster by the strategy, "
        "and simulates one iteration (Proteus): time, throughput, per-stage peak memory and OOM verdict.",
    )
    sim.add_argument("model", metavar="MODEL", help="zoo name, 'module:callable' or Hugging Face config.json")
    sim.add_argument("--cluster", required=True, help="NODESxGPUSxDEVICE, e.g. 2x8xA100-SXM4-80GB")
    sim.add_argument(
        "--strategy", required=True,
        help="'dp=2,tp=4,pp=2,mb=8,zero=1[,schedule=gpipe][,recompute=1][,overlap=0]' or a YAML file",
    )  # fmt: skip
    sim.add_argument("--batch", type=int, default=8, help="global batch size (default 8)")
    sim.add_argument(
        "--seqlen", type=int, default=1024, help="tokens per sequence, HF configs (default 1024)"
    )
    sim.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16"], default=None)
    sim.add_argument("--trace", metavar="JSON", help="write the simulated timeline for Perfetto here")
    sim.set_defaults(run=_simulate)

    from fxcost.collect import add_collect_parser
    from fxcost.kernels_triton.calibrate import add_calibrate_parser

    add_calibrate_parser(sub)
    add_collect_parser(sub)
    return parser


def _simulate(args: argparse.Namespace) -> int:
    from fxcost.sim import Strategy, simulate

    strategy = Strategy.load(args.strategy) if args.strategy.endswith((".yaml", ".yml")) else args.strategy
    if args.model.endswith(".json"):  # a Hugging Face config: simulate builds it at --batch and --seqlen
        model, inputs = args.model, None
    else:
        from fxcost import zoo

        model, inputs = zoo.load(args.model, args.batch)
    result = simulate(model, strategy, args.cluster, example_inputs=inputs, batch=args.batch,
                      seqlen=args.seqlen, precision=args.precision)  # fmt: skip
    print(result.summary())
    if args.trace:
        print(f"timeline written to {result.to_chrome_trace(args.trace)}")
    return 3 if result.oom else 0


def _compare_gpus(args: argparse.Namespace) -> None:
    from fxcost.compare_gpus import compare_gpus, load_prices, plot, priced_devices, print_choices

    prices = load_prices(args.prices) if args.prices else {}
    devices = args.devices or priced_devices(prices)
    report = _compare_gpus_report(args, devices)
    choices = compare_gpus(report, devices, prices)
    print_choices(choices)
    if args.plot:
        title = f"{args.model}, batch {report.batch}"
        print(f"plot written to {plot(choices, args.plot, title=title)}")


def _compare_gpus_report(args: argparse.Namespace, devices: Sequence[str]) -> Report:
    """The report of MODEL for compare-gpus: a saved trace, or one step captured as 'profile' does."""
    import json
    from pathlib import Path

    from fxcost.report import Report

    spec = args.model
    report, config = None, None
    if spec.endswith(".json.gz"):
        report = Report.load(spec)
    elif spec.endswith(".json"):  # a saved trace (it has a schema version) or a Hugging Face config.json
        config = json.loads(Path(spec).read_text(encoding="utf-8"))
        if "schema_version" in config:
            report = Report.from_json(config)
    if report is not None:
        if None not in (args.batch, report.batch) and args.batch != report.batch:
            raise ValueError(f"{spec} was captured at batch {report.batch}, not {args.batch}")
        report.batch = report.batch or args.batch
        if report.batch is None:
            raise ValueError(f"{spec} records no batch size; give it with --batch")
        print(f"{spec} (batch {report.batch}), trace captured on {report.origin}")
        return report
    if config is not None and args.measure:
        raise ValueError("a Hugging Face config is captured on meta tensors; --measure needs a model")
    device = _default_device() if args.measure else None
    where = f", measured on {device}" if device else ", captured on CPU"
    return _capture_spec(args, devices, batch=args.batch or 8, measure=args.measure, device=device,
                         where=where, config=config)  # fmt: skip


def _compare(args: argparse.Namespace) -> None:
    from fxcost.compare import compare_ops
    from fxcost.cost_models.heads import HEADS

    unknown = set(args.ops or ()) - set(HEADS)
    if unknown:
        raise ValueError(f"unknown op classes {sorted(unknown)}; accepted: {', '.join(HEADS)}")
    with _progress_bars() as (_, on_progress):
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


def _fit_runs(args: argparse.Namespace) -> None:
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


def _add_devices(parser: argparse.ArgumentParser, default: Sequence[str]) -> None:
    parser.add_argument(
        "--devices", nargs="+", default=list(default), metavar="GPU",
        help=f"GPUs to predict for (default: {' '.join(default)}); see 'fxcost devices'",
    )  # fmt: skip


def _zoo_names() -> list[str]:
    from fxcost import zoo

    return zoo.names()


def _demo(args: argparse.Namespace) -> None:
    from fxcost import zoo

    for name, batch, config in DEMO_MODELS:
        model, inputs = zoo.build(name, batch, **config)
        title = f"{name} (batch {batch}{''.join(f', {k} {v}' for k, v in config.items())}), training step"
        report = _capture(title, model, inputs, args.devices, train=True, measure=True)
        report.print(top=args.top)
        print()


def _profile(args: argparse.Namespace) -> None:
    device = args.device or _default_device()
    report = _capture_spec(args, args.devices, batch=args.batch, measure=args.measure,
                           cost_model=args.cost_model, device=device, where=f" on {device}")  # fmt: skip
    report.print(top=args.top)
    if args.out:
        print(f"trace written to {report.save(args.out)}")


def _capture_spec(
    args: argparse.Namespace, devices: Sequence[str], *, batch: int, measure: bool, cost_model: str = "auto",
    device: str | None = None, where: str = "", config: dict[str, Any] | None = None,
) -> Report:  # fmt: skip
    """One step of MODEL (``args.model``, with ``args.train`` and ``args.seqlen``) captured and predicted
    for ``devices``, as 'profile' and 'compare-gpus' do.

    A Hugging Face config.json (``config``: its contents, if read already) is captured on meta tensors,
    nothing measured. A zoo name or 'module:callable' is moved to the torch ``device`` (None: left on
    the CPU it was built on) and measured there if ``measure``; ``where`` ends its title, after the mode.
    """
    mode = "training step" if args.train else "inference"
    spec = args.model
    if spec.endswith(".json"):
        from fxcost.hf import hf_step

        step = hf_step(spec if config is None else config, batch, args.seqlen, train=args.train)
        title = f"{spec} (batch {batch}, {args.seqlen} tokens), {mode} on meta tensors"
        return _capture(title, step.model, step.inputs, devices, train=args.train, measure=False,
                        cost_model=cost_model, loss_fn=step.loss_fn)  # fmt: skip
    import torch

    from fxcost import zoo

    model, inputs = zoo.load(spec, batch)
    if device is not None:
        model, inputs = _to_device(model, inputs, torch.device(device))
    title = f"{spec} (batch {batch}), {mode}{where}"
    return _capture(title, model, inputs, devices, train=args.train, measure=measure, cost_model=cost_model)


def _default_device() -> str:
    """The torch device to run on when none is named: cuda if present, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _show(args: argparse.Namespace) -> None:
    from fxcost.report import Report

    report = Report.load(args.trace)
    if args.devices or args.model:
        report = report.predict(args.devices or report.devices, model=args.model)
    report.print(top=args.top)


def _train(args: argparse.Namespace) -> None:
    import dataclasses

    from fxcost.cost_models.heads import HEADS
    from fxcost.devices import get_device
    from fxcost.training import HELD_OUT_DEVICES, TrainConfig, train

    config = TrainConfig(seed=args.seed)
    if args.epochs is not None:
        config = dataclasses.replace(config, epochs=args.epochs)
    exclude = {get_device(d).name for d in args.exclude_devices}
    if not args.include_held_out:
        exclude |= HELD_OUT_DEVICES
    with _progress_bars() as (_, on_progress):

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


def _devices(args: argparse.Namespace) -> None:
    from rich.table import Table

    from fxcost.devices import device_names, get_device
    from fxcost.report.table import console_for

    table = Table(title="GPUs in fxcost's database (? = unconfirmed, or a default; see Device.source_of)")
    for column in ("name", "full name", "SMs", "FP32 TFLOPS", "BF16 TFLOPS", "spec GB/s", "achieved GB/s",
                   "memory GB", "$/h"):  # fmt: skip
        table.add_column(column, justify="left" if "name" in column else "right")
    for name in device_names():
        d = get_device(name)
        cells = [
            (d.num_sms, "num_sms" in d.uncertain),
            (d.fp32_tflops, "fp32_tflops" in d.uncertain),
            (d.bf16_tflops, "bf16_tflops" in d.uncertain),
            (d.mem_bandwidth_gbps, "mem_bandwidth_gbps" in d.uncertain),
            (d.bandwidth_gbps, d.achieved_bandwidth_gbps is None),
            (d.memory_gb, "memory_gb" in d.uncertain),
            (d.price_usd_per_hr, "price_usd_per_hr" in d.uncertain),
        ]
        table.add_row(d.name, d.full_name, *(_cell(value, unsure) for value, unsure in cells))
    console_for().print(table)


def _cell(value: float | None, uncertain: bool) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}{'?' if uncertain else ''}"


def _capture(
    title: str, model: Any, inputs: Any, devices: Sequence[str], *, train: bool, measure: bool,
    cost_model: str = "auto", loss_fn: Callable[[Any], Any] | None = None,
) -> Report:  # fmt: skip
    import fxcost
    from fxcost.capture import default_loss

    with _progress_bars() as (bar, on_progress):
        capturing = bar.add_task(f"capturing {title}", total=None)
        report = fxcost.profile(
            model, inputs, devices=devices, train=train, measure=measure, cost_model=cost_model,
            loss_fn=loss_fn or default_loss,
            progress=lambda phase, done, total: on_progress(f"  measuring {phase} graph nodes", done, total),
        )  # fmt: skip
        bar.update(capturing, total=1, completed=1)
    print(title)  # on stdout, with the table it heads (the progress display is on stderr)
    return report


@contextlib.contextmanager
def _progress_bars() -> Iterator[tuple[Any, Callable[[str, int, int], None]]]:
    """A transient rich progress display on stderr, and ``update(label, done, total)`` for its bars."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        tasks: dict[str, Any] = {}

        def update(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done, total=total)

        yield bar, update


def _to_device(model: Any, inputs: Any, device: Any) -> tuple[Any, Any]:
    import torch
    from torch.utils._pytree import tree_map

    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    return model, tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, inputs)


if __name__ == "__main__":
    sys.exit(main())
