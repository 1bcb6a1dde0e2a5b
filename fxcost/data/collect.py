"""Measure random op configurations on the local device into CSVs of the ``neusight/ops`` schema.

One file per op and device, ``<out>/ops/<op>/<Device>.csv`` (spaces in the device name become ``_``, as
in the shared data), so ``fxcost.data.datasets.read_ops(out, ops)`` reads the result directly. Columns, in
order, are those of the shared files: ``OPName, Latency`` (ms, forward only but for ``sdpa_bwd``, median of
:func:`fxcost.bench.bench_ms`), ``Device``, ``Torch Version`` (``p2.1.0``), ``CUDNN Version`` (``8902``),
the kernel columns, ``CUDA Version`` (``cu121``), ``Kernels`` (linear, bmm, conv and ln only) and the
op's dims. The kernel columns come from one extra call under ``torch.profiler`` (CUDA only; empty
elsewhere, or with ``kernels=False``; one profiler session per :data:`PROFILE_CHUNK` configurations,
since starting one costs far more than a call): ``Kernel Name``, ``Grid`` and ``Block`` of the
longest-running kernel the op launched, ``Blocks per SM`` (its grid's blocks over the GPU's SMs),
``Warps per SM`` (that times the warps of a block) and ``Kernels``, every kernel's name after a
``;``. These are the definitions the shared files follow (checked on their rows in
``tests/data/test_collect.py``).

The configurations and their sequence are :mod:`fxcost.data.op_configs`.

Measurements are fp32 with TF32 disabled (as the shared data) unless ``precision=`` says otherwise:
``tf32`` is fp32 tensors with TF32 enabled for matmul and cuDNN, ``bf16``/``fp16`` tensors of that dtype
(TF32 off). Rows of a precision other than fp32 carry a trailing ``Precision`` column and go to a
directory of their own, ``<out>/<precision>/ops/<op>/<Device>.csv``: ``read_ops(out)`` reads the fp32
rows only (the data sets count bytes as fp32), ``read_ops(out / "bf16")`` the bf16 ones, and no file
mixes two precisions. They are timed for about
:data:`TIMING_BUDGET_MS` each (at least one warm-up and one timed call: a call of many milliseconds
varies by well under 1% on a GPU). Out-of-memory configurations are skipped and counted, as in
Habitat. Each row is flushed as soon as it is timed (a chunk's kernels are profiled before its
timings, so a kill loses no timed row); on resume the rows already written are matched to the
configurations of the sequence, so skipped configurations are recognised too, and measuring
continues after the last one written (per file, so per precision). ``max_seconds`` stops a run
cleanly between two configurations, the rows written kept. A torn last line (no trailing
newline, from a killed run) is dropped, since a truncated latency would still parse as a number.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fxcost._progress import progress_bars
from fxcost.bench.profiling import kernel_range, recording_kernels
from fxcost.bench.timing import bench_ms
from fxcost.data.op_configs import OPS, build_call, expand_ops, header, sample_config
from fxcost.precision import PRECISIONS, Precision
from fxcost.records import KernelRecord

__all__ = [
    "OPS",
    "PROFILE_CHUNK",
    "TIMING_BUDGET_MS",
    "CollectStats",
    "collect",
    "device_label",
    "header",
    "kernel_columns",
    "precision_out_dir",
    "profile_kernels",
    "sample_config",
]

log = logging.getLogger(__name__)

Timer = Callable[[Callable[[], Any], torch.device], float]
Builder = Callable[[], Callable[[], Any]]  # makes the inputs, returns the call to measure
Profiler = Callable[[Sequence[Builder], torch.device], list[list[KernelRecord]]]

PROFILE_CHUNK = 32  # configurations per profiler session
TIMING_BUDGET_MS = 10.0


@dataclass
class CollectStats:
    """What one :func:`collect` call did, per op: rows found on resume (``existing``), rows measured
    now (``written``), out-of-memory configurations skipped (``skipped_oom``), wall seconds spent
    measuring (``seconds``), the CSV (``paths``) and whether a torn last line was dropped (``repaired``);
    ``unfinished``: the ops that ``max_seconds`` stopped before their last configuration, in order
    (those it stopped before they started have no entry in the other fields)."""

    existing: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    skipped_oom: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    repaired: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)


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


def precision_out_dir(out_dir: str | Path, precision: str) -> Path:
    """The data directory a precision's rows go to: ``out_dir`` for fp32, ``out_dir/<precision>`` else."""
    return Path(out_dir) if precision == "fp32" else Path(out_dir) / precision


