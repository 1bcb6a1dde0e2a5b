"""FLOP counts of the annotated graph against hand counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxcost
from fxcost.lowering import count_flops, is_matmul_class

aten = torch.ops.aten


def _nodes(report, op):
    return [n for n in report.nodes if n.op == op]


def test_linear_forward_and_backward_flops_equal_hand_counts() -> None:
    b, k, n = 8, 32, 16
    model = nn.Linear(k, n)
    report = fxcost.profile(model, (torch.randn(b, k),), devices=["T4"], measure=False)
    (addmm,) = _nodes(report, "aten.addmm.default")
    assert addmm.flops == 2 * b * k * n
    mms = _nodes(report, "aten.mm.default")  # grad of weight [n,b]@[b,k]; no grad of the input
    assert [m.flops for m in mms] == [2 * n * b * k]


def test_bmm_flops() -> None:
    def f(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, c)

    a = torch.randn(3, 5, 7, requires_grad=True)
    c = torch.randn(3, 7, 11, requires_grad=True)
    report = fxcost.profile(f, (a, c), devices=["T4"], measure=False)
    bmms = _nodes(report, "aten.bmm.default")
    assert len(bmms) == 3  # forward, grad a, grad c
    assert all(m.flops == 2 * 3 * 5 * 7 * 11 for m in bmms)


def test_convolution_flops() -> None:
    n, cin, cout, h, k = 2, 3, 8, 10, 3
    model = nn.Conv2d(cin, cout, k, padding=1, bias=False)
    report = fxcost.profile(model, (torch.randn(n, cin, h, h),), devices=["T4"], measure=False)
    (conv,) = _nodes(report, "aten.convolution.default")
    assert conv.flops == 2 * n * cout * h * h * cin * k * k
    (conv_bw,) = _nodes(report, "aten.convolution_backward.default")
    assert conv_bw.flops == 2 * n * cout * h * h * cin * k * k  # grad of weight only (input is data)


def test_pointwise_reduction_view_and_unknown() -> None:
    x = torch.empty(4, 6)
    assert count_flops(aten.relu.default, (x,), {}, x) == 24
    assert count_flops(aten.sum.default, (x,), {}, torch.empty(())) == 24
    assert count_flops(aten.view.default, (x, [24]), {}, torch.empty(24)) == 0
    assert count_flops(aten.clone.default, (x,), {}, x) == 0
    values, indices = torch.empty(4), torch.empty(4, dtype=torch.long)
    # No formula: unknown, not zero.
    assert count_flops(aten.kthvalue.default, (x, 2), {}, (values, indices)) is None


def test_matmul_class() -> None:
    assert is_matmul_class("aten.addmm.default")
    assert is_matmul_class("aten.convolution_backward.default")
    assert not is_matmul_class("aten.add.Tensor")


@pytest.mark.parametrize(
    "dims", [(8, 3, 64, 7, 224, 2, 3), (2, 64, 64, 3, 56, 1, 1), (1, 256, 512, 1, 28, 2, 0)]
)
def test_data_set_convolutions_count_flops_as_torch_does(dims: tuple[int, ...]) -> None:
    from fxcost.lowering.nodes import conv_node

    *_, stride, padding = dims
    node = conv_node(*dims)
    x, w = (torch.empty(s, device="meta") for s in node.in_shapes)
    conv = torch.ops.aten.convolution.default
    out = torch.empty(node.out_shapes[0], device="meta")
    args = (x, w, None, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1)
    assert node.flops == count_flops(conv, args, {}, out)
