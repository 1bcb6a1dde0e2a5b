"""Which GPU to rent: predicted throughput and cost-normalized throughput of one step (Habitat §5.3).

From one captured :class:`~fxcost.report.Report`, every GPU gets its predicted step time, its
throughput (``report.batch`` samples per step) and, where it has an hourly price, samples per dollar:
Habitat's throughput divided by the hourly cost of renting the GPU (§5, Figures 7-8). The step time is
``Report.step_ms_in``, the whole step in the report's execution mode (eager, compiled, cudagraphs),
rather than ``total_ms``: the latter adds up ops timed one by one, each with a launch overhead that
the GPU queue hides when they run back to back.

A GPU no measurement of which went into the heads, predicted without a GPU origin to scale from, has
figures that rest on spec sheets alone (``GpuChoice.spec_sheet_only``): the printout marks it and
says so, since such a GPU can top the ranking on its spec sheet's word only.

Prices come from the device database (``price_usd_per_hr``, a typical cloud on-demand price) and can be
overridden per GPU, e.g. with your provider's prices from a YAML file (:func:`load_prices`).

Example:
    >>> import fxcost
    >>> from fxcost import zoo
    >>> from fxcost.report.gpu_choice import compare_gpus, print_choices
    >>> report = fxcost.profile(*zoo.build("mlp", 8), devices=["T4", "L4"], measure=False)
    >>> choices = compare_gpus(report, ["T4", "L4"], prices={"L4": 0.70})
    >>> print_choices(choices)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fxcost.cost_models.heads import trained_devices, unlike_training
from fxcost.gpus import Device, UnknownDeviceError, device_names, get_device
from fxcost.report.header import spec_sheet_only

if TYPE_CHECKING:
    from fxcost.report.trace import Report

__all__ = ["GpuChoice", "compare_gpus", "load_prices", "plot", "priced_devices", "print_choices"]


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """One GPU's predicted step time, throughput and cost efficiency.

    Attributes:
        device: canonical device name.
        step_ms: predicted time of one step in the report's execution mode (``Report.step_ms_in``).
        samples_per_s: throughput, the report's batch size per step.
        usd_per_hr: hourly price used, or None if the GPU has none.
        samples_per_usd: cost-normalized throughput, ``samples_per_s * 3600 / usd_per_hr``, or None.
        price_unconfirmed: the price is a database value marked unconfirmed (``?`` in ``gpus.csv``).
        step_low_ms, step_high_ms: the nominal 80% interval of ``step_ms`` (``Report.eager_interval_ms``).
        spec_sheet_only: nothing measured on this GPU informs its figures: no measurement of it went
            into the heads, and it is predicted without a GPU origin (or is of a vendor the heads never
            saw, :func:`~fxcost.cost_models.heads.unlike_training`).
    """

    device: str
    step_ms: float
    samples_per_s: float
    usd_per_hr: float | None
    samples_per_usd: float | None
    price_unconfirmed: bool = False
    step_low_ms: float = math.nan
    step_high_ms: float = math.nan
    spec_sheet_only: bool = False


def load_prices(path: str | os.PathLike[str]) -> dict[str, float]:
    """Read ``{device name or alias: usd_per_hr}`` from a YAML file; keys become canonical names.

    Raises:
        ValueError: the file is not such a mapping, names an unknown device or has a non-positive price.
    """
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of device names to USD per hour")
    return _canonical_prices(data, where=str(path))


def priced_devices(prices: Mapping[str, float] | None = None) -> list[str]:
    """Canonical names of the GPUs with a price, in the database's or ``prices``, in table order."""
    overridden = _canonical_prices(prices or {})
    return [d for d in device_names() if d in overridden or get_device(d).price_usd_per_hr is not None]


def compare_gpus(
    report: Report, devices: Iterable[str | Device] | None = None, prices: Mapping[str, float] | None = None
) -> list[GpuChoice]:
    """Each GPU's predicted throughput and samples per dollar, best value first.

    Args:
        report: a captured step with its batch size; devices it has no predictions for are predicted.
        devices: GPUs to compare (default: :func:`priced_devices`).
        prices: USD per hour by device name or alias, overriding the database's prices.

    Returns:
        One choice per device, by samples per dollar (highest first), then the GPUs without a price
        by throughput.
    """
    batch = report.batch
    if batch is None:
        raise ValueError("the report records no batch size; set report.batch to compare throughputs")
    overridden = _canonical_prices(prices or {})
    names = list(dict.fromkeys(get_device(d).name for d in (devices or priced_devices(overridden))))
    missing = [d for d in names if d not in report.devices]
    if missing:
        report = report.predict([*report.devices, *missing])
    choices = [_choice(report, batch, get_device(d), overridden) for d in names]
    return sorted(choices, key=_best_value_first)


