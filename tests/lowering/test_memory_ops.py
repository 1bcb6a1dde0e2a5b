"""Memory passes of indexing, sorting and bag ops, and elementwise ops PyTorch does not tag pointwise:
bytes per kernel hand-computed on small shapes; a captured model using all of them leaves nothing to
the roofline."""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import fxcost
from fxcost.cost_models.heads import LOWERED, head_of
from fxcost.lowering import count_flops, lower
from fxcost.records import NodeCost

aten = torch.ops.aten
F32, I64 = "float32", "int64"


Tensors = list[tuple[tuple[int, ...], str]]


def _node(op: str, ins: Tensors, outs: Tensors, **args: object) -> NodeCost:
    return NodeCost(
        name="n", op=op, phase="fw", in_shapes=[s for s, _ in ins], in_dtypes=[d for _, d in ins],
        out_shapes=[s for s, _ in outs], out_dtypes=[d for _, d in outs], args=dict(args),
    )  # fmt: skip


def _passes(node: NodeCost) -> list[tuple[str, float]]:
    kernels = lower(node)
    assert kernels is not None and head_of(node) == LOWERED
    return [(k.name, k.bytes) for k in kernels]


def test_roll_reads_and_writes_each_element_once() -> None:
    x = (2, 8, 16)
    assert _passes(_node("aten.roll.default", [(x, F32)], [(x, F32)], shifts=[1], dims=[-1])) == [
        ("roll", 2 * 256 * 4)
    ]


def test_upsampling_gathers_and_its_gradient_sorts_then_adds() -> None:
    x, up, rows, cols = (2, 8, 8, 8), (2, 8, 16, 16), (16, 1), (16,)
    gather = _node("aten._unsafe_index.Tensor", [(x, F32), (rows, I64), (cols, I64)], [(up, F32)])
    assert _passes(gather) == [("gather_kernel", 2 * 4096 * 4 + 16 * 8 + 16 * 8)]
    put = _node("aten._unsafe_index_put.default", [(x, F32), (rows, I64), (cols, I64), (up, F32)], [(x, F32)],
                accumulate=True)  # fmt: skip
    values, keys = 4096, 16 * 16  # one value per upsampled element; one index per (row, col) pair
    assert _passes(put) == [
        ("copy", 2 * 1024 * 4),
        ("linear_index", 256 + keys * 8),
        ("sort_indices", 1 * 2 * 2 * 8 * keys),  # keys below 8 x 8 = 64: 6 bits, one 8-bit digit pass
        ("index_put_with_sort", 3 * values * 4 + 2 * keys * 8),
    ]
    # The gradient of a row gather (x[idx]): one key per index, each adding a 1,024-wide row.
    rows_put = _node("aten.index_put.default", [((50_000, 1024), F32), ((8192,), I64), ((8192, 1024), F32)],
                     [((50_000, 1024), F32)], accumulate=True)  # fmt: skip
    assert dict(_passes(rows_put))["sort_indices"] == 2 * 2 * 2 * 8 * 8192  # keys below 50,000: 16 bits
    plain = NodeCost.from_json({**put.to_json(), "args": {"accumulate": False}})
    assert _passes(plain) == [("copy", 2 * 1024 * 4), ("index_put", 2 * values * 4 + 256)]


def test_sort_short_rows_in_shared_memory_long_rows_by_radix_digits() -> None:
    short = _node("aten.sort.default", [((4, 100), F32)], [((4, 100), F32), ((4, 100), I64)], dim=1)
    both = 400 * 4 + 400 * 8
    assert _passes(short) == [("copy", 2 * 1600), ("fill_indices", 3200), ("sort_in_shared_memory", 2 * both)]
    long = _node("aten.sort.default", [((2, 10_000), F32)], [((2, 10_000), F32), ((2, 10_000), I64)], dim=-1)
    both = 20_000 * (4 + 8)
    assert _passes(long)[2:] == [("radix_sort_pass", 2 * both)] * 4  # 32-bit keys: four digits


def test_topk_selects_by_radix_digits_then_gathers_and_sorts_the_k() -> None:
    x = (4, 1000)
    node = _node("aten.topk.default", [(x, F32)], [((4, 5), F32), ((4, 5), I64)], k=5, dim=1, sorted=True)
    picked = 20 * 4 + 20 * 8
    assert _passes(node) == [
        *[("radix_select", 16_000)] * 4,
        ("gather_topk", 16_000 + picked),
        ("sort_in_shared_memory", 2 * picked),
    ]
    assert count_flops(aten.topk.default, (torch.empty(x), 5), {}, (torch.empty(4, 5),) * 2) == 0


