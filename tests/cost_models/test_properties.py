"""Property-based checks of the cost models over random ops and every GPU in the database."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fxcost import cost_models
from fxcost.cost_models import NodeBatch
from fxcost.cost_models.roofline import Roofline
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import device_names, get_device
from fxcost.lowering.nodes import conv_node, gemm_node
from fxcost.records import NodeCost

GPUS = [d for d in device_names() if get_device(d).mem_bandwidth_gbps and get_device(d).fp32_tflops]
dims = st.integers(min_value=1, max_value=8192)
gpus = st.sampled_from(GPUS)
ops = st.one_of(
    st.builds(lambda b, m, n, k: gemm_node("bmm", b, m, n, k), st.integers(1, 64), dims, dims, dims),
    st.builds(lambda m, n, k: gemm_node("linear", 1, m, n, k), dims, dims, dims),
    st.builds(
        kernel_alike_node, st.sampled_from(["add", "mulu", "gelu", "tanh", "ln", "softmax"]), dims, dims
    ),
    st.builds(
        lambda b, c, o, s: conv_node(b, c, o, 3, s, 1, 1),
        st.integers(1, 32),
        st.integers(1, 512),
        st.integers(1, 512),
        st.integers(3, 128),
    ),
)


@settings(max_examples=60, deadline=None)
@given(node=ops, gpu=gpus)
def test_default_predictions_are_finite_and_positive(node, gpu) -> None:  # type: ignore[no-untyped-def]
    cost_models.predict([node], [gpu])
    ms = node.pred_ms[get_device(gpu).name]
    assert ms is not None and math.isfinite(ms) and ms > 0


@settings(max_examples=60, deadline=None)
@given(node=ops, gpu=gpus)
def test_wave_scaling_to_the_origin_itself_is_the_identity(node, gpu) -> None:  # type: ignore[no-untyped-def]
    node.origin_ms = 0.37
    cost_models.predict([node], [gpu], origin=gpu)
    assert node.pred_ms[get_device(gpu).name] == 0.37  # either model: the measurement is the answer


@settings(max_examples=60, deadline=None)
@given(m=dims, n=dims, k=dims, a=gpus, b=gpus)
def test_a_gpu_better_on_every_spec_never_predicts_a_compute_bound_gemm_slower(m, n, k, a, b) -> None:  # type: ignore[no-untyped-def]
    fast, slow = get_device(a), get_device(b)
    if not (fast.fp32_tflops >= slow.fp32_tflops and fast.mem_bandwidth_gbps >= slow.mem_bandwidth_gbps):
        fast, slow = slow, fast
    if not (fast.fp32_tflops >= slow.fp32_tflops and fast.mem_bandwidth_gbps >= slow.mem_bandwidth_gbps):
        return  # neither dominates
    batch = NodeBatch.of([gemm_node("linear", 1, m, n, k)])
    assert Roofline().predict(batch, fast)[0] <= Roofline().predict(batch, slow)[0]


@settings(max_examples=40, deadline=None)
@given(m=dims, n=dims, k=dims, gpu=gpus)
def test_roofline_never_predicts_less_time_for_more_flops(m, n, k, gpu) -> None:  # type: ignore[no-untyped-def]
    pair = NodeBatch.of([gemm_node("linear", 1, m, n, k), gemm_node("linear", 1, 2 * m, n, k)])
    times = Roofline().predict(pair, get_device(gpu))
    assert np.all(np.isfinite(times)) and times[1] >= times[0]


def _sum_over_rows(rows: int, width: int) -> NodeCost:
    """``x.sum(0)`` of a [rows, width] fp32 tensor: a memory-bound op the heads price through lowering."""
    return NodeCost(name="sum", op="aten.sum.dim_IntList", phase="fw", in_shapes=[(rows, width)],
                    in_dtypes=["float32"], out_shapes=[(width,)], out_dtypes=["float32"],
                    args={"dim": [0], "keepdim": False}, flops=rows * width,
                    bytes_read=4 * rows * width, bytes_written=4 * width)  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(
    op=st.sampled_from(["add", "mulu", "relu", "gelu", "tanh", "sum"]),
    rows=dims,
    width=dims,
    growth=st.floats(min_value=1.0, max_value=64.0),
    gpu=gpus,
)
def test_more_rows_of_an_elementwise_or_memory_bound_op_never_predict_less_time(  # type: ignore[no-untyped-def]
    op, rows, width, growth, gpu
) -> None:
    """Default, origin-free predictions: the elementwise head is read as a non-decreasing curve over
    sizes, and memory-bound ops are priced as its passes, so a larger tensor never comes out faster."""
    more = max(rows, math.ceil(rows * growth))
    make = _sum_over_rows if op == "sum" else (lambda b, h: kernel_alike_node(op, b, h))
    small, large = make(rows, width), make(more, width)
    cost_models.predict([small, large], [gpu])
    name = get_device(gpu).name
    assert large.pred_ms[name] >= small.pred_ms[name]
