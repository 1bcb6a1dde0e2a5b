"""Kernels bound by memory latency: the law, the sourced latencies, and the heads' floor."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads import Heads
from fxcost.cost_models.latency import latency_floor_ms, own_latency_ms
from fxcost.gpus import all_devices, get_device
from fxcost.gpus.memory_latency import dram_latency_ns, latency_source
from fxcost.gpus.order import weaker_than
from fxcost.lowering import lower
from fxcost.records import NodeCost


def _stats_node(x: tuple[int, ...], dtype: str = "bfloat16") -> NodeCost:
    c, stats, numel = (x[1],), ["float32"] * 4, math.prod(x)
    return NodeCost(name="bn", op="aten._native_batch_norm_legit_functional.default", phase="fw",
                    in_shapes=[x, c, c, c, c], in_dtypes=[dtype, *stats], out_shapes=[x, c, c, c, c],
                    out_dtypes=[dtype, *stats], args={"training": True, "eps": 1e-5}, flops=10 * numel,
                    bytes_read=3 * numel * 2, bytes_written=numel * 2)  # fmt: skip


def test_every_latency_has_a_source_and_unknown_stays_unknown() -> None:
    known = [d for d in all_devices() if dram_latency_ns(d) is not None]
    assert known, "no architecture has a DRAM latency"
    for device in known:
        assert 100 < dram_latency_ns(device) < 2000  # type: ignore[operator]
        assert latency_source(device) not in ("", "unknown")
    t4 = get_device("T4")  # Turing: no published figure in the table
    assert dram_latency_ns(t4) is None and latency_source(t4) == "unknown"


def test_latency_law_counts_waves_of_blocks() -> None:
    h100 = get_device("H100-SXM")
    latency_ms = dram_latency_ns(h100) * 1e-6  # type: ignore[operator]
    stats = lower(_stats_node((32, 64, 112, 112)))[0]
    assert own_latency_ms(stats, h100) == pytest.approx(stats.round_trips * latency_ms)  # 64 blocks: one wave
    # 4 blocks of 512 threads fit an SM: 132 SMs x 4 = 528 channels a wave, so 1024 channels take two.
    wide = lower(_stats_node((32, 1024, 14, 14)))[0]
    assert own_latency_ms(wide, h100) == pytest.approx(2 * wide.round_trips * latency_ms)
    transform = lower(_stats_node((32, 64, 112, 112)))[1]
    assert math.isnan(own_latency_ms(transform, h100))  # declares no round trips


@pytest.mark.parametrize("shape", [(32, 256, 56, 56), (1, 64, 7, 7)])
def test_a_gpu_is_never_latency_bound_faster_than_one_that_beats_it(shape: tuple[int, ...]) -> None:
    """Its floor, with the overhead it hides, nor its kernel time without it (a small channel's floor
    is mostly that overhead, which grows with the GPUs a GPU beats)."""
    stats = lower(_stats_node(shape))[0]
    for device in all_devices():
        bound = latency_floor_ms(stats, device)
        for weaker in weaker_than(device):
            if math.isfinite(bound):
                assert latency_floor_ms(stats, weaker) >= bound, (weaker.name, device.name)
                kernel = bound - hidden_overhead_ms(device)
                assert latency_floor_ms(stats, weaker) - hidden_overhead_ms(weaker) >= kernel
    # The A100 has no latency of its own here, but is never faster than the H100 that beats it.
    assert math.isnan(own_latency_ms(stats, get_device("A100-SXM4-80GB")))
    assert latency_floor_ms(stats, get_device("A100-SXM4-80GB")) >= own_latency_ms(
        stats, get_device("H100-SXM")
    )


def test_heads_price_batch_norm_statistics_no_faster_than_the_latency_law() -> None:
    """A large channel's statistics moved at full bandwidth would take a fraction of what 512 threads
    with one load each in flight can fetch: the latency-bound time sets the price."""
    h100 = get_device("H100-SXM")
    node = _stats_node((32, 64, 112, 112))
    (ms,) = Heads().predict(NodeBatch.of([node]), h100)
    stats = lower(node)[0]
    assert ms >= latency_floor_ms(stats, h100) >= own_latency_ms(stats, h100) + hidden_overhead_ms(h100)
    # The bandwidth pass of the same bytes is far shorter: the floor is what moved the price.
    assert stats.bytes / (h100.bandwidth_gbps * 1e6) < 0.2 * own_latency_ms(stats, h100)


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-SXM4-80GB", "T4"])
def test_batch_norm_never_gets_cheaper_as_the_batch_grows(gpu: str) -> None:
    from fxcost.lowering.nodes import batch_norm_node

    nodes = [batch_norm_node((b, 256, 28, 28), "bfloat16", backward) for backward in (False, True)
             for b in (1, 2, 8, 32, 64, 256)]  # fmt: skip
    ms = Heads().predict(NodeBatch.of(nodes), get_device(gpu)).reshape(2, -1)
    assert np.isfinite(ms).all() and (np.diff(ms, axis=1) >= 0).all()
