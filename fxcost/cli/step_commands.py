"""The subcommands about a model's step: demo, profile, show, compare-gpus, simulate, devices.

Each function takes the parsed arguments and imports what it needs (torch among them) when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fxcost._progress import progress_bars
from fxcost.cli.status import OK, OUT_OF_MEMORY

if TYPE_CHECKING:
    from fxcost.report import Report

__all__ = [
    "DEMO_MODELS",
    "compare_gpus_command",
    "demo_command",
    "devices_command",
    "profile_command",
    "show_command",
    "simulate_command",
]

DEMO_MODELS: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("resnet50", 8, {}),
    ("gpt2", 4, {"layers": 4, "seq": 256}),
)


def demo_command(args: argparse.Namespace) -> None:
    """Capture ResNet-50 and a GPT-2-style model, predict on several GPUs.

    On a GPU the models run there and every node is timed; on a CPU nothing is timed unless
    --measure-cpu asks (the predictions do not use CPU times), so the demo takes seconds."""
    from fxcost import zoo

    device = _default_device()
    for name, batch, config in DEMO_MODELS:
        model, inputs = zoo.build(name, batch, **config)
        if device != "cpu":
            import torch

            model, inputs = _to_device(model, inputs, torch.device(device))
        sizes = ", ".join(f"{k} {v}" for k, v in config.items() if k != "seq")
        report = _capture(name, model, inputs, args.devices, train=True, measure=_measures(args, device))
        report.name = f"{name} ({sizes})" if sizes else name
        report.print(top=args.top)
        print()


def profile_command(args: argparse.Namespace) -> None:
    """Capture one step of a model, measure it here, predict it, save the trace.

    On a GPU every node is timed (--no-measure skips it); on a CPU only with --measure-cpu: CPU
    times take minutes to take and predict nothing about GPUs, whose predictions are then
    origin-free."""
    device = args.device or _default_device()
    report = _capture_spec(args, args.devices, batch=args.batch, measure=_measures(args, device),
                           cost_model=args.cost_model, device=device)  # fmt: skip
    report.execution = args.execution
    report.print(top=args.top)
    if args.out:
        print(f"trace written to {report.save(args.out)}")


def _measures(args: argparse.Namespace, device: str) -> bool:
    """Whether to time every node on ``device``: on a GPU unless --no-measure, on the CPU only with
    --measure-cpu."""
    if device.split(":")[0] == "cpu":
        return bool(args.measure_cpu)
    return bool(getattr(args, "measure", True))


def show_command(args: argparse.Namespace) -> None:
    """Print a saved trace, predicted for any GPUs."""
    from fxcost.report import Report

    report = Report.load(args.trace)
    if args.devices or args.model:
        report = _predicted(report, args.devices or report.devices, cost_model=args.model)
    if args.execution:
        report.execution = args.execution
    report.print(top=args.top)


def _predicted(report: Report, devices: Sequence[str], cost_model: str | None = None) -> Report:
    """``report.predict(devices, cost_model)`` with a progress bar on stderr, a GPU at a time."""
    label = f"predicting {len(devices)} GPUs"
    with progress_bars() as update:
        update(label, 0, len(devices))
        return report.predict(devices, cost_model, progress=lambda done, total: update(label, done, total))


def compare_gpus_command(args: argparse.Namespace) -> None:
    """Which GPU to rent: predicted throughput and samples per dollar of a model's step.

    Captures MODEL once (as 'profile' does; or reads a saved trace, .json with a schema_version or
    .json.gz) and ranks GPUs by predicted samples per dollar, as in Habitat's case studies (Yu et al.
    §5.3). The step time is the predicted step in --execution (default: the trace's own, eager for a
    capture: the ops back to back, their launch overhead hidden by the GPU queue), not the sum of ops
    timed alone; throughput is the batch size per step."""
    from fxcost.gpus import get_device
    from fxcost.report.gpu_choice import compare_gpus, load_prices, plot, priced_devices, print_choices

    prices = load_prices(args.prices) if args.prices else {}
    devices = args.devices or priced_devices(prices)
    report = _compare_gpus_report(args, devices)
    if args.execution:
        report.execution = args.execution
    missing = [name for name in (get_device(d).name for d in devices) if name not in report.devices]
    if missing:  # a saved trace predicted for other GPUs: predicted here, with a progress bar
        report = _predicted(report, [*report.devices, *missing])
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
    batch = args.batch if args.batch is not None else 8
    mode = "training step" if args.train else "inference"
    if config is not None:
        print(f"{spec} (batch {batch}, {args.seqlen} tokens), {mode} on meta tensors")
    else:
        print(f"{spec} (batch {batch}), {mode}{f', measured on {device}' if device else ', captured on CPU'}")
    return _capture_spec(args, devices, batch=batch, measure=args.measure, device=device, config=config)


def simulate_command(args: argparse.Namespace) -> int:
    """Simulate a multi-GPU training iteration: data, tensor and pipeline parallel, ZeRO.

    Traces one step of MODEL (no GPU needed), splits it over the cluster by the strategy, and simulates
    one iteration (Proteus): time, throughput, per-stage peak memory and OOM verdict. Exit status 3
    when a rank runs out of memory (the result is printed all the same)."""
    from fxcost.sim import Strategy, simulate

    strategy = Strategy.load(args.strategy) if args.strategy.endswith((".yaml", ".yml")) else args.strategy
    if args.model.endswith(".json"):  # a Hugging Face config: simulate builds it at --batch and --seqlen
        model, inputs = args.model, None
    else:
        model, inputs = _load(args.model, args.batch)
    with progress_bars() as update:
        task = f"tracing {args.model} and simulating it on {args.cluster}"
        update(task, 0, None)
        result = simulate(model, strategy, args.cluster, example_inputs=inputs, batch=args.batch,
                          seqlen=args.seqlen, precision=args.precision, execution=args.execution)  # fmt: skip
        update(task, 1, 1)
    print(result.summary())
    if args.trace:
        print(f"timeline written to {result.to_chrome_trace(args.trace)}")
    return OUT_OF_MEMORY if result.oom else OK


def devices_command(args: argparse.Namespace) -> None:
    """List the GPUs fxcost knows."""
    from rich.table import Table

    from fxcost.cost_models.heads.sustained import clock_share, shipped_gemm_fit
    from fxcost.gpus import device_names, get_device
    from fxcost.gpus.power import process_source, tensor_clock
    from fxcost.report.table import console_for

    table = Table(title="GPUs in fxcost's database (? = unconfirmed, or a default; see Device.source_of)")
    for column in ("name", "SMs", "FP32 TFLOPS", "BF16 TFLOPS", "GEMM clock %", "tensor peak %", "spec GB/s",
                   "achieved GB/s", "memory GB", "$/h"):  # fmt: skip
        # Whole names; the headers fold where the terminal is narrow.
        table.add_column(column, justify="left" if column == "name" else "right", no_wrap=column == "name")
    watts = shipped_gemm_fit().watts
    for name in device_names():
        d = get_device(name)
        # Under the power cap (heads.sustained): the share of its boost clock a large fp32 GEMM
        # sustains, and of its tensor peaks a tensor-core one (at the fp32 clock where no source says).
        power_unsure = bool({"tdp_w", "fp32_tflops"} & d.uncertain) or "unconfirmed" in process_source(d)
        gemm_clock, capped = clock_share(d, watts), tensor_clock(d)
        tensor_facts = {"tdp_w", "bf16_tflops", "tensor_clock_mhz"}  # of the GPU and of the one stating
        tensor_unsure = (
            bool(tensor_facts & (d.uncertain | capped.stated.uncertain)) if capped else power_unsure
        )
        cells = [
            (d.num_sms, "num_sms" in d.uncertain),
            (d.fp32_tflops, "fp32_tflops" in d.uncertain),
            (d.bf16_tflops, "bf16_tflops" in d.uncertain),
            (round(100 * gemm_clock), power_unsure),
            (round(100 * (capped.share if capped else gemm_clock)), tensor_unsure),
            (d.mem_bandwidth_gbps, "mem_bandwidth_gbps" in d.uncertain),
            (d.bandwidth_gbps, d.achieved_bandwidth_gbps is None),
            (d.memory_gb, "memory_gb" in d.uncertain),
            (d.price_usd_per_hr, "price_usd_per_hr" in d.uncertain),
        ]
        table.add_row(d.name, *(_cell(value, unsure) for value, unsure in cells))
    console_for().print(table)


def _cell(value: float | None, uncertain: bool) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}{'?' if uncertain else ''}"


def _capture_spec(
    args: argparse.Namespace, devices: Sequence[str], *, batch: int, measure: bool, cost_model: str = "auto",
    device: str | None = None, config: dict[str, Any] | None = None,
) -> Report:  # fmt: skip
    """One step of MODEL (``args.model``, with ``args.train`` and ``args.seqlen``) captured and predicted
    for ``devices``, as 'profile' and 'compare-gpus' do; the report is named after MODEL.

    A Hugging Face config.json (``config``: its contents, if read already) is captured on meta tensors,
    nothing measured. A zoo name or 'module:callable' is moved to the torch ``device`` (None: left on
    the CPU it was built on) and measured there if ``measure``.
    """
    spec = args.model
    if spec.endswith(".json"):
        from fxcost.zoo.hf import hf_step

        step = hf_step(spec if config is None else config, batch, args.seqlen, train=args.train)
        report = _capture(spec, step.model, step.inputs, devices, train=args.train, measure=False,
                          cost_model=cost_model, loss_fn=step.loss_fn)  # fmt: skip
        report.routing = step.routing
    else:
        import torch

        model, inputs = _load(spec, batch)
        if device is not None:
            model, inputs = _to_device(model, inputs, torch.device(device))
        report = _capture(spec, model, inputs, devices, train=args.train, measure=measure,
                          cost_model=cost_model)  # fmt: skip
    report.name = spec
    return report


def _capture(
    label: str, model: Any, inputs: Any, devices: Sequence[str], *, train: bool, measure: bool,
    cost_model: str = "auto", loss_fn: Callable[[Any], Any] | None = None,
) -> Report:  # fmt: skip
    """``fxcost.profile`` of the step, with a progress display on stderr: a spinner while ``label`` is
    captured and predicted, a bar per graph while its nodes are timed."""
    from fxcost.capture import default_loss, profile

    task = f"capturing and predicting {label}" + (", then timing its nodes" if measure else "")
    with progress_bars() as update:
        update(task, 0, None)
        report = profile(
            model, inputs, devices=devices, train=train, measure=measure, cost_model=cost_model,
            loss_fn=loss_fn or default_loss,
            progress=lambda phase, done, total: update(f"  timing {phase} graph nodes", done, total),
        )  # fmt: skip
        update(task, 1, 1)
    return report


def _load(spec: str, batch: int) -> tuple[Any, Any]:
    """``(model, inputs)`` of a zoo name or a 'module:callable', the module imported from the current
    directory first as ``python -m`` does (the installed ``fxcost`` script does not look there)."""
    import os
    import sys

    from fxcost import zoo

    if ":" in spec and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return zoo.load(spec, batch)


def _default_device() -> str:
    """The torch device to run on when none is named: cuda if present, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _to_device(model: Any, inputs: Any, device: Any) -> tuple[Any, Any]:
    import torch
    from torch.utils._pytree import tree_map

    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    return model, tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, inputs)
