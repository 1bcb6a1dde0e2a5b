"""Max pooling's forward kernel: one thread per output, one round trip per window element."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import Heads
from fxcost.cost_models.latency import latency_floor_ms
from fxcost.gpus import get_device
from fxcost.lowering import lower
from fxcost.records import NodeCost

FIXTURES = Path(__file__).parents[2] / "benchmarks" / "fixtures" / "gpu"


def _pool(x: tuple[int, ...], kernel: int = 3, stride: int = 2, padding: int = 1) -> NodeCost:
    out = (*x[:-2], *((s + 2 * padding - kernel) // stride + 1 for s in x[-2:]))
    numel, x_bytes = math.prod(out), 2 * math.prod(x)
    args = {"kernel_size": [kernel, kernel], "stride": [stride, stride], "padding": [padding, padding],
            "dilation": [1, 1], "ceil_mode": False}  # fmt: skip
    return NodeCost(name="pool", op="aten.max_pool2d_with_indices.default", phase="fw", in_shapes=[x],
                    in_dtypes=["bfloat16"], out_shapes=[out, out], out_dtypes=["bfloat16", "int64"],
                    args=args, flops=9 * numel, bytes_read=x_bytes, bytes_written=10 * numel)  # fmt: skip


def test_one_thread_per_output_and_a_round_trip_per_window_element() -> None:
    (spec,) = lower(_pool((32, 64, 112, 112)))
    assert spec.launch.grid == (32 * 64 * 56 * 56 // 256, 1, 1) and spec.launch.block == (256, 1, 1)
    assert spec.round_trips == 9 and spec.bytes == 2 * 32 * 64 * 112 * 112 + 10 * 32 * 64 * 56 * 56
    (tiny,) = lower(_pool((1, 1, 2, 2), kernel=3, stride=1, padding=1))
    assert tiny.round_trips == 4  # a 3 x 3 window over a 2 x 2 input holds at most 4 elements


def test_heads_price_max_pooling_no_faster_than_the_latency_law() -> None:
    h100 = get_device("H100-SXM")
    node = _pool((256, 64, 112, 112))
    (ms,) = Heads().predict(NodeBatch.of([node]), h100)
    (spec,) = lower(node)
    assert ms >= latency_floor_ms(spec, h100)
    assert node.bytes / (h100.bandwidth_gbps * 1e6) < 0.5 * latency_floor_ms(spec, h100)


@pytest.mark.parametrize("gpu", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"])
def test_launch_matches_the_recorded_kernel(gpu: str) -> None:
    from fxcost.report import Report

    path = FIXTURES / gpu / "resnet50-b32-bf16.json.gz"
    if not path.exists():
        pytest.skip("no recorded traces")
    nodes = [n for n in Report.load(path).nodes if n.op == "aten.max_pool2d_with_indices.default"]
    assert nodes
    for node in nodes:
        ((spec,), (kernel,)) = lower(node), node.kernels
        assert "max_pool_forward_nchw" in kernel.name
        assert (spec.launch.grid, spec.launch.block) == (kernel.grid, kernel.block)
