"""Report printouts: the per-node table (in the manner of ``GraphModule.print_tabular``) and totals."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

from rich import box
from rich.console import Console
from rich.table import Table

from fxcost.cost_models.heads import spec_sheet_caveat
from fxcost.gpus import get_device
from fxcost.records import NodeCost

if TYPE_CHECKING:
    from fxcost.report.trace import Report

__all__ = ["console_for", "format_interval", "print_report", "spec_sheet_caveats"]

_UNBOUNDED_WIDTH = 1000


def print_report(report: Report, top: int | None = None, file: TextIO | None = None) -> None:
    """Print ``report``'s node table, then totals for fw, bw, opt and all (sums of isolated node times)
    and the eager step, then coverage and fidelity."""
    console = console_for(file)
    nodes = _selected(report, top)
    console.print(_node_table(report, nodes, top))
    console.print(_totals_table(report))
    for line in _summary_lines(report):
        console.print(line)


def console_for(file: TextIO | None = None) -> Console:
    """A console for tables: the terminal's width, or for a file or a pipe as wide as tables need."""
    console = Console(file=file, highlight=False)
    if not console.is_terminal:
        console = Console(file=file, highlight=False, width=_UNBOUNDED_WIDTH)
    return console


def _selected(report: Report, top: int | None) -> list[tuple[int, NodeCost]]:
    indexed = list(enumerate(report.nodes))
    if top is None:
        return indexed
    if top < 1:
        raise ValueError(f"top must be a positive number of rows, got {top}")

    def cost(item: tuple[int, NodeCost]) -> float:
        n = item[1]
        if n.origin_ms is not None:
            return n.origin_ms
        return max((v for v in n.pred_ms.values() if v is not None), default=0.0)

    return sorted(indexed, key=cost, reverse=True)[:top]


def _node_table(report: Report, nodes: list[tuple[int, NodeCost]], top: int | None) -> Table:
    multi_graph = len(report.graphs) > 1
    title = f"fxcost: {len(report.nodes)} nodes in {len(report.graphs)} graph(s)"
    if top is not None:
        title += f", the {len(nodes)} most expensive"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for header, width in [("#", None), ("node", 26), ("op", 28), ("phase", None), ("module", 22),
                          ("output", 24)]:  # fmt: skip
        table.add_column(header, max_width=width, no_wrap=True, overflow="ellipsis")
    for header in ["GFLOP", "MB", f"{report.origin} ms", *(f"{d} ms" for d in report.devices)]:
        table.add_column(header, justify="right", no_wrap=True)
    for i, n in nodes:
        name = f"g{n.graph}/{n.name}" if multi_graph else n.name
        output = " ".join("x".join(map(str, s)) or "scalar" for s in n.out_shapes[:2])
        table.add_row(
            str(i),
            name,
            n.op.removeprefix("aten.").removesuffix(".default"),
            n.phase,
            n.module,
            output,
            _num(n.flops, 1e9, ".3f"),
            _num(n.bytes, 1e6, ".2f"),
            _num(n.origin_ms, 1, ".4f"),
            *(_num(n.pred_ms.get(d), 1, ".4f") for d in report.devices),
        )
    return table


def _totals_table(report: Report) -> Table:
    table = Table(title="totals (ms)", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("phase")
    table.add_column("nodes", justify="right")
    table.add_column(f"{report.origin} (measured)", justify="right")
    for device in report.devices:
        table.add_column(device, justify="right")
    for phase in [*report.phases(), None]:
        count = len(report.nodes) if phase is None else sum(n.phase == phase for n in report.nodes)
        table.add_row(
            phase or "all",
            str(count),
            _num(report.origin_ms(phase), 1, ".3f"),
            *(f"{report.total_ms(d, phase):.3f}" for d in report.devices),
            style="bold" if phase is None else None,
        )
    # The same nodes run back to back as an eager step runs them (no per-op timing overhead).
    eager = {d: report.eager_ms(d) for d in report.devices}
    table.add_row("eager step", "", _num(report.step_ms, 1, ".3f"),
                  *(f"{eager[d]:.3f}" for d in report.devices), style="bold")  # fmt: skip
    # How far a GPU nobody measured may be from it: the nominal 80% interval of origin-free predictions.
    intervals = (report.eager_interval_ms(d, eager_ms=eager[d]) for d in report.devices)
    table.add_row("  80% interval", "", "", *(format_interval(*bounds) for bounds in intervals))
    # Independent ops overlapped on as many streams as they need: the bound multi-stream work meets.
    table.add_row("critical path", "", "", *(f"{report.critical_path_ms(d):.3f}" for d in report.devices))
    return table


def _summary_lines(report: Report) -> list[str]:
    lines = []
    if report.devices:
        covered = ", ".join(f"{d} {report.coverage(d):.0%}" for d in report.devices)
        lines.append(f"predicted by: {report.model}; coverage of kernel nodes: {covered}")
    lines.extend(spec_sheet_caveats(report.devices))
    if report.apart:
        lines.append(
            f"not in this step: {len(report.apart)} captured graph(s) it did not run (a branch not "
            "taken), left out of every figure above (report.apart)"
        )
    fidelity = report.capture_fidelity
    if fidelity is not None:
        against = "the eager step" if report.step_ms is not None else "the graphs run whole"
        lines.append(
            f"capture fidelity: sum of node times {report.origin_ms():.3f} ms / "
            f"{against} {report.measured_ms:.3f} ms = {fidelity:.3f}"
        )
    return lines


def spec_sheet_caveats(devices: Iterable[str]) -> list[str]:
    """One line per GPU no training GPU resembles: its figures rest on spec sheets alone."""
    return [line for line in (spec_sheet_caveat(get_device(d)) for d in devices) if line]


def format_interval(low: float, high: float) -> str:
    """``low-high`` in ms, ``-`` where no interval was computed."""
    return "-" if math.isnan(low) else f"{low:.3f}-{high:.3f}"


def _num(value: float | None, scale: float, fmt: str) -> str:
    return "-" if value is None else format(value / scale, fmt)