def print_choices(choices: Sequence[GpuChoice], file: TextIO | None = None) -> None:
    """Print ``choices`` as a table, in their order, and name the fastest and the best-value GPU."""
    from rich import box
    from rich.table import Table

    from fxcost.report.table import console_for, format_interval, spec_sheet_caveats

    table = Table(title="GPUs by samples per dollar (? = unconfirmed price, * = spec sheets alone)",
                  box=box.SIMPLE_HEAD, title_justify="left")  # fmt: skip
    table.add_column("#", justify="right")
    table.add_column("GPU")
    for header in ("step ms", "80% interval", "samples/s", "$/h", "samples/$"):
        table.add_column(header, justify="right")
    for rank, c in enumerate(choices, 1):
        price = "-" if c.usd_per_hr is None else f"{c.usd_per_hr:.2f}{'?' if c.price_unconfirmed else ''}"
        per_usd = "-" if c.samples_per_usd is None else f"{c.samples_per_usd:,.0f}"
        interval = format_interval(c.step_low_ms, c.step_high_ms)
        rate = f"{c.samples_per_s:,.1f}"
        table.add_row(str(rank), _name(c), f"{c.step_ms:.3f}", interval, rate, price, per_usd)
    console = console_for(file)
    console.print(table)
    if choices:
        fastest = _name(max(choices, key=lambda c: c.samples_per_s))
        cheapest = min(choices, key=_best_value_first)
        best_value = _name(cheapest) if cheapest.samples_per_usd is not None else "- (no prices)"
        console.print(f"fastest: {fastest}; most samples per dollar: {best_value}")
    console.print("step: the predicted eager step (op times back to back, launch overhead hidden); "
                  "a sample is one entry of the batch")  # fmt: skip
    untrained = [c.device for c in choices if c.spec_sheet_only and not unlike_training(get_device(c.device))]
    if untrained:
        console.print(
            f"* spec sheets alone: no measurement of {', '.join(untrained)} went into the heads and none "
            "was taken here; their times scale from spec-sheet rates with efficiencies learned on "
            f"{', '.join(sorted(trained_devices()))}"
        )
    for line in spec_sheet_caveats(c.device for c in choices):
        console.print("* " + line)


def plot(choices: Sequence[GpuChoice], path: str | os.PathLike[str], title: str = "") -> Path:
    """Save two bar charts to ``path`` (format from its suffix): throughput, highest first, and
    samples per dollar for the GPUs with a price, highest first (as Habitat's Figures 7-8). A GPU
    whose figures rest on spec sheets alone is named with a ``*``. Returns the path.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'fxcost[plot]'") from e

    fastest, priced = _chart_orders(choices)
    figure = Figure(figsize=(max(6.0, 0.6 * len(choices) + 2), 7), layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself: rendering without pyplot's global state
    top, bottom = figure.subplots(2, 1)
    panels = [(top, fastest, [c.samples_per_s for c in fastest], "samples / s", "throughput"),
              (bottom, priced, [c.samples_per_usd or 0.0 for c in priced], "samples / $",
               "cost-normalized throughput")]  # fmt: skip
    for axes, shown, values, ylabel, name in panels:
        bars = axes.bar(range(len(shown)), values, color="tab:blue" if axes is top else "tab:green")
        axes.bar_label(bars, fmt="{:,.0f}", fontsize=7)
        axes.set_xticks(range(len(shown)), [_name(c) for c in shown], rotation=45, ha="right", fontsize=8)
        axes.yaxis.set_major_formatter("{x:,.0f}")
        axes.margins(y=0.12)  # room for the labels above the tallest bar
        axes.set_ylabel(ylabel)
        axes.set_title(name, loc="left")
    if title:
        figure.suptitle(title)
    out = Path(path)
    figure.savefig(out, dpi=120)
    return out


def _choice(report: Report, batch: int, device: Device, prices: Mapping[str, float]) -> GpuChoice:
    step_ms = report.step_ms_in(device)
    if step_ms <= 0:
        raise ValueError(f"predicted step time on {device.name} is {step_ms} ms; no throughput to compare")
    samples_per_s = batch / step_ms * 1000
    price = prices.get(device.name, device.price_usd_per_hr)
    unconfirmed = device.name not in prices and "price_usd_per_hr" in device.uncertain
    per_usd = samples_per_s * 3600 / price if price else None
    low, high = report.eager_interval_ms(device, eager_ms=step_ms)
    return GpuChoice(device.name, step_ms, samples_per_s, price, per_usd, unconfirmed, low, high,
                     spec_sheet_only(report, device))  # fmt: skip


def _chart_orders(choices: Sequence[GpuChoice]) -> tuple[list[GpuChoice], list[GpuChoice]]:
    """The bars of each chart: every GPU by throughput, and the priced ones by samples per dollar."""
    fastest = sorted(choices, key=lambda c: -c.samples_per_s)
    priced = sorted((c for c in choices if c.samples_per_usd is not None), key=_best_value_first)
    return fastest, priced


def _name(c: GpuChoice) -> str:
    return f"{c.device}*" if c.spec_sheet_only else c.device


def _best_value_first(c: GpuChoice) -> tuple[bool, float, float]:
    return c.samples_per_usd is None, -(c.samples_per_usd or 0.0), -c.samples_per_s


def _canonical_prices(prices: Mapping[Any, object], where: str = "prices") -> dict[str, float]:
    out = {}
    for name, price in prices.items():
        try:
            canonical = get_device(str(name)).name
        except UnknownDeviceError:
            raise ValueError(
                f"{where}: unknown device {name!r}; accepted: {', '.join(device_names())} "
                "(or their aliases, see 'fxcost devices')"
            ) from None
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price <= 0:
            raise ValueError(f"{where}: {name}: the price must be a positive number of USD per hour, "
                             f"got {price!r}")  # fmt: skip
        out[canonical] = float(price)
    return out
