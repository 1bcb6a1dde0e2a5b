"""Calibrate this machine's GPU with Triton microbenchmarks and write a device profile.

Measures achieved DRAM bandwidth (STREAM copy and triad over several sizes), fp32 FMA throughput,
fp16 and bf16 ``tl.dot`` (tensor-core) throughput, the launch floor (an empty kernel) and L2
bandwidth (a small working set re-read), all through :func:`fxcost.bench.bench_ms`.
:func:`fxcost.kernels_triton.device_profile.to_yaml` writes the calibration columns of the device
database (``achieved_bandwidth_gbps``, ``kernel_overhead_ms``, ``launch_floor_ms``) in the format
:func:`fxcost.gpus.load_devices` reads.

The database's overhead and floor are those of a PyTorch op timed alone, as its measurements were
taken: the intercept of an elementwise op's time over its bytes, and the time of one on a tiny
tensor. An empty Triton kernel skips PyTorch's dispatch but goes through Triton's Python launcher
(on one lent H100 it took 10 us where a tiny ``torch.add`` took 4.2), so those two columns come from
``torch.add`` (:func:`torch_op_costs`); the Triton figures are kept in the file's header.

Without a GPU the same code runs on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``); the
result is then marked ``on_gpu=False`` and its numbers mean nothing.

Example:
    >>> from fxcost.kernels_triton.device_profile import to_yaml
    >>> cal = calibrate()  # doctest: +SKIP
    >>> to_yaml(cal, "device.yaml")  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_SIZES",
    "Calibration",
    "SizeTiming",
    "calibrate",
    "torch_copy_bandwidth_gbps",
    "torch_op_costs",
]

log = logging.getLogger(__name__)
_Bench = Callable[[Callable[[], Any]], float]

DEFAULT_SIZES = (1 << 22, 1 << 24, 1 << 26, 1 << 28)  # elements per buffer
# A size counts as DRAM-bound when the bytes it touches exceed the L2 this many times over.
_LARGE_OVER_L2 = 4
_FMA_ELEMENTS = 1 << 22
_FMA_ITERS = 1024
_L2_FRACTION = 0.25  # of the L2 size, for the re-read working set
_L2_REPS = 256
_DOT_SIZE = 4096  # M = N = K of the tensor-core benchmark
# Copies and triads are timed this many launches at a time: CUDA events around a single launch also
# time the host's launch path, 10 us through Triton's Python launcher on one lent H100, 5% of a
# 0.2 ms copy. Back to back, later launches queue while the GPU works.
STREAM_LAUNCHES = 8
DOT_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True, slots=True)
class SizeTiming:
    """One timed kernel at one size: median milliseconds and the bytes it moved."""

    kernel: str  # "copy", "triad" or "torch_copy"
    elements: int
    bytes_moved: int
    time_ms: float

    @property
    def bandwidth_gbps(self) -> float:
        return self.bytes_moved / self.time_ms / 1e6


@dataclass(frozen=True, slots=True)
class Calibration:
    """Measured facts about one device. ``on_gpu=False``: a simulated run (Triton interpreter on CPU).

    Attributes:
        achieved_bandwidth_gbps: median copy bandwidth over the sizes large enough to miss L2.
        triad_bandwidth_gbps: the same for the triad kernel.
        fma_tflops: fp32 FMA throughput (an FMA counts as two operations).
        dot_tflops: ``tl.dot`` throughput per input dtype (fp16, bf16; fp32 accumulation).
        launch_overhead_ms: median time of an empty kernel, as CUDA events see it.
        kernel_overhead_ms: intercept of the least-squares line of copy time over bytes, or ``None``
            with fewer than two sizes or a negative intercept.
        op_overhead_ms, op_floor_ms: the same for PyTorch's elementwise add, the database's
            definitions (:func:`torch_op_costs`); the intercept is ``None`` where negative.
        l2_bandwidth_gbps: re-read bandwidth of a working set a quarter of L2; ``None`` when not measured.
        timings: every (kernel, size) measurement behind the bandwidths.
    """

    device_name: str
    on_gpu: bool
    dtype: str
    achieved_bandwidth_gbps: float
    triad_bandwidth_gbps: float
    fma_tflops: float
    dot_tflops: dict[str, float]
    launch_overhead_ms: float
    kernel_overhead_ms: float | None
    op_overhead_ms: float | None
    op_floor_ms: float
    l2_bandwidth_gbps: float | None
    timings: tuple[SizeTiming, ...]


def _device(device: str | torch.device) -> torch.device:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "no CUDA GPU: calibration times kernels on a GPU (torch.cuda.is_available() is False)"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise ValueError(f"calibration runs on 'cuda' (or 'cpu' under TRITON_INTERPRET=1), got {device!r}")
    return dev


def _kernels(dev: torch.device) -> Any:
    from fxcost.kernels_triton import kernels

    if dev.type == "cpu" and not kernels.interpreted():
        raise RuntimeError(
            "Triton kernels run on CPU tensors only under the interpreter: set TRITON_INTERPRET=1 "
            "before Triton is first imported"
        )
    return kernels


def _bench(fn: Callable[[], Any], dev: torch.device, repeats: int, budget_ms: float) -> float:
    from fxcost.bench.timing import bench_ms

    return bench_ms(fn, dev, budget_ms=budget_ms, min_reps=repeats, max_reps=max(repeats, 1000))


def _l2_bytes(dev: torch.device) -> int:
    import torch

    return int(torch.cuda.get_device_properties(dev).L2_cache_size) if dev.type == "cuda" else 0


def _large(timings: Sequence[SizeTiming], l2_bytes: int) -> list[SizeTiming]:
    """The timings that touch at least ``_LARGE_OVER_L2`` times the L2; the largest one if none does."""
    large = [t for t in timings if t.bytes_moved >= _LARGE_OVER_L2 * l2_bytes]
    if not large:
        biggest = max(timings, key=lambda t: t.bytes_moved)
        log.warning(
            "no size moves %d x L2 (%d bytes); bandwidth from the largest (%d bytes) may include L2 hits",
            _LARGE_OVER_L2, l2_bytes, biggest.bytes_moved,
        )  # fmt: skip
        large = [biggest]
    return large


def _median_bandwidth(timings: Sequence[SizeTiming], l2_bytes: int) -> float:
    return statistics.median(t.bandwidth_gbps for t in _large(timings, l2_bytes))


def _check_sizes(sizes: Sequence[int], repeats: int) -> None:
    if not sizes or any(int(n) < 1 for n in sizes):
        raise ValueError(f"sizes must be positive element counts, got {list(sizes)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")


def _intercept_ms(timings: Sequence[SizeTiming]) -> float | None:
    """Intercept of time over bytes (least squares): the fixed cost per kernel, if positive."""
    if len({t.bytes_moved for t in timings}) < 2:
        return None
    xs = [float(t.bytes_moved) for t in timings]
    ys = [t.time_ms for t in timings]
    _slope, intercept = statistics.linear_regression(xs, ys)
    return intercept if intercept > 0 else None


def calibrate(
    device: str | torch.device = "cuda",
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 10,
    *,
    budget_ms: float = 100.0,
    fma_elements: int = _FMA_ELEMENTS,
    fma_iters: int = _FMA_ITERS,
    dot_size: int = _DOT_SIZE,
    l2: bool = True,
) -> Calibration:
    """Time the microbenchmarks on ``device`` and summarize them.

    Args:
        device: ``"cuda"`` (or ``"cuda:N"``); ``"cpu"`` runs the Triton interpreter (simulated).
        sizes: fp32 elements per buffer for copy and triad.
        repeats: at least this many timed runs per measurement (more while within ``budget_ms``).
        budget_ms: time to spend per measurement (see :func:`fxcost.bench.bench_ms`).
        fma_elements, fma_iters: size of the FMA benchmark (elements, FMAs per chain).
        dot_size: M = N = K of the ``tl.dot`` benchmark (a multiple of the dot kernel's 128 tile).
        l2: also measure L2 bandwidth (CUDA only: ``l2_bandwidth_gbps`` is ``None`` on the CPU).

    Raises:
        RuntimeError: ``device`` is CUDA and none is present, or CPU without ``TRITON_INTERPRET=1``.
    """
    import torch

    _check_sizes(sizes, repeats)
    dev = _device(device)
    k = _kernels(dev)
    tile = max(k.DOT_BLOCK)
    if dot_size < 1 or dot_size % tile:  # found before any benchmark runs, not after the others
        raise ValueError(f"dot_size must be a positive multiple of {tile}, got {dot_size}")

    def bench(fn: Callable[[], Any]) -> float:
        return _bench(fn, dev, repeats, budget_ms)

    timings = [t for n in map(int, sizes) for t in _stream(k, dev, n, bench)]
    x = torch.rand(fma_elements, dtype=torch.float32, device=dev)
    fma_ms = bench(functools.partial(k.fma, x, torch.empty_like(x), fma_iters))
    fma_tflops = k.fma_flops(fma_elements, fma_iters) / fma_ms / 1e9
    launch_ms = bench(functools.partial(k.empty, x))
    del x
    dot_tflops = {dtype: _dot_tflops(k, dev, dot_size, getattr(torch, dtype), bench) for dtype in DOT_DTYPES}

    l2_bytes = _l2_bytes(dev)
    l2_gbps = None
    if l2 and l2_bytes > 0:
        l2_gbps = _l2_bandwidth_gbps(k, dev, l2_bytes, bench)

    op_overhead_ms, op_floor_ms = torch_op_costs(dev, repeats=repeats, budget_ms=budget_ms)
    copies = [t for t in timings if t.kernel == "copy"]
    triads = [t for t in timings if t.kernel == "triad"]
    return Calibration(
        device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)",
        on_gpu=dev.type == "cuda",
        dtype="float32",
        achieved_bandwidth_gbps=_median_bandwidth(copies, l2_bytes),
        triad_bandwidth_gbps=_median_bandwidth(triads, l2_bytes),
        fma_tflops=fma_tflops,
        dot_tflops=dot_tflops,
        launch_overhead_ms=launch_ms,
        kernel_overhead_ms=_intercept_ms(copies),
        op_overhead_ms=op_overhead_ms,
        op_floor_ms=op_floor_ms,
        l2_bandwidth_gbps=l2_gbps,
        timings=tuple(timings),
    )


def _stream(k: Any, dev: torch.device, n: int, bench: _Bench) -> list[SizeTiming]:
    import torch

    b = torch.rand(n, dtype=torch.float32, device=dev)
    c = torch.rand(n, dtype=torch.float32, device=dev)
    out = torch.empty_like(b)
    return [
        SizeTiming("copy", n, 2 * b.nbytes, _per_launch(bench, functools.partial(k.copy, b, out))),
        SizeTiming("triad", n, 3 * b.nbytes, _per_launch(bench, functools.partial(k.triad, b, c, 3.0, out))),
    ]


def _per_launch(bench: _Bench, fn: Callable[[], Any]) -> float:
    """Milliseconds per call of ``fn``, timed :data:`STREAM_LAUNCHES` calls at a time."""

    def launches() -> None:
        for _ in range(STREAM_LAUNCHES):
            fn()

    return bench(launches) / STREAM_LAUNCHES


def _dot_tflops(k: Any, dev: torch.device, size: int, dtype: torch.dtype, bench: _Bench) -> float:
    import torch

    a = torch.randn(size, size, device=dev).to(dtype)
    b = torch.randn(size, size, device=dev).to(dtype)
    out = torch.empty(size, size, dtype=torch.float32, device=dev)
    ms = bench(functools.partial(k.dot, a, b, out))
    return k.dot_flops(size, size, size) / ms / 1e9


def _l2_bandwidth_gbps(k: Any, dev: torch.device, l2_bytes: int, bench: _Bench) -> float:
    import torch

    block_bytes = k.BLOCK * torch.finfo(torch.float32).bits // 8
    x_blocks = max(1, int(l2_bytes * _L2_FRACTION) // block_bytes)
    x = torch.rand(x_blocks * k.BLOCK, dtype=torch.float32, device=dev)
    programs = 8 * x_blocks  # enough programs to fill the GPU many times over
    out = torch.empty(programs * k.BLOCK, dtype=torch.float32, device=dev)
    ms = bench(lambda: k.l2_read(x, out, _L2_REPS))
    return float(k.l2_read_bytes(x, out, _L2_REPS) / ms / 1e6)


def torch_copy_bandwidth_gbps(
    device: str | torch.device = "cuda",
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 10,
    *,
    budget_ms: float = 100.0,
) -> float:
    """PyTorch's own ``dst.copy_(src)`` bandwidth, timed and summarized exactly as :func:`calibrate`'s copy
    (:data:`STREAM_LAUNCHES` launches at a time).

    The reference for checking a calibration: both should agree within a few percent on a GPU.
    """
    import torch

    _check_sizes(sizes, repeats)
    dev = _device(device)

    def bench(fn: Callable[[], Any]) -> float:
        return _bench(fn, dev, repeats, budget_ms)

    def one(n: int) -> SizeTiming:
        src = torch.rand(n, dtype=torch.float32, device=dev)
        dst = torch.empty_like(src)
        return SizeTiming(
            "torch_copy", n, 2 * src.nbytes, _per_launch(bench, functools.partial(dst.copy_, src))
        )

    timings = [one(n) for n in map(int, sizes)]
    return _median_bandwidth(timings, _l2_bytes(dev))


# The device table's definitions (benchmarks/calibrate_devices.py): the overhead is the intercept over
# ops of at least 2^20 elements, the floor the median time of ops under 4096 elements.
OP_SIZES = (1 << 20, 1 << 22, 1 << 24)
OP_TINY = (1, 64, 1024, 4000)


def torch_op_costs(
    device: str | torch.device = "cuda", repeats: int = 10, *, budget_ms: float = 100.0
) -> tuple[float | None, float]:
    """(kernel_overhead_ms, launch_floor_ms) of ``torch.add`` on fp32 tensors, as the device table
    defines them: the intercept of time over bytes at :data:`OP_SIZES` elements (``None`` where it
    comes out negative), and the median time at :data:`OP_TINY` elements."""
    import torch

    dev = _device(device)

    def time_ms(n: int) -> float:
        a, b = torch.rand(n, device=dev), torch.rand(n, device=dev)
        return _bench(functools.partial(torch.add, a, b), dev, repeats, budget_ms)

    large = [SizeTiming("torch_add", n, 3 * 4 * n, time_ms(n)) for n in OP_SIZES]
    return _intercept_ms(large), statistics.median(time_ms(n) for n in OP_TINY)
