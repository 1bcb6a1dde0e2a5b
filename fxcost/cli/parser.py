"""The ``fxcost`` command line, all of it: every subcommand and its options.

Building the parser imports neither torch nor the modules that do, so ``fxcost --help`` is instant;
each subcommand's function (:mod:`fxcost.cli.step_commands`, :mod:`fxcost.cli.data_commands`) imports
what it needs.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

from fxcost._version import __version__
from fxcost.cli import data_commands, plan_commands, step_commands
from fxcost.cli.status import BAD_INPUT, EXIT_STATUSES
from fxcost.execution import EXECUTIONS
from fxcost.gpus import DEFAULT_DEVICES
from fxcost.kernels_triton.calibrate import DEFAULT_SIZES
from fxcost.precision import PRECISIONS

__all__ = ["DEMO_DEVICES", "exit_statuses_text", "parser", "positive_int"]

DEMO_DEVICES = (*DEFAULT_DEVICES, "T4")


class _OneLineErrors(argparse.ArgumentParser):
    """A parser whose usage errors are one line on stderr, exit status ``BAD_INPUT``, as every other
    error of the command (argparse's own print the usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


class _Parser(_OneLineErrors):
    """A subcommand's parser whose description may be written only when its help is shown: the zoo's
    names, which ``profile`` lists, need torch."""

    lazy_description: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.lazy_description is not None:
            self.description, self.lazy_description = self.lazy_description(), None
        return super().format_help()


def parser() -> argparse.ArgumentParser:
    """The ``fxcost`` command line: every subcommand, its options, and the function that runs it."""
    root = _OneLineErrors(
        prog="fxcost",
        description="Predict how long a PyTorch training iteration takes on GPUs you may not have.",
        epilog=exit_statuses_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument("--version", action="version", version=f"fxcost {__version__}")
    sub = root.add_subparsers(title="commands", required=True, metavar="COMMAND", parser_class=_Parser)
    _step_commands(sub)
    _data_commands(sub)
    return root


def exit_statuses_text() -> str:
    """The exit statuses as ``fxcost --help`` ends with them (and the README lists them)."""
    return "exit status:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_STATUSES.items())


def positive_int(text: str) -> int:
    """An argument that must be a whole number >= 1 (a batch, a count of rows or repetitions)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _step_commands(sub: Any) -> None:
    """demo, profile, show, compare-gpus, simulate, plan, devices."""
    demo = _command(sub, step_commands.demo_command)
    _add_devices(demo, DEMO_DEVICES)
    demo.add_argument(
        "--top", type=positive_int, default=15, help="rows of the node table per model (default 15)"
    )
    demo.add_argument("--measure-cpu", action="store_true", help=MEASURE_CPU_HELP)

    profile = _command(sub, step_commands.profile_command)
    profile.lazy_description = lambda: (
        f"MODEL is a built-in example ({', '.join(_zoo_names())}), 'module:callable' returning "
        "(model, inputs) (the callable receives batch=N if it takes a 'batch' argument), or a Hugging "
        "Face config.json: that model is captured on meta tensors (any size; nothing is measured) with "
        "--seqlen tokens of input."
    )
    _step_options(profile, batch=8, seqlen=512)
    _flag(profile, "--measure", True, "time every node when running on a GPU (default on)")
    profile.add_argument("--measure-cpu", action="store_true", help=MEASURE_CPU_HELP)
    _add_devices(profile, DEFAULT_DEVICES)
    profile.add_argument("--out", help="write the trace here (JSON; .json.gz compresses)")
    profile.add_argument("--model", dest="cost_model", default="auto", help=COST_MODEL_HELP)
    profile.add_argument("--top", type=positive_int, default=20, help="rows of the node table (default 20)")
    profile.add_argument("--device", default=None, help="run on this torch device (default: cuda if present)")
    _add_execution(profile, "eager")

    show = _command(sub, step_commands.show_command)
    show.add_argument("trace")
    show.add_argument("--devices", nargs="+", metavar="GPU", help="GPUs to predict (default: the trace's)")
    show.add_argument("--top", type=positive_int, default=None, help="only the N most expensive nodes")
    show.add_argument("--model", help=SHOW_MODEL_HELP)
    _add_execution(show, None)

    gpus = _command(sub, step_commands.compare_gpus_command)
    _step_options(gpus, batch=None, seqlen=512, model_help="zoo name, 'module:callable', HF config.json or "
                  "trace", batch_help="batch size (default 8; a trace's own if it records one)")  # fmt: skip
    _flag(gpus, "--measure", False, MEASURE_FIRST_HELP)
    gpus.add_argument("--devices", nargs="+", metavar="GPU", help=PRICED_DEVICES_HELP)
    gpus.add_argument("--prices", metavar="YAML", help=PRICES_HELP)
    gpus.add_argument("--plot", metavar="PNG", help="write throughput and samples-per-$ bar charts here")
    _add_execution(gpus, None)

    sim = _command(sub, step_commands.simulate_command)
    _step_options(sim, batch=8, seqlen=1024, model_help="zoo name, 'module:callable' or Hugging Face "
                  "config.json", batch_help="global batch size (default 8)", train=False)  # fmt: skip
    sim.add_argument("--cluster", required=True, help="NODESxGPUSxDEVICE, e.g. 2x8xA100-SXM4-80GB")
    sim.add_argument("--strategy", required=True, help=STRATEGY_HELP)
    sim.add_argument("--precision", choices=list(PRECISIONS), default=None)
    sim.add_argument("--trace", metavar="JSON", help="write the simulated timeline for Perfetto here")
    _add_execution(sim, "eager")

    search = _command(sub, plan_commands.plan_command)
    search.add_argument("model", metavar="MODEL", help="llama-8b, llama-70b, gpt3-1.3b, gpt3-175b, "
                        "mixtral-8x7b, deepseek-v3 or a Hugging Face config.json of a decoder")  # fmt: skip
    search.add_argument("--cluster", required=True, help="NODESxGPUSxDEVICE, e.g. 128x8xH100-SXM")
    search.add_argument("--batch", type=positive_int, required=True, help="global batch (sequences)")
    search.add_argument("--seqlen", type=positive_int, default=None, help="tokens per sequence (default: "
                        "the model's context)")  # fmt: skip
    search.add_argument("--precision", choices=list(PRECISIONS), default="bf16", help="default bf16")
    search.add_argument("--top", type=positive_int, default=10, help="plans printed (default 10)")
    search.add_argument("--exact", type=positive_int, default=3,
                        help="fastest fitting plans simulated exactly (default 3)")  # fmt: skip
    search.add_argument("--csv", metavar="PATH", help="write every candidate here")

    _command(sub, step_commands.devices_command)


def _data_commands(sub: Any) -> None:
    """train, fit-runs, compare, calibrate, collect."""
    train = _command(sub, data_commands.train_command)
    train.add_argument(
        "--data", action="append", required=True, metavar="DIR", help="data directory (repeatable)"
    )
    train.add_argument("--out", required=True, metavar="DIR")
    train.add_argument("--ops", nargs="+", metavar="HEAD", help="heads to train (default: all)")
    train.add_argument(
        "--exclude-devices", nargs="+", default=[], metavar="GPU", help="also leave these GPUs out"
    )
    train.add_argument("--include-held-out", action="store_true", help=INCLUDE_HELD_OUT_HELP)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--epochs", type=positive_int, default=None, help="epochs per head (default: the study's choice)"
    )

    fit_runs = _command(sub, data_commands.fit_runs_command)
    fit_runs.add_argument("runs", help="CSV with one row per run")
    fit_runs.add_argument("--target", required=True, help="column to predict, e.g. time_s")
    fit_runs.add_argument(
        "--features", nargs="+", help="feature columns (default: those of I B G P T D N present)"
    )
    for name, p in (("--p-enter", 0.05), ("--p-remove", 0.10)):
        fit_runs.add_argument(name, type=float, default=p)

    compare = _command(sub, data_commands.compare_command)
    compare.add_argument("--data", required=True, metavar="DIR", help="measurement directory (shared layout)")
    compare.add_argument("--ops", nargs="+", help="op classes (default: all)")

    calibrate = _command(sub, data_commands.calibrate_command)
    calibrate.add_argument("--out", metavar="YAML", help="write the device profile here")
    calibrate.add_argument(
        "--sizes", type=positive_int, nargs="+", default=list(DEFAULT_SIZES), metavar="N", help=SIZES_HELP
    )
    calibrate.add_argument(
        "--repeats", type=positive_int, default=10, help="minimum timed runs per kernel (default 10)"
    )
    calibrate.add_argument("--device", default="cuda", help="CUDA device (default: cuda)")
    calibrate.add_argument("--name", help="device name in the profile (default: the GPU's name)")
    calibrate.add_argument("--base", help="known device a new --name starts from")

    collect = _command(sub, data_commands.collect_command)
    collect.add_argument("--ops", required=True, help=OPS_HELP)
    collect.add_argument("--samples", type=positive_int, required=True, help="configurations per op")
    collect.add_argument("--out", type=Path, required=True, metavar="DIR", help="data directory")
    collect.add_argument("--no-resume", dest="resume", action="store_false", help="overwrite existing files")
    collect.add_argument("--seed", type=int, default=0, help="configuration sequence (default 0)")
    collect.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="default cuda")
    collect.add_argument("--no-kernels", dest="kernels", action="store_false", help=NO_KERNELS_HELP)
    collect.add_argument("--precision", choices=list(PRECISIONS), default="fp32", help=COLLECT_PRECISION_HELP)
    collect.add_argument("--max-seconds", type=float, default=None, metavar="S", help=MAX_SECONDS_HELP)


COST_MODEL_HELP = (
    "cost model or comma-separated fallback chain (default: auto, the prediction policy: on a GPU wave "
    "scaling for measured kernel-alike nodes and the origin-free model's ratio for matmuls/convolutions, "
    "elsewhere the origin-free model (tiled GEMMs and MLP heads); the roofline for the rest)"
)
SHOW_MODEL_HELP = (
    "cost model or comma-separated fallback chain (default: the trace's, normally 'auto': a trace "
    "measured on a GPU is scaled runtime-based to the others)"
)
MEASURE_FIRST_HELP = (
    "time every node on this machine's device first (default off: one capture predicts every GPU)"
)
MEASURE_CPU_HELP = (
    "time every node when running on the CPU (default off: minutes for a large model, and CPU times "
    "predict nothing about GPUs)"
)
PRICES_HELP = "USD per hour by GPU name, overriding the database's prices"
PRICED_DEVICES_HELP = "GPUs to compare (default: every GPU with a price); see 'fxcost devices'"
STRATEGY_HELP = (
    "'dp=2,tp=4,pp=2,mb=8,zero=1[,schedule=gpipe][,recompute=none|selective|ops|full][,sp=1][,overlap=0][,vpp=2][,shard=4]"
    "[,ep=2][,expert_load=0.4/0.2/0.2/0.2][,cp=2]' "
    "or a YAML file"
)
INCLUDE_HELD_OUT_HELP = (
    "train on H100, L4 and A100-80GB rows too (your own heads; the shipped ones never are)"
)
SIZES_HELP = "fp32 elements per buffer for copy and triad (default: 2^22 2^24 2^26 2^28)"
OPS_HELP = (
    "comma-separated: linear,bmm,conv,elementwise,ln,softmax,sdpa,sdpa_bwd or single elementwise ops "
    "(add, ...)"
)
NO_KERNELS_HELP = "leave the kernel columns empty (skips one profiled call per configuration)"
COLLECT_PRECISION_HELP = (
    "fp32 (TF32 off, as the shared data; default), tf32 (fp32 tensors, TF32 on), bf16 or fp16 tensors; "
    "rows of any but fp32 go to DIR/<precision>/ops/ with a Precision column"
)
MAX_SECONDS_HELP = "stop cleanly after S seconds, between two configurations (rows written are kept)"


def _command(sub: Any, run: Callable[[argparse.Namespace], Any]) -> _Parser:
    """The subcommand ``run`` runs (``compare_gpus_command`` is ``compare-gpus``): its help is the first
    line of the function's docstring, its description the rest."""
    name = run.__name__.removesuffix("_command").replace("_", "-")
    summary, _, details = inspect.cleandoc(run.__doc__ or "").partition("\n\n")
    help = summary[:1].lower() + summary[1:].removesuffix(".")
    description = " ".join(details.split()) or None
    # argparse %-formats help texts (not descriptions): a literal % is written %%.
    command = cast(_Parser, sub.add_parser(name, help=help.replace("%", "%%"), description=description))
    command.set_defaults(run=run)
    return command


def _step_options(
    parser: argparse.ArgumentParser, *, batch: int | None, seqlen: int, model_help: str | None = None,
    batch_help: str | None = None, train: bool = True,
) -> None:  # fmt: skip
    """MODEL and the step it is captured at: --batch, --seqlen (Hugging Face configs), --train."""
    parser.add_argument("model", metavar="MODEL", help=model_help)
    parser.add_argument(
        "--batch", type=positive_int, default=batch, help=batch_help or f"batch size (default {batch})"
    )
    parser.add_argument(
        "--seqlen",
        type=positive_int,
        default=seqlen,
        help=f"tokens per sequence, HF configs (default {seqlen})",
    )
    if train:
        _flag(
            parser,
            "--train",
            True,
            "a training step: forward, loss, backward (default); --no-train for inference",
        )


def _flag(parser: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
    parser.add_argument(name, action=argparse.BooleanOptionalAction, default=default, help=help)


def _add_execution(parser: argparse.ArgumentParser, default: str | None) -> None:
    shown = f"default {default}" if default else "default: the trace's own"
    parser.add_argument(
        "--execution", choices=list(EXECUTIONS), default=default,
        help=f"how the step runs: op by op (eager), torch.compile with Inductor's fused kernels "
        f"(compiled), or without host gaps (cudagraphs); {shown}",
    )  # fmt: skip


def _add_devices(parser: argparse.ArgumentParser, default: Sequence[str]) -> None:
    parser.add_argument(
        "--devices", nargs="+", default=list(default), metavar="GPU",
        help=f"GPUs to predict for (default: {' '.join(default)}); see 'fxcost devices'",
    )  # fmt: skip


def _zoo_names() -> list[str]:
    from fxcost import zoo

    return zoo.names()
