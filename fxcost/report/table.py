"""Report printouts: a header saying what was captured and how it is predicted, the per-node table (in
the manner of ``GraphModule.print_tabular``) and the totals.

Tables fit the terminal, or :data:`WIDTH` columns when written to a file or a pipe: where the columns
do not fit, the least useful ones go first (op, MB, phase, module), and shapes are abbreviated, never
cut.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table

from fxcost.cost_models.heads import spec_sheet_caveat
from fxcost.gpus import get_device
from fxcost.records import NodeCost
from fxcost.report.header import header_lines, origin_name

if TYPE_CHECKING:
    from fxcost.report.trace import Report

__all__ = [
    "WIDTH",
    "console_for",
    "format_interval",
    "fused_kernel_lines",
    "print_report",
    "shape_text",
    "spec_sheet_caveats",
]

WIDTH = 120
"""Columns of a printout written to a file or a pipe (a terminal's own width is used on a terminal)."""

_DROPPABLE = ("op", "MB", "phase", "module")  # left out in this order while a table is too wide
_MODULE_WIDTH = 22


def print_report(report: Report, top: int | None = None, file: TextIO | None = None) -> None:
    """Print ``report``: a header (what was captured, in what precision, where each prediction comes
    from), the node table (``top``: the N nodes slowest on the first GPU), the totals for fw, bw, opt
    and all (sums of isolated node times) and the eager step, then coverage and fidelity."""
    console = console_for(file)
    rows = _selected(report, top)
    for line in header_lines(report):
        console.print(line)
    console.print(_node_table(report, rows, top, console))
    if report.execution == "compiled":
        for line in fused_kernel_lines(report, top):
            console.print(line)
    console.print(_totals_table(report))
    for line in _summary_lines(report):
        console.print(line)


def console_for(file: TextIO | None = None) -> Console:
    """A console for tables: the terminal's width, or :data:`WIDTH` columns for a file or a pipe."""
    console = Console(file=file, highlight=False, markup=False)
    if not console.is_terminal:
        console = Console(file=file, highlight=False, markup=False, width=WIDTH)
    return console


def _selected(report: Report, top: int | None) -> list[NodeCost]:
    """All nodes in graph order, or the ``top`` slowest on the first GPU (measured time without one)."""
    if top is None:
        return list(report.nodes)
    if top < 1:
        raise ValueError(f"top must be a positive number of rows, got {top}")
    return sorted(report.nodes, key=_sort_key(report), reverse=True)[:top]


def _sort_key(report: Report) -> Callable[[NodeCost], float]:
    first = report.devices[0] if report.devices else None

    def cost(n: NodeCost) -> float:
        value = n.pred_ms.get(first) if first is not None else n.origin_ms
        return -math.inf if value is None else value

    return cost


@dataclass(frozen=True)
class _Column:
    header: str
    cells: list[str]
    numeric: bool = False
    shrinks: bool = False  # may be cut short (with an ellipsis) if the table is still too wide


def _node_table(report: Report, rows: Sequence[NodeCost], top: int | None, console: Console) -> Table:
    columns = _node_columns(report, rows)
    ranking = f"on {report.devices[0]}" if report.devices else f"measured on {report.origin}"
    if top is None:
        title = f"{len(report.nodes)} nodes in {len(report.graphs)} graph(s), in graph order"
    else:
        title = f"the {len(rows)} slowest of {len(report.nodes)} nodes {ranking}"
    title += "; ms per node, each run alone"
    shown = list(columns)
    table = _table(title, shown)
    for name in _DROPPABLE:  # rich would cut cells to fit: leave out whole columns first
        if console.measure(table, options=console.options.update_width(10_000)).maximum <= console.width:
            break
        shown = [c for c in shown if c.header != name]
        table = _table(title, shown)
    return table


def _table(title: str, columns: Sequence[_Column]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for c in columns:
        widest = max((len(line) for cell in [c.header, *c.cells] for line in cell.split("\n")), default=1)
        # Numbers and shapes keep their full width: rich may shorten names, never cut a figure.
        justify: JustifyMethod = "right" if c.numeric else "left"
        table.add_column(c.header, justify=justify, no_wrap=True, min_width=None if c.shrinks else widest)
    for row in zip(*(c.cells for c in columns), strict=True):
        table.add_row(*row)
    return table


def _node_columns(report: Report, rows: Sequence[NodeCost]) -> list[_Column]:
    multi_graph = len(report.graphs) > 1
    columns = [
        _Column("node", [f"g{n.graph}/{n.name}" if multi_graph else n.name for n in rows], shrinks=True),
        _Column("op", [n.op.removeprefix("aten.").removesuffix(".default") for n in rows], shrinks=True),
        _Column("phase", [n.phase for n in rows]),
        _Column("module", [_tail(n.module, _MODULE_WIDTH) for n in rows]),
        _Column("output", [shape_text(n.out_shapes) for n in rows]),
        _Column("GFLOP", [_num(n.flops, 1e9, ".3f") for n in rows], numeric=True),
        _Column("MB", [_num(n.bytes, 1e6, ".2f") for n in rows], numeric=True),
    ]
    if any(n.origin_ms is not None for n in report.nodes):
        header = f"{_two_lines(origin_name(report))}\n(measured)"
        columns.append(_Column(header, [_num(n.origin_ms, 1, ".4f") for n in rows], numeric=True))
    for d in report.devices:
        columns.append(_Column(_two_lines(d), [_num(n.pred_ms.get(d), 1, ".4f") for n in rows], numeric=True))
    return columns


def shape_text(shapes: Sequence[Sequence[int]]) -> str:
    """The largest of ``shapes`` written ``8x1024x14x14``, with ``+N`` for the N others; ``-`` if none.

    Example:
        >>> shape_text([(8, 64), (8, 1024, 14, 14), (1024,)])
        '8x1024x14x14 +2'
    """
    if not shapes:
        return "-"
    largest = max(shapes, key=math.prod)
    text = "x".join(map(str, largest)) or "scalar"
    return text if len(shapes) == 1 else f"{text} +{len(shapes) - 1}"


def _tail(path: str, width: int) -> str:
    """A dotted module path cut from the left (the innermost module is the telling part)."""
    return path if len(path) <= width else "…" + path[len(path) - width + 1 :]


def _two_lines(name: str, width: int = 10) -> str:
    """A device name as a column header at most ``width`` wide where a hyphen allows: ``A100-SXM4-``
    over ``80GB``."""
    if len(name) <= width:
        return name
    cut = name.rfind("-", 0, width)
    return name if cut < 0 else f"{name[: cut + 1]}\n{name[cut + 1 :]}"


def _totals_table(report: Report) -> Table:
    table = Table(title="totals (ms)", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    measured = report.origin_ms() is not None or report.step_ms is not None
    table.add_column("phase")
    table.add_column("nodes", justify="right")
    if measured:
        table.add_column(f"{_two_lines(origin_name(report))}\n(measured)", justify="right")
    for device in report.devices:
        table.add_column(_two_lines(device), justify="right")

    def add(label: str, count: str, origin: str, cells: Iterable[str], style: str | None = None) -> None:
        table.add_row(label, count, *([origin] if measured else []), *cells, style=style)

    for phase in [*report.phases(), None]:
        count = len(report.nodes) if phase is None else sum(n.phase == phase for n in report.nodes)
        add(phase or "all", str(count), _num(report.origin_ms(phase), 1, ".3f"),
            (f"{report.total_ms(d, phase):.3f}" for d in report.devices),
            style="bold" if phase is None else None)  # fmt: skip
    # The same nodes run back to back as an eager step runs them (no per-op timing overhead).
    eager = {d: report.eager_ms(d) for d in report.devices}
    add("eager step", "", _num(report.step_ms, 1, ".3f"), (f"{eager[d]:.3f}" for d in report.devices), "bold")
    # How far a GPU nobody measured may be from it: the nominal 80% interval of origin-free predictions.
    intervals = (report.eager_interval_ms(d, eager_ms=eager[d]) for d in report.devices)
    add("  80% interval", "", "", (format_interval(*bounds) for bounds in intervals))
    # Independent ops overlapped on as many streams as they need: the bound multi-stream work meets.
    add("critical path", "", "", (f"{report.critical_path_ms(d):.3f}" for d in report.devices))
    if report.execution != "eager":  # the mode the report shows, beside the eager step
        add(
            f"{report.execution} step",
            "",
            "",
            (f"{report.step_ms_in(d):.3f}" for d in report.devices),
            "bold",
        )
    return table


def _summary_lines(report: Report) -> list[str]:
    lines = []
    if report.devices:
        covered = ", ".join(f"{d} {report.coverage(d):.0%}" for d in report.devices)
        lines.append(f"coverage of kernel nodes: {covered}")
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


def fused_kernel_lines(report: Report, top: int | None = None) -> list[str]:
    """The compiled step's generated kernels that fuse several nodes, one line each with the nodes it
    holds and its time on the first GPU (``top``: the N slowest there; all in run order otherwise)."""
    kernels = [k for k in report.fused_kernels() if k.kind != "extern"]
    count = sum(n.has_kernel for n in report.nodes)
    head = (f"compiled: {len(report.fused_kernels())} kernels for {count} kernel nodes; "
            f"{sum(len(k.members) > 1 for k in kernels)} fuse several nodes")  # fmt: skip
    device = report.devices[0] if report.devices else None
    times: dict[tuple[int, ...], float] = {}
    if device is not None:
        for span in report.compiled_timeline(device):
            times[span.kernel.members] = span.end_ms - span.start_ms
    fused = [k for k in kernels if len(k.members) > 1]
    if top is not None:
        fused = sorted(fused, key=lambda k: -times.get(k.members, 0.0))[:top]
    multi_graph = len(report.graphs) > 1
    lines = [head + (f" (ms on {device}, as run in the step)" if device else "")]
    for k in fused:
        members = [report.nodes[i] for i in k.members]
        names = " + ".join(f"g{n.graph}/{n.name}" if multi_graph else n.name for n in members)
        ms = f"{times[k.members]:.4f} ms  " if k.members in times else ""
        lines.append(f"  {ms}{k.kind} {members[0].phase}: {names}")
    return lines


def spec_sheet_caveats(devices: Iterable[str]) -> list[str]:
    """One line per GPU no training GPU resembles: its figures rest on spec sheets alone."""
    return [line for line in (spec_sheet_caveat(get_device(d)) for d in devices) if line]


def format_interval(low: float, high: float) -> str:
    """``low-high`` in ms, ``-`` where no interval was computed."""
    return "-" if math.isnan(low) else f"{low:.3f}-{high:.3f}"


def _num(value: float | None, scale: float, fmt: str) -> str:
    return "-" if value is None else format(value / scale, fmt)
