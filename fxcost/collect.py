"""Measure random op configurations on the local device into CSVs of the ``neusight/ops`` schema.

One file per op and device, ``<out>/ops/<op>/<Device>.csv`` (spaces in the device name become ``_``, as
in the shared data), so ``fxcost.datasets.read_ops(out, ops)`` reads the result directly. Columns, in
order, are those of the shared files: ``OPName, Latency`` (ms, forward only, median of
:func:`fxcost.timing.bench_ms`), ``Device``, ``Torch Version`` (``p2.1.0``), ``CUDNN Version`` (``8902``),
the kernel columns, ``CUDA Version`` (``cu121``), ``Kernels`` (linear, bmm, conv and ln only) and the
op's dims. The kernel columns come from one extra call under ``torch.profiler`` (CUDA only; empty
elsewhere, or with ``kernels=False``; one profiler session per :data:`PROFILE_CHUNK` configurations,
since starting one costs far more than a call): ``Kernel Name``, ``Grid`` and ``Block`` of the
longest-running kernel the op launched, ``Blocks per SM`` (its grid's blocks over the GPU's SMs),
``Warps per SM`` (that times the warps of a block) and ``Kernels``, every kernel's name after a
``;``. These are the definitions the shared files follow (checked on their rows in
``tests/test_collect.py``).

Configuration ``i`` of an op is drawn from its own generator, seeded by ``(seed, family, i)``, so it is
the same whatever was measured before; the elementwise ops, ``ln`` and ``softmax`` share one family and
so one sequence of ``[B, H]`` shapes, as in the shared data. Ranges, uniform integers, inclusive:

=========== =================================================================================
linear      B = 1 (as in the shared data), M 1-3500, N 1-32768, K 1-32768 (Habitat §4.3.1:
            batch 1-3500, in/out features 1-32768); no bias (the schema has no bias column)
bmm         B 1-128, M, N, K 1-1024 (Habitat)
conv        B 1-64, Input_Channel 3-2048, Output_Channel 16-2048, Kernel_Szie 1-11, Input_Size
            1-256 (square), Stride 1-4, Padding 0-3 (Habitat), no bias; configurations whose
            kernel exceeds the padded image are redrawn
elementwise B 1-16384, H 1-4096 (the range of the shared data; Habitat has no such ops); the
ln, softmax "u" ops take the scalar 2.0
=========== =================================================================================

Measurements are fp32 with TF32 disabled (as the shared data), timed for about
:data:`TIMING_BUDGET_MS` each (at least one warm-up and one timed call: a call of many milliseconds
varies by well under 1% on a GPU). Out-of-memory configurations are skipped and counted, as in
Habitat. Each row is flushed as soon as it is timed (a chunk's kernels are profiled before its
timings, so a kill loses no timed row); on resume the rows already written are matched to the
configurations of the sequence, so skipped configurations are recognised too, and measuring
continues after the last one written. A torn last line (no trailing
newline, from a killed run) is dropped, since a truncated latency would still parse as a number.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import io
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fxcost.datasets import ELEMENTWISE
from fxcost.records import KernelRecord

__all__ = [
    "OPS",
    "PROFILE_CHUNK",
    "TIMING_BUDGET_MS",
    "CollectStats",
    "add_collect_parser",
    "collect",
    "device_label",
    "header",
    "kernel_columns",
    "profile_kernels",
    "sample_config",
]

log = logging.getLogger(__name__)

Timer = Callable[[Callable[[], Any], torch.device], float]
Builder = Callable[[], Callable[[], Any]]  # makes the inputs, returns the call to measure
Profiler = Callable[[Sequence[Builder], torch.device], list[list[KernelRecord]]]

PROFILE_CHUNK = 32  # configurations per profiler session
TIMING_BUDGET_MS = 10.0

_META = ["OPName", "Latency", "Device", "Torch Version", "CUDNN Version", "Kernel Name", "Warps per SM",
         "Blocks per SM", "Grid x", "Grid y", "Grid z", "Block x", "Block y", "Block z",
         "CUDA Version"]  # fmt: skip
_GEMM_DIMS = ["B", "M", "N", "K"]
_CONV_DIMS = ["B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"]
_VEC_DIMS = ["B", "H"]

# Op -> (sampling family, dims, whether the shared files have a "Kernels" column).
OPS: dict[str, tuple[str, list[str], bool]] = {
    "linear": ("linear", _GEMM_DIMS, True),
    "bmm": ("bmm", _GEMM_DIMS, True),
    "conv": ("conv", _CONV_DIMS, True),
    "ln": ("vec", _VEC_DIMS, True),
    "softmax": ("vec", _VEC_DIMS, False),
    **{op: ("vec", _VEC_DIMS, False) for op in ELEMENTWISE},
}
_SCALAR = 2.0


@dataclass
class CollectStats:
    """What one :func:`collect` call did, per op: rows found on resume (``existing``), rows measured
    now (``written``), out-of-memory configurations skipped (``skipped_oom``), wall seconds spent
    measuring (``seconds``), the CSV (``paths``) and whether a torn last line was dropped (``repaired``)."""

    existing: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    skipped_oom: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    repaired: list[str] = field(default_factory=list)


def header(op: str) -> list[str]:
    """The CSV columns of ``op``, in the order of the shared data."""
    _, dims, kernels = OPS[op]
    return [*_META, *(["Kernels"] if kernels else []), *dims]


def sample_config(op: str, index: int, seed: int = 0) -> dict[str, int]:
    """Configuration ``index`` of ``op``'s sequence: its dims by column name (see the module docstring)."""
    family = OPS[op][0]
    rng = random.Random(f"fxcost-collect:{seed}:{family}:{index}")  # str seeds hash stably (sha512)
    r = rng.randint
    if family == "linear":
        return {"B": 1, "M": r(1, 3500), "N": r(1, 32768), "K": r(1, 32768)}
    if family == "bmm":
        return {"B": r(1, 128), "M": r(1, 1024), "N": r(1, 1024), "K": r(1, 1024)}
    if family == "conv":
        while True:  # Habitat ignores invalid configurations; redraw from the same generator
            cfg = {"B": r(1, 64), "Input_Channel": r(3, 2048), "Output_Channel": r(16, 2048),
                   "Kernel_Szie": r(1, 11), "Input_Size": r(1, 256), "Stride": r(1, 4),
                   "Padding": r(0, 3)}  # fmt: skip
            if cfg["Kernel_Szie"] <= cfg["Input_Size"] + 2 * cfg["Padding"]:
                return cfg
    return {"B": r(1, 16384), "H": r(1, 4096)}


