"""Kernel times of isolated-op predictions in an eager step: the overhead hidden, the DRAM floor kept."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fxcost.cost_models import NodeBatch, model_chain, predict_batch
from fxcost.cost_models.eager import (
    MIN_KERNEL_MS,
    dram_floor_ms,
    hidden_overhead_ms,
    kernel_ms,
    kernel_times,
    node_dram_floor_ms,
    streamed_bytes,
)
from fxcost.gpus import get_device
from fxcost.lowering.nodes import gemm_node, memory_pass, synthetic_node
from fxcost.propagate.eager import eager_kernel_ms

H100 = get_device("H100-SXM")


def _rotary_product():
    """Hugging Face Llama's rotary product in bf16 autocast: bf16 queries times fp32 cosines, fp32 out
    (24 MB moved; the H100 recorded 26 us)."""
    node = synthetic_node("aten.mul.Tensor", [(4, 4, 2048, 128), (1, 1, 2048, 128)], [(4, 4, 2048, 128)])
    node.in_dtypes = ["bfloat16", "float32"]
    node.bytes_read = 4 * 4 * 2048 * 128 * 2 + 2048 * 128 * 4
    node.bytes_written = 4 * 4 * 2048 * 128 * 4
    return node


def test_streamed_bytes_count_only_ops_that_read_every_operand_whole() -> None:
    rotary = _rotary_product()
    assert streamed_bytes(rotary) == rotary.bytes
    cat = synthetic_node("aten.cat.default", [(64, 128), (64, 128)], [(128, 128)])
    assert streamed_bytes(cat) == cat.bytes
    # A gather reads the rows it copies, not its table; a fill never reads its template; a GEMM re-reads.
    lookup = synthetic_node("aten.embedding.default", [(50000, 1024), (8, 512)], [(8, 512, 1024)])
    template = synthetic_node("aten.zeros_like.default", [(4096, 4096)], [(4096, 4096)])
    for node in (lookup, template, gemm_node("linear", 1, 4096, 4096, 4096)):
        assert streamed_bytes(node) == 0.0


def test_a_kernel_time_is_never_below_its_dram_floor() -> None:
    node = _rotary_product()
    floor = node_dram_floor_ms(node, H100)
    assert floor == pytest.approx(node.bytes / (H100.mem_bandwidth_gbps * 1e6))
    batch = NodeBatch.of([node])
    assert dram_floor_ms(batch, H100)[0] == pytest.approx(floor)
    ms, sources = predict_batch(batch, model_chain("mlp"), H100)
    # The isolated prediction less the hidden overhead of the weakest GPU the H100 beats: not physical.
    assert ms[0] - hidden_overhead_ms(H100) < floor
    assert kernel_times(batch, ms, sources, H100)[0] == pytest.approx(floor)
    node.pred_ms, node.pred_source = {H100.name: float(ms[0])}, {H100.name: str(sources[0])}
    assert eager_kernel_ms(node, H100, hidden_overhead_ms(H100)) == pytest.approx(floor)


def test_the_floor_leaves_unpredicted_and_measured_times_alone() -> None:
    one_ms = memory_pass(H100.mem_bandwidth_gbps * 1e6, "float32")  # a pass whose floor is 1 ms
    batch = NodeBatch.of([one_ms, one_ms, gemm_node("linear", 1, 64, 64, 64)])  # floors 1, 1 and 0 ms
    assert dram_floor_ms(batch, H100).tolist() == pytest.approx([1.0, 1.0, 0.0], rel=1e-6)
    ms = np.array([np.nan, 0.5, 0.001])
    sources = np.array(["none", "origin", "mlp"])
    times = kernel_times(batch, ms, sources, H100)
    assert np.isnan(times[0]) and times[1] == 0.5 and times[2] == MIN_KERNEL_MS
    assert kernel_ms(0.5, "origin", H100, floor_ms=1.0) == 0.5
    assert kernel_ms(0.1, "mlp", H100, hidden_ms=0.02, floor_ms=0.2) == 0.2


def test_full_reductions_stream_their_input_and_a_gpu_without_bandwidth_has_no_floor() -> None:
    total = synthetic_node("aten.sum.dim_IntList", [(4, 2048, 2048)], [(4, 2048)])
    assert streamed_bytes(total) == total.bytes > 0
    blind = dataclasses.replace(H100, mem_bandwidth_gbps=None)
    assert node_dram_floor_ms(total, blind) == 0.0
    assert dram_floor_ms(NodeBatch.of([total]), blind)[0] == 0.0