def _parse_precision(precision: str | Precision) -> Precision:
    found = PRECISIONS.get(precision) if isinstance(precision, str) else precision
    if not isinstance(found, Precision):
        raise ValueError(f"unknown precision {precision!r}; collect measures in: {', '.join(PRECISIONS)}")
    return found


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """TF32 on or off for matmul and cuDNN (off: fp32 as in the shared data), restored afterwards."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=enabled):
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
    precision: str | Precision = "fp32",
    max_seconds: float | None = None,
) -> CollectStats:
    """Measure configurations ``0 .. samples-1`` of each op into ``<out_dir>/ops/<op>/<Device>.csv``
    (``<out_dir>/<precision>/ops/...`` for a precision other than fp32).

    Args:
        ops: op names of the shared data (``linear``, ``bmm``, ``conv``, ``ln``, ``softmax``, ``add``,
            ``addu``, ...), ``sdpa`` and ``sdpa_bwd``; ``elementwise`` stands for all eleven
            elementwise ops.
        samples: configurations drawn per op, out-of-memory ones included (they write no row).
        out_dir: the data directory; rows go to ``ops/<op>/<Device>.csv`` under it.
        device: where to measure.
        resume: continue an existing file (else it is overwritten).
        seed: selects the configuration sequence; the same seed gives the same configurations on
            every device.
        timer: ``timer(fn, device) -> ms``; :func:`fxcost.bench.bench_ms` for about
            :data:`TIMING_BUDGET_MS` by default.
        kernels: fill the kernel columns (one more call per configuration, under the profiler).
        profiler: ``profiler(builders, device) -> [[KernelRecord] per builder]``, where a builder
            makes a configuration's inputs and returns its call; :func:`profile_kernels` on CUDA by
            default, none elsewhere (the kernel columns stay empty).
        sms: the device's SM count for ``Blocks/Warps per SM``; CUDA's device properties by default.
        progress: show a rich progress bar on stderr.
        precision: ``fp32`` (TF32 off), ``tf32``, ``bf16`` or ``fp16`` (see the module docstring).
        max_seconds: stop once this many wall seconds have passed, between two configurations (a
            configuration started is finished); the ops cut short are listed in ``unfinished``.

    Raises:
        RuntimeError: ``device`` is CUDA and no CUDA GPU is available.
        ValueError: unknown op or precision, a negative ``samples`` or ``max_seconds``, or an existing
            file that is not of this schema and seed.

    Example:
        >>> collect(["bmm", "elementwise"], 500, "data/mine", seed=0)  # doctest: +SKIP
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "no CUDA GPU: torch.cuda.is_available() is False; use --device cpu to measure here"
        )
    names = expand_ops(ops)
    if samples < 0:
        raise ValueError(f"samples must be >= 0, got {samples}")
    if max_seconds is not None and not max_seconds >= 0:
        raise ValueError(f"max_seconds must be >= 0 (or None: no limit), got {max_seconds}")
    prec = _parse_precision(precision)
    dtype = getattr(torch, prec.dtype)
    deadline = math.inf if max_seconds is None else time.monotonic() + max_seconds
    if timer is None:
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
    fixed = {"Device": label, **_versions(), "Precision": prec.name}
    root = precision_out_dir(out_dir, prec.name)
    stats = CollectStats()
    with progress_bars(progress) as update, _tf32(prec.tf32):
        for op in names:
            if time.monotonic() >= deadline:
                stats.unfinished.append(op)
                continue
            columns = header(op, prec.name)
            path = root / "ops" / op / f"{label.replace(' ', '_').replace('/', '_')}.csv"
            existing, start, torn = _prepare(path, op, columns, seed, resume)
            stats.paths[op], stats.existing[op] = path, existing
            stats.written[op] = stats.skipped_oom[op] = 0
            if torn:
                stats.repaired.append(op)
            done = min(start, samples)
            update(op, done, samples)
            started = time.perf_counter()
            with path.open("a", newline="") as f:
                writer = csv.writer(f, lineterminator="\n")
                for first in range(start, samples, PROFILE_CHUNK):
                    if time.monotonic() >= deadline:
                        stats.unfinished.append(op)
                        break
                    chunk = range(first, min(first + PROFILE_CHUNK, samples))
                    configs = [sample_config(op, index, seed) for index in chunk]
                    builders = [functools.partial(build_call, op, cfg, dev, dtype) for cfg in configs]
                    launches = profiler(builders, dev) if profiler else [[] for _ in chunk]
                    for index, cfg, launched in zip(chunk, configs, launches, strict=True):
                        if time.monotonic() >= deadline:
                            stats.unfinished.append(op)
                            break
                        latency = _time(op, cfg, dev, dtype, timer)
                        if latency is None:
                            stats.skipped_oom[op] += 1
                            log.info("%s config %d %s: out of memory, skipped", op, index, cfg)
                        else:
                            launch = kernel_columns(launched, sms) if launched and sms else {}
                            row = {**fixed, **launch, "OPName": op, "Latency": repr(latency), **cfg}
                            writer.writerow([row.get(c, "") for c in columns])
                            f.flush()  # an interrupted run loses no finished row
                            stats.written[op] += 1
                        done += 1
                        update(op, done, samples)
                    if stats.unfinished[-1:] == [op]:
                        break
            stats.seconds[op] = time.perf_counter() - started
    return stats


def _time(op: str, cfg: dict[str, int], dev: torch.device, dtype: torch.dtype, timer: Timer) -> float | None:
    """Median ms of ``op`` at ``cfg``; None if it runs out of memory, on CUDA even with the cache
    emptied (cached blocks of earlier configurations may have been in the way)."""
    for attempt in range(2 if dev.type == "cuda" else 1):
        if attempt:
            torch.cuda.empty_cache()
        try:
            return float(timer(build_call(op, cfg, dev, dtype), dev))  # the inputs are freed with the call
        except (RuntimeError, MemoryError) as e:
            if not _is_oom(e):
                raise RuntimeError(f"measuring {op} {cfg} on {dev} failed: {e}") from e
    return None
