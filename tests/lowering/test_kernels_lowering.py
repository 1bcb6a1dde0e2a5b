"""Lowering kernel-alike ops to PyTorch's CUDA launch configurations."""

from __future__ import annotations

import math

import pytest

from fxcost.data.datasets import KERNEL_ALIKE, kernel_alike_node, read_ops, read_ops_test
from fxcost.lowering import lower
from fxcost.records import NodeCost


def test_lowering_reproduces_every_measured_launch(data_dir) -> None:
    rows = read_ops_test(data_dir, ["vec"])
    rows = rows[rows["OPName"].isin(KERNEL_ALIKE)]
    train = read_ops(data_dir, ["add", "ln", "softmax"]).sample(n=3000, random_state=0)
    columns = ["OPName", "B", "H", "Grid x", "Grid y", "Grid z", "Block x", "Block y", "Block z"]
    for frame in (rows, train):
        for op, b, h, *measured in frame[columns].drop_duplicates().itertuples(index=False):
            (spec, *_) = lower(kernel_alike_node(op, b, h))
            assert spec.launch.grid == tuple(measured[:3]), (op, b, h)
            assert spec.launch.block == tuple(measured[3:]), (op, b, h)


@pytest.mark.parametrize(
    ("op", "b", "h", "grid", "block", "kernels"),
    [
        ("add", 32768, 1600, (102400, 1, 1), (128, 1, 1), 1),  # 52.4M elements / 512 a block
        ("add", 1 << 19, 2048, (1 << 20, 1, 1), (128, 1, 1), 2),  # 2^30 fp32: split in 2 for int32
        ("softmax", 8192, 768, (2048, 1, 1), (32, 4, 1), 1),  # warp softmax: 4 rows a block
        ("softmax", 1 << 21, 1024, (1 << 18, 1, 1), (32, 4, 1), 2),  # chunks of 2^30 / 1024 rows
        ("softmax", 8192, 1600, (8192, 1, 1), (256, 1, 1), 1),  # 1600 / 4 / 2 = 200 -> 256
        ("softmax", 8192, 16384, (8192, 1, 1), (512, 1, 1), 1),  # capped at 1024 / 2
        ("ln", 8192, 1600, (8192, 1, 1), (32, 4, 1), 1),
        ("ln", 8192, 1601, (8192, 1, 1), (512, 1, 1), 2),  # not a multiple of 4: two kernels
    ],
)
def test_launch_rules(op, b, h, grid, block, kernels) -> None:
    specs = lower(kernel_alike_node(op, b, h))
    assert len(specs) == kernels
    assert specs[0].launch.grid == grid and specs[0].launch.block == block
    node = kernel_alike_node(op, b, h)
    assert sum(s.bytes for s in specs) == pytest.approx(node.bytes)


def test_row_kernels_declare_their_rereads() -> None:
    (softmax,) = lower(kernel_alike_node("softmax", 8192, 4096))
    assert softmax.reread_bytes == pytest.approx(softmax.bytes)  # two more reads of the input
    (ln,) = lower(kernel_alike_node("ln", 8192, 4096))
    assert ln.reread_bytes == pytest.approx(8192 * 4096 * 4)
    (warp,) = lower(kernel_alike_node("softmax", 8192, 1024))
    assert warp.reread_bytes == 0  # rows live in registers


def test_kernel_varying_and_view_nodes() -> None:
    mm = NodeCost(name="mm", op="aten.mm.default", phase="fw", in_shapes=[(4, 4), (4, 4)],
                  in_dtypes=["float32"] * 2, out_shapes=[(4, 4)], out_dtypes=["float32"])  # fmt: skip
    assert lower(mm) is None
    view = NodeCost(name="v", op="aten.view.default", phase="fw", has_kernel=False)
    assert lower(view) == []
    unknown = NodeCost(name="x", op="aten.no_such_op.default", phase="fw", in_shapes=[(4,)],
                       in_dtypes=["float32"], out_shapes=[(4,)], out_dtypes=["float32"])  # fmt: skip
    assert lower(unknown) is None
    reduction = NodeCost(name="s", op="aten.sum.dim_IntList", phase="fw", in_shapes=[(64, 64)],
                         in_dtypes=["float32"], out_shapes=[(64,)], out_dtypes=["float32"])  # fmt: skip
    (spec,) = lower(reduction)
    assert not spec.exact


