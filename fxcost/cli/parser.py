"""The ``fxcost`` command line, all of it: every subcommand and its options.

Building the parser imports neither torch nor the modules that do, so ``fxcost --help`` is instant;
each subcommand's function (:mod:`fxcost.cli.step_commands`, :mod:`fxcost.cli.data_commands`) imports
what it needs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from fxcost._version import __version__
from fxcost.cli import data_commands, step_commands
from fxcost.gpus.database import DEFAULT_DEVICES
from fxcost.kernels_triton.calibrate import DEFAULT_SIZES
from fxcost.precision import PRECISIONS

__all__ = ["DEMO_DEVICES", "parser"]

DEMO_DEVICES = (*DEFAULT_DEVICES, "T4")


class _Parser(argparse.ArgumentParser):
    """A subcommand's parser whose description may be written only when its help is shown: the zoo's
    names, which ``profile`` lists, need torch."""

    lazy_description: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.lazy_description is not None:
            self.description, self.lazy_description = self.lazy_description(), None
        return super().format_help()


def parser() -> argparse.ArgumentParser:
    """The ``fxcost`` command line: every subcommand, its options, and the function that runs it."""
    root = argparse.ArgumentParser(
        prog="fxcost",
        description="Predict how long a PyTorch training iteration takes on GPUs you may not have.",
    )
    root.add_argument("--version", action="version", version=f"fxcost {__version__}")
    sub = root.add_subparsers(title="commands", required=True, metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser("demo", help="capture ResNet-50 and a GPT-2-style model, predict on several GPUs")
    _add_devices(demo, DEMO_DEVICES)
    demo.add_argument("--top", type=int, default=15, help="rows of the node table per model (default 15)")
    demo.set_defaults(run=step_commands.demo_command)

    profile = cast(_Parser, sub.add_parser(
        "profile", help="capture one step of a model, measure it here, predict it, save the trace"
    ))  # fmt: skip
    profile.lazy_description = lambda: (
        f"MODEL is a built-in example ({', '.join(_zoo_names())}), 'module:callable' returning "
        "(model, inputs) (the callable receives batch=N if it takes a 'batch' argument), or a Hugging "
        "Face config.json: that model is captured on meta tensors (any size; nothing is measured) with "
        "--seqlen tokens of input."
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
    _add_devices(profile, DEFAULT_DEVICES)
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
    profile.set_defaults(run=step_commands.profile_command)

    show = sub.add_parser("show", help="print a saved trace, predicted for any GPUs")
    show.add_argument("trace")
    show.add_argument("--devices", nargs="+", metavar="GPU", help="GPUs to predict (default: the trace's)")
    show.add_argument("--top", type=int, default=None, help="only the N most expensive nodes")
    show.add_argument(
        "--model",
        help="cost model or comma-separated fallback chain (default: the trace's, normally 'auto': "
        "a trace measured on a GPU is scaled runtime-based to the others)",
    )
    show.set_defaults(run=step_commands.show_command)

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
    train.set_defaults(run=data_commands.train_command)

    devices = sub.add_parser("devices", help="list the GPUs fxcost knows")
    devices.set_defaults(run=step_commands.devices_command)

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
    fit_runs.set_defaults(run=data_commands.fit_runs_command)

    compare = sub.add_parser(
        "compare",
        help="every op-level predictor on the same held-out rows, one table",
        description="MAPE (%%) per op class of the roofline, Justus et al., Habitat's wave scaling, and "
        "fxcost's default without and with an origin GPU, on DIR's held-out rows (see fxcost.train.compare).",
    )
    compare.add_argument("--data", required=True, metavar="DIR", help="measurement directory (shared layout)")
    compare.add_argument("--ops", nargs="+", help="op classes (default: all)")
    compare.set_defaults(run=data_commands.compare_command)

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
    gpus.set_defaults(run=step_commands.compare_gpus_command)

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
    sim.add_argument("--precision", choices=list(PRECISIONS), default=None)
    sim.add_argument("--trace", metavar="JSON", help="write the simulated timeline for Perfetto here")
    sim.set_defaults(run=step_commands.simulate_command)

    calibrate = sub.add_parser(
        "calibrate",
        help="measure this GPU's bandwidth, FMA and tensor-core rates, launch floor; write a device profile",
        description="Times Triton copy/triad (several sizes), FMA, tl.dot, empty and L2 kernels on the GPU "
        "and prints them; --out writes a YAML device file (load it with FXCOST_DEVICES or "
        "fxcost.gpus.load_devices).",
    )
    calibrate.add_argument("--out", metavar="YAML", help="write the device profile here")
    calibrate.add_argument(
        "--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), metavar="N",
        help="fp32 elements per buffer for copy and triad (default: 2^22 2^24 2^26 2^28)",
    )  # fmt: skip
    calibrate.add_argument(
        "--repeats", type=int, default=10, help="minimum timed runs per kernel (default 10)"
    )
    calibrate.add_argument("--device", default="cuda", help="CUDA device (default: cuda)")
    calibrate.add_argument("--name", help="device name in the profile (default: the GPU's name)")
    calibrate.add_argument("--base", help="known device a new --name starts from")
    calibrate.set_defaults(run=data_commands.calibrate_command)

    collect = sub.add_parser(
        "collect",
        help="measure random op configurations here into CSVs of the shared-data schema",
        description="Measure random configurations of each op on this machine and append them to "
        "DIR/ops/<op>/<Device>.csv (the layout and columns of shared/data/neusight/ops).",
    )
    ops_help = "comma-separated: linear,bmm,conv,elementwise,ln,softmax or single elementwise ops (add, ...)"
    collect.add_argument("--ops", required=True, help=ops_help)
    collect.add_argument("--samples", type=int, required=True, help="configurations per op")
    collect.add_argument("--out", type=Path, required=True, metavar="DIR", help="data directory")
    collect.add_argument("--no-resume", dest="resume", action="store_false", help="overwrite existing files")
    collect.add_argument("--seed", type=int, default=0, help="configuration sequence (default 0)")
    collect.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="default cuda")
    no_kernels = "leave the kernel columns empty (skips one profiled call per configuration)"
    collect.add_argument("--no-kernels", dest="kernels", action="store_false", help=no_kernels)
    collect.set_defaults(run=data_commands.collect_command)
    return root


def _add_devices(parser: argparse.ArgumentParser, default: Sequence[str]) -> None:
    parser.add_argument(
        "--devices", nargs="+", default=list(default), metavar="GPU",
        help=f"GPUs to predict for (default: {' '.join(default)}); see 'fxcost devices'",
    )  # fmt: skip


def _zoo_names() -> list[str]:
    from fxcost import zoo

    return zoo.names()