def _build(op: str, cfg: dict[str, int], device: torch.device) -> Callable[[], Any]:
    """The forward call of ``op`` at ``cfg`` on fresh fp32 tensors, as a ``functools.partial``."""
    import torch.nn.functional as F

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, device=device, dtype=torch.float32)

    if op == "linear":
        return functools.partial(F.linear, rand(cfg["B"], cfg["M"], cfg["K"]), rand(cfg["N"], cfg["K"]))
    if op == "bmm":
        b, m, n, k = (cfg[d] for d in _GEMM_DIMS)
        return functools.partial(torch.bmm, rand(b, m, k), rand(b, k, n))
    if op == "conv":
        x = rand(cfg["B"], cfg["Input_Channel"], cfg["Input_Size"], cfg["Input_Size"])
        w = rand(cfg["Output_Channel"], cfg["Input_Channel"], cfg["Kernel_Szie"], cfg["Kernel_Szie"])
        return functools.partial(F.conv2d, x, w, stride=cfg["Stride"], padding=cfg["Padding"])
    x = rand(cfg["B"], cfg["H"])
    if op == "ln":
        return functools.partial(F.layer_norm, x, (cfg["H"],), rand(cfg["H"]), rand(cfg["H"]))
    if op == "softmax":
        return functools.partial(torch.softmax, x, -1)
    unary: dict[str, Callable[..., Any]] = {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh}
    if op in unary:
        return functools.partial(unary[op], x)
    binary: dict[str, Callable[..., Any]] = {"add": torch.add, "mul": torch.mul, "div": torch.div,
                                             "pow": torch.pow}  # fmt: skip
    fn = binary[op.removesuffix("u")]
    other: torch.Tensor | float = _SCALAR if op.endswith("u") else rand(cfg["B"], cfg["H"])
    return functools.partial(fn, x, other)