def test_scatter_copies_then_writes_one_element_per_index() -> None:
    x, idx = (4, 100), (4, 5)
    node = _node("aten.scatter.src", [(x, F32), (idx, I64), (idx, F32)], [(x, F32)], dim=1)
    assert _passes(node) == [("copy", 2 * 1600), ("scatter", 160 + 80 + 80)]
    add = _node("aten.scatter_add.default", [(x, F32), (idx, I64), (idx, F32)], [(x, F32)], dim=1)
    assert _passes(add)[1] == ("scatter", 160 + 80 + 80 + 80)  # reads the destination it adds to


def test_embedding_bag_reads_only_the_rows_its_indices_name() -> None:
    weight, indices, offsets, bags = (1000, 16), (30,), (4,), (4, 16)
    outs = [(bags, F32), (indices, I64), (offsets, I64), (offsets, I64)]
    node = _node("aten._embedding_bag.default", [(weight, F32), (indices, I64), (offsets, I64)], outs, mode=1)
    rows = 30 * 16 * 4
    assert _passes(node) == [
        ("fill", 240),
        ("offset2bag", 32 + 2 * 240),
        ("embedding_bag", 240 + 240 + rows + 256 + 32 + 32),
    ]
    tensors = (
        torch.empty(weight),
        torch.zeros(indices, dtype=torch.long),
        torch.zeros(offsets, dtype=torch.long),
    )
    assert count_flops(aten._embedding_bag.default, tensors, {}, None) == 30 * 16
    ins = [(bags, F32), (indices, I64), (offsets, I64), (indices, I64), (offsets, I64), (offsets, I64)]
    backward = _node("aten._embedding_bag_backward.default", ins, [(weight, F32)], num_weights=1000)
    assert _passes(backward) == [
        ("fill", 64_000),
        ("sort_indices", 2 * 2 * 2 * 8 * 30),  # indices below 1,000: 10 bits, two digit passes
        ("embedding_bag_backward", 2 * rows + 3 * 30 * 8),
    ]


def test_hardswish_and_friends_are_elementwise_kernels() -> None:
    x = (2, 8, 4, 4)
    for op, inputs in [("aten.hardswish.default", 1), ("aten.hardswish_backward.default", 2),
                       ("aten.hardsigmoid_backward.default", 2)]:  # fmt: skip
        node = _node(op, [(x, F32)] * inputs, [(x, F32)])
        assert head_of(node) == "ew"
        (kernel,) = lower(node) or []
        assert kernel.name == "vectorized_elementwise_kernel" and kernel.launch.grid == (1, 1, 1)
    t = torch.empty(x)
    assert count_flops(aten.hardswish.default, (t,), {}, t) == math.prod(x)


class _Ops(nn.Module):
    """Every op above in one training step."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bag = nn.Conv2d(3, 8, 3, padding=1), nn.EmbeddingBag(50, 8, mode="mean")

    def forward(self, x: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.conv(x))
        y = y * F.hardsigmoid(y.mean((2, 3), keepdim=True))
        y = F.interpolate(y, scale_factor=2, mode="bilinear").roll(1, dims=-1)
        flat = y.flatten(1)
        top, _ = flat.topk(5, dim=1)
        ordered, _ = flat.sort(dim=1)
        return top.sum() + ordered[:, :10].sum() + self.bag(ids, offsets).sum()


def test_a_model_of_these_ops_leaves_nothing_to_the_roofline() -> None:
    inputs = (torch.randn(2, 3, 8, 8), torch.randint(0, 50, (10,)), torch.tensor([0, 4]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fxcost.profile(_Ops(), inputs, devices=["A100-SXM4-80GB"], measure=False)
    ops = {n.op for n in report.nodes}
    assert {"aten.roll.default", "aten._unsafe_index_put.default", "aten._embedding_bag_backward.default",
            "aten.scatter.src", "aten.hardswish_backward.default"} <= ops  # fmt: skip
    fallback = [n.op for n in report.nodes if n.has_kernel and n.pred_source["A100-SXM4-80GB"] != "mlp"]
    assert fallback == []