def test_ops_on_empty_tensors_launch_nothing() -> None:
    """transformers builds ``torch.tensor([])`` in GPT-2's step: a zero-block grid would be divided by
    in wave scaling (it was: ZeroDivisionError on a recorded trace)."""
    from fxcost.cost_models import NodeBatch
    from fxcost.cost_models.wave_scaling import WaveScaling
    from fxcost.gpus import get_device

    empty = NodeCost(name="c", op="aten.lift_fresh_copy.default", phase="fw", graph=0, in_shapes=[(0,)],
                     in_dtypes=["float32"], out_shapes=[(0,)], out_dtypes=["float32"], flops=0, bytes_read=0,
                     bytes_written=0, origin_ms=0.004)  # fmt: skip
    assert lower(empty) == []
    (ms,) = WaveScaling().predict(NodeBatch.of([empty], origin=get_device("H100-SXM")), get_device("H200"))
    assert math.isnan(ms)  # no kernel to scale: left to the next model of the chain


def _op(op: str, ins: list, outs: list, dtypes: list[str] | None = None, **args) -> NodeCost:
    in_dtypes = dtypes or ["float32"] * len(ins)
    return NodeCost(name="n", op=op, phase="fw", in_shapes=ins, in_dtypes=in_dtypes, out_shapes=outs,
                    out_dtypes=["float32"] * len(outs), args=args)  # fmt: skip


def test_memory_bound_ops_lower_to_the_passes_of_their_kernels() -> None:
    x, c = (8, 16, 4, 4), (16,)  # 2048 elements, 8 KB in fp32
    train = _op("aten._native_batch_norm_legit_functional.default", [x, c, c, c, c], [x, c, c, c, c],
                training=True, momentum=0.1, eps=1e-5)  # fmt: skip
    assert [(k.name, k.bytes) for k in lower(train)] == [
        ("batch_norm_collect_statistics", 8192),  # read x for the statistics
        ("batch_norm_transform_input", 16384),  # read it again, write y
    ]
    inference = train.replace(args={**train.args, "training": False})
    assert [k.name for k in lower(inference)] == ["batch_norm_transform_input"]
    # A gather reads the rows it copies and the indices, not the whole table.
    embedding = _op("aten.embedding.default", [(1000, 64), (4, 8)], [(4, 8, 64)], ["float32", "int64"])
    assert [k.bytes for k in lower(embedding)] == [2 * 4 * 8 * 64 * 4 + 4 * 8 * 8]
    # The gradient of a slice zeroes the whole input, then copies the slice's gradient in.
    select = _op("aten.select_backward.default", [(16,)], [(8, 16)], input_sizes=[8, 16], dim=0, index=2)
    assert [(k.name, k.bytes) for k in lower(select)] == [("fill", 512), ("copy", 128)]
    assert all(not k.exact for k in lower(select))


def test_every_memory_bound_op_is_an_aten_op() -> None:
    from fxcost.lowering import MEMORY_BOUND, resolve_op

    assert MEMORY_BOUND and all(resolve_op(op) is not None for op in MEMORY_BOUND)


def test_batch_norm_backward_writes_the_input_gradient_only_when_asked() -> None:
    x, c = (8, 16, 4, 4), (16,)  # 8 KB tensors
    both = _op("aten.native_batch_norm_backward.default", [x, x, c, c, c, c, c], [x, c, c],
               train=True, eps=1e-5, output_mask=[True, True, True])  # fmt: skip
    assert [k.bytes for k in lower(both)] == [2 * (8192 + 8192) + 8192]
    weights_only = both.replace(out_shapes=[c, c], out_dtypes=["float32"] * 2,
                                args={**both.args, "output_mask": [False, True, True]})  # fmt: skip
    assert [k.bytes for k in lower(weights_only)] == [2 * (8192 + 8192)]


def test_a_long_rows_softmax_rereads_its_input_twice_forward_and_its_gradient_once_backward() -> None:
    """``cunn_SoftMaxForward``: a max pass, a sum pass and a write pass over each row. The backward
    (``cunn_SoftMaxBackward``): a sum over the incoming gradient, then the write pass reading it again
    beside the output."""
    rows, row = 64, 50_257  # a language model's loss: a log-softmax over the vocabulary
    x = (rows, row)

    def node(op: str, inputs: int) -> NodeCost:
        return NodeCost("s", op, "fw", in_shapes=[x] * inputs, in_dtypes=["float32"] * inputs,
                        out_shapes=[x], out_dtypes=["float32"], args={"dim": -1})  # fmt: skip

    (forward,) = lower(node("aten._log_softmax.default", 1))
    (backward,) = lower(node("aten._log_softmax_backward_data.default", 2))
    assert forward.name == "cunn_SoftMaxForward" and backward.name == "cunn_SoftMaxBackward"
    assert forward.reread_bytes == 2 * 4 * rows * row
    assert backward.reread_bytes == 4 * rows * row and backward.block_bytes == 2 * 4 * row