def kernel_columns(kernels: Sequence[KernelRecord], sms: int) -> dict[str, str]:
    """The kernel columns of a row from the kernels one call launched on a GPU of ``sms`` SMs (empty
    values for a call that launched none, or whose main kernel has no launch config)."""
    if not kernels:
        return {}
    main = max(kernels, key=lambda k: k.duration_ms)
    columns = {"Kernel Name": main.name, "Kernels": "".join(";" + k.name for k in kernels)}
    if main.grid is not None and main.block is not None:
        blocks_per_sm = math.prod(main.grid) / sms
        warps_per_block = math.ceil(math.prod(main.block) / 32)
        columns |= {
            "Blocks per SM": f"{blocks_per_sm:.6g}",
            "Warps per SM": f"{blocks_per_sm * warps_per_block:.6g}",
        }
        columns |= {f"Grid {a}": str(v) for a, v in zip("xyz", main.grid, strict=True)}
        columns |= {f"Block {a}": str(v) for a, v in zip("xyz", main.block, strict=True)}
    return columns


def profile_kernels(builders: Sequence[Builder], device: torch.device) -> list[list[KernelRecord]]:
    """The kernels one call of each built function launches on CUDA ``device``, in launch order, all
    under one torch.profiler session. A builder or call that runs out of memory gets ``[]``."""
    from fxcost.profiling import kernel_range, recording_kernels

    with recording_kernels(device) as kernels:
        for i, build in enumerate(builders):
            try:
                fn = build()
                torch.cuda.synchronize(device)  # the inputs' kernels stay out of the range
                with kernel_range(str(i)):
                    fn()
                del fn
            except (RuntimeError, MemoryError) as e:
                if not _is_oom(e):
                    raise
                torch.cuda.empty_cache()
    return [kernels.get(str(i), []) for i in range(len(builders))]


def device_label(device: torch.device) -> str:
    """The ``Device`` column: ``torch.cuda.get_device_name()`` on CUDA, else the device type."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def _versions() -> dict[str, str]:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    cuda = torch.version.cuda
    return {
        "Torch Version": "p" + torch.__version__.split("+")[0],
        "CUDNN Version": "" if cudnn is None else str(cudnn),
        "CUDA Version": "" if cuda is None else "cu" + cuda.replace(".", ""),
    }


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e)


@contextlib.contextmanager
def _no_tf32() -> Iterator[None]:
    """fp32 as in the shared data: TF32 off for matmul and cuDNN, restored afterwards."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


def _prepare(path: Path, op: str, columns: list[str], seed: int, resume: bool) -> tuple[int, int, bool]:
    """Make ``path`` a valid CSV of whole rows; return (rows in it, next configuration index, torn)."""
    if not resume or not path.exists() or path.stat().st_size == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerow(columns)
        return 0, 0, False
    data = path.read_bytes()
    torn = not data.endswith(b"\n")
    if torn:
        cut = data.rfind(b"\n") + 1
        with path.open("r+b") as f:
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())
        data = data[:cut]
        log.warning("%s: dropped a torn last line (interrupted write)", path)
        if not data:  # the header itself was torn
            return (*_prepare(path, op, columns, seed, resume=False)[:2], True)
    rows = list(csv.reader(io.StringIO(data.decode())))
    if rows[0] != columns:
        raise ValueError(f"{path}: header {rows[0]} differs from the {op} schema {columns}")
    dims = OPS[op][1]
    index = 0
    for n, row in enumerate(rows[1:], start=1):
        found = {d: int(row[columns.index(d)]) for d in dims}
        # Configurations between two rows were skipped (out of memory): step over them.
        while sample_config(op, index, seed) != found:
            index += 1
            if index > 10 * len(rows) + 10_000:
                raise ValueError(f"{path}: row {n} {found} is not in the sequence of seed {seed}")
        index += 1
    return len(rows) - 1, index, torn


