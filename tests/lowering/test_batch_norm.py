"""Batch norm's CUDA kernels: launches of PyTorch's NCHW path and the round trips that bound them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fxcost.lowering import lower
from fxcost.lowering.batch_norm import channel_launch, num_threads
from fxcost.records import NodeCost

FIXTURES = Path(__file__).parents[2] / "benchmarks" / "fixtures" / "gpu"


def _forward(x: tuple[int, ...], dtype: str = "float32", training: bool = True) -> NodeCost:
    c = x[1:2]
    stats = ["float32"] * 4
    return NodeCost(name="bn", op="aten._native_batch_norm_legit_functional.default", phase="fw",
                    in_shapes=[x, c, c, c, c], in_dtypes=[dtype, *stats], out_shapes=[x, c, c, c, c],
                    out_dtypes=[dtype, *stats], args={"training": training, "eps": 1e-5})  # fmt: skip


def _backward(x: tuple[int, ...], mask: list[bool], train: bool = True) -> NodeCost:
    c = (x[1],)
    outs = ([x] if mask[0] else []) + [c, c]
    args = {"train": train, "eps": 1e-5, "output_mask": mask}
    return NodeCost(name="bnb", op="aten.native_batch_norm_backward.default", phase="bw",
                    in_shapes=[x, x, c, c, c, c, c], in_dtypes=["float32"] * 7, out_shapes=outs,
                    out_dtypes=["float32"] * len(outs), args=args)  # fmt: skip


@pytest.mark.parametrize(
    ("elements", "threads"), [(1, 32), (49, 64), (196, 256), (256, 256), (257, 512), (12544, 512)]
)
def test_threads_follow_get_num_threads(elements: int, threads: int) -> None:
    assert num_threads(elements) == threads


def test_one_block_per_channel_and_the_iterations_of_its_threads() -> None:
    launch, iterations = channel_launch((32, 64, 112, 112))
    assert launch.grid == (64, 1, 1) and launch.block == (512, 1, 1)
    assert iterations == 32 * math.ceil(112 * 112 / 512)  # every row of the batch, 25 strides each
    launch, iterations = channel_launch((32, 2048, 7, 7))
    assert launch.block == (64, 8, 1) and iterations == 4  # 8 rows at once: 4 rows a thread, 1 stride each
    launch, iterations = channel_launch((64, 300))  # BatchNorm1d: one element a row
    assert launch.block == (32, 16, 1) and iterations == 4


def test_statistics_and_backward_declare_their_round_trips() -> None:
    stats, transform = lower(_forward((8, 16, 32, 32)))
    assert stats.round_trips == 8 * 2 and transform.round_trips == 0  # 1024 elements a row, 512 threads
    assert stats.bytes == 8 * 16 * 32 * 32 * 4 and transform.bytes == 2 * stats.bytes
    (inference,) = lower(_forward((8, 16, 32, 32), training=False))
    assert inference.name == "batch_norm_transform_input" and inference.round_trips == 0
    (both,) = lower(_backward((8, 16, 32, 32), [True, True, True]))
    (weights_only,) = lower(_backward((8, 16, 32, 32), [False, True, True]))
    assert both.round_trips == 1 + 2 * 16 and weights_only.round_trips == 1 + 16  # statistics, then walks
    assert all(k.round_trips == 0 for k in lower(_backward((8, 16, 32, 32), [True, True, True], train=False)))


def test_bad_input_rank_is_not_lowered() -> None:
    assert lower(_forward((16,))) is None


@pytest.mark.parametrize("gpu", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"])
def test_launches_match_the_recorded_kernels(gpu: str) -> None:
    """Every batch-norm kernel a lent GPU recorded in ResNet-50's step ran the launch lowering gives it
    (the running statistics' one-block update, not lowered, aside)."""
    from fxcost.report import Report

    path = FIXTURES / gpu / "resnet50-b32-bf16.json.gz"
    if not path.exists():
        pytest.skip("no recorded traces")
    checked = 0
    for node in Report.load(path).nodes:
        if "batch_norm" not in node.op or not node.kernels:
            continue
        names = ("batch_norm_collect_statistics", "batch_norm_transform_input", "batch_norm_backward")
        recorded = [k for k in node.kernels if any(f"{name}_kernel<" in k.name for name in names)]
        lowered = lower(node)
        assert lowered is not None and len(lowered) == len(recorded), node.op
        for spec, kernel in zip(lowered, recorded, strict=True):
            assert spec.name in kernel.name
            assert (spec.launch.grid, spec.launch.block) == (tuple(kernel.grid), tuple(kernel.block)), (
                node.in_shapes
            )
            checked += 1
    assert checked > 100


def test_synthetic_batch_norm_nodes_keep_statistics_in_fp32() -> None:
    from fxcost.lowering.nodes import batch_norm_node

    forward = batch_norm_node((8, 16, 4, 4), "bfloat16")
    backward = batch_norm_node((8, 16, 4, 4), "bfloat16", backward=True)
    assert forward.in_dtypes == ["bfloat16"] + ["float32"] * 4
    assert backward.in_dtypes[:2] == ["bfloat16"] * 2
    assert backward.out_dtypes == ["bfloat16", "float32", "float32"]
    assert backward.bytes_written == 8 * 16 * 4 * 4 * 2 + 2 * 16 * 4
    assert [k.name for k in lower(forward)] == ["batch_norm_collect_statistics", "batch_norm_transform_input"]
    # 16 elements a row: 32 x 16 threads cover all 8 rows in one stride each
    assert [k.round_trips for k in lower(backward)] == [1 + 2 * 1]
