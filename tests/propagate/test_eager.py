"""The eager pipeline fitted on a measured step (fxcost.propagate.eager.origin_pipeline): the host time
per op and the in-step kernel scale, and when L2 explains that scale."""

from __future__ import annotations

import numpy as np
import pytest

from fxcost.gpus import get_device
from fxcost.propagate.eager import Pipeline, origin_pipeline, replay_ms
from fxcost.records import KernelRecord, NodeCost

H100 = get_device("H100-SXM")


def _kernel(i: int, ms: float, bytes_read: int) -> NodeCost:
    node = NodeCost(f"k{i}", "aten.mm.default", "fw", bytes_read=bytes_read, bytes_written=0)
    node.kernels = [KernelRecord("gemm", ms)]
    return node


def test_a_gpu_bound_step_scales_its_kernels_to_fill_it() -> None:
    # Memory-bound kernels of 20 us reading 50 MB each (the H100's L2): in-step reads from L2 could
    # save most of their time, so running 10% faster back to back is explained.
    nodes = [_kernel(i, 0.02, 50 * 10**6) for i in range(10)]
    pipeline = origin_pipeline(nodes, H100, step_ms=0.18)
    assert pipeline.fitted and pipeline.kernel_scale < 0.9
    assert pipeline.l2_explained
    kernels = np.full(10, 0.02 * pipeline.kernel_scale)
    assert replay_ms(kernels, pipeline.host_ms) == pytest.approx(0.18, rel=1e-3)


def test_a_host_that_fills_the_step_alone_leaves_the_kernels_their_share() -> None:
    # Many tiny kernels: the step is shorter than the ops times the default host time. The kernels
    # still ran: they fill the step back to back, not nothing.
    nodes = [_kernel(i, 0.002, 10**6) for i in range(1000)]
    pipeline = origin_pipeline(nodes, H100, step_ms=1.6)
    assert pipeline.host_ms == pytest.approx(1.6 / 1001)  # the last kernel ran after the last issue
    assert pipeline.kernel_scale == pytest.approx(1.6 / 2.0, rel=0.01)
    assert replay_ms(np.full(1000, 0.002 * pipeline.kernel_scale), pipeline.host_ms) == pytest.approx(1.6)


def test_a_scale_beyond_what_l2_explains_marks_another_graph() -> None:
    # GEMMs reading 1 MB each recorded at twice the step: no input found in L2 saves half their time.
    nodes = [_kernel(i, 1.0, 10**6) for i in range(10)]
    pipeline = origin_pipeline(nodes, H100, step_ms=5.0)
    assert pipeline.kernel_scale == pytest.approx(0.5, abs=0.01)
    assert not pipeline.l2_explained
    assert Pipeline().l2_explained  # nothing fitted: nothing to doubt