def collect(
    ops: Sequence[str],
    samples: int,
    out_dir: str | Path,
    *,
    device: str | torch.device = "cuda",
    resume: bool = True,
    seed: int = 0,
    timer: Timer | None = None,
    kernels: bool = True,
    profiler: Profiler | None = None,
    sms: int | None = None,
    progress: bool = True,
) -> CollectStats:
    """Measure configurations ``0 .. samples-1`` of each op into ``<out_dir>/ops/<op>/<Device>.csv``.

    Args:
        ops: op names of the shared data (``linear``, ``bmm``, ``conv``, ``ln``, ``softmax``, ``add``,
            ``addu``, ...); ``elementwise`` stands for all eleven elementwise ops.
        samples: configurations drawn per op, out-of-memory ones included (they write no row).
        out_dir: the data directory; rows go to ``ops/<op>/<Device>.csv`` under it.
        device: where to measure.
        resume: continue an existing file (else it is overwritten).
        seed: selects the configuration sequence; the same seed gives the same configurations on
            every device.
        timer: ``timer(fn, device) -> ms``; :func:`fxcost.timing.bench_ms` for about
            :data:`TIMING_BUDGET_MS` by default.
        kernels: fill the kernel columns (one more call per configuration, under the profiler).
        profiler: ``profiler(builders, device) -> [[KernelRecord] per builder]``, where a builder
            makes a configuration's inputs and returns its call; :func:`profile_kernels` on CUDA by
            default, none elsewhere (the kernel columns stay empty).
        sms: the device's SM count for ``Blocks/Warps per SM``; CUDA's device properties by default.
        progress: show a rich progress bar on stderr.

    Raises:
        RuntimeError: ``device`` is CUDA and no CUDA GPU is available.
        ValueError: unknown op, or an existing file that is not of this schema and seed.

    Example:
        >>> collect(["bmm", "elementwise"], 500, "data/mine", seed=0)  # doctest: +SKIP
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "no CUDA GPU: torch.cuda.is_available() is False; use --device cpu to measure here"
        )
    names = _expand(ops)
    if samples < 0:
        raise ValueError(f"samples must be >= 0, got {samples}")
    if timer is None:
        from fxcost.timing import bench_ms

        timer = functools.partial(bench_ms, budget_ms=TIMING_BUDGET_MS, min_reps=1)
    if not kernels:
        profiler = None
    elif profiler is None and dev.type == "cuda":
        profiler = profile_kernels
    if profiler is not None and sms is None:
        if dev.type != "cuda":
            raise ValueError(f"sms= is needed to profile kernels on a {dev.type} device")
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
    label = device_label(dev)
    fixed = {"Device": label, **_versions()}
    stats = CollectStats()
    with _progress(progress) as bar, _no_tf32():
        for op in names:
            columns = header(op)
            path = Path(out_dir) / "ops" / op / f"{label.replace(' ', '_').replace('/', '_')}.csv"
            existing, start, torn = _prepare(path, op, columns, seed, resume)
            stats.paths[op], stats.existing[op] = path, existing
            stats.written[op] = stats.skipped_oom[op] = 0
            if torn:
                stats.repaired.append(op)
            task = bar.add_task(op, total=samples, completed=min(start, samples)) if bar else None
            started = time.perf_counter()
            with path.open("a", newline="") as f:
                writer = csv.writer(f, lineterminator="\n")
                for first in range(start, samples, PROFILE_CHUNK):
                    chunk = range(first, min(first + PROFILE_CHUNK, samples))
                    configs = [sample_config(op, index, seed) for index in chunk]
                    builders = [functools.partial(_build, op, cfg, dev) for cfg in configs]
                    launches = profiler(builders, dev) if profiler else [[] for _ in chunk]
                    for index, cfg, launched in zip(chunk, configs, launches, strict=True):
                        latency = _time(op, cfg, dev, timer)
                        if latency is None:
                            stats.skipped_oom[op] += 1
                            log.info("%s config %d %s: out of memory, skipped", op, index, cfg)
                        else:
                            launch = kernel_columns(launched, sms) if launched and sms else {}
                            row = {**fixed, **launch, "OPName": op, "Latency": repr(latency), **cfg}
                            writer.writerow([row.get(c, "") for c in columns])
                            f.flush()  # an interrupted run loses no finished row
                            stats.written[op] += 1
                        if bar is not None and task is not None:
                            bar.advance(task)
            stats.seconds[op] = time.perf_counter() - started
    return stats


def _time(op: str, cfg: dict[str, int], dev: torch.device, timer: Timer) -> float | None:
    """Median ms of ``op`` at ``cfg``; None if it runs out of memory, on CUDA even with the cache
    emptied (cached blocks of earlier configurations may have been in the way)."""
    for attempt in range(2 if dev.type == "cuda" else 1):
        if attempt:
            torch.cuda.empty_cache()
        try:
            return float(timer(_build(op, cfg, dev), dev))  # the inputs are freed with the call
        except (RuntimeError, MemoryError) as e:
            if not _is_oom(e):
                raise RuntimeError(f"measuring {op} {cfg} on {dev} failed: {e}") from e
    return None


def _expand(ops: Sequence[str]) -> list[str]:
    names: list[str] = []
    for op in ops:
        for name in ELEMENTWISE if op == "elementwise" else [op]:
            if name not in OPS:
                raise ValueError(f"unknown op {name!r}; known: elementwise, {', '.join(OPS)}")
            if name not in names:
                names.append(name)
    return names


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        yield bar


def add_collect_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``fxcost collect`` on an ``add_subparsers()`` object; returns its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "collect",
        help="measure random op configurations here into CSVs of the shared-data schema",
        description="Measure random configurations of each op on this machine and append them to "
        "DIR/ops/<op>/<Device>.csv (the layout and columns of shared/data/neusight/ops).",
    )
    ops_help = "comma-separated: linear,bmm,conv,elementwise,ln,softmax or single elementwise ops (add, ...)"
    parser.add_argument("--ops", required=True, help=ops_help)
    parser.add_argument("--samples", type=int, required=True, help="configurations per op")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="data directory")
    parser.add_argument("--no-resume", dest="resume", action="store_false", help="overwrite existing files")
    parser.add_argument("--seed", type=int, default=0, help="configuration sequence (default 0)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="default cuda")
    no_kernels = "leave the kernel columns empty (skips one profiled call per configuration)"
    parser.add_argument("--no-kernels", dest="kernels", action="store_false", help=no_kernels)
    parser.set_defaults(run=_run)
    return parser


def _run(args: argparse.Namespace) -> int:
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    stats = collect(ops, args.samples, args.out, device=args.device, resume=args.resume, seed=args.seed,
                    kernels=args.kernels)  # fmt: skip
    for op, path in stats.paths.items():
        done = stats.written[op] + stats.skipped_oom[op]
        rate = f", {done / stats.seconds[op]:.1f} configs/s" if stats.seconds[op] > 0 else ""
        print(f"{op}: {stats.existing[op]} rows kept, {stats.written[op]} measured, "
              f"{stats.skipped_oom[op]} out of memory{rate} -> {path}")  # fmt: skip
    return 0
