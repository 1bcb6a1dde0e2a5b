"""Measuring on the local device: one timing helper (:func:`bench_ms`, in the manner of
``triton.testing.do_bench``) and the kernels each node launched, read from torch.profiler."""

from fxcost.bench.profiling import kernel_range, kernels_by_range, kernels_from_profiler, recording_kernels
from fxcost.bench.timing import bench_ms

__all__ = ["bench_ms", "kernel_range", "kernels_by_range", "kernels_from_profiler", "recording_kernels"]
