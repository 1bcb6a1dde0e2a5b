"""Graph shapes users have: custom autograd functions, in-place ops, channels-last, gradient
accumulation, inference under no_grad. Each runs under the backend exactly as in eager."""

from __future__ import annotations

import copy

import torch
from torch import nn

import fxcost


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        y.add_(1.0)
        return _Square.apply(y.relu_())


def _same_as_eager(model: nn.Module, inputs: list[torch.Tensor], steps: int = 1) -> fxcost.Report:
    """Run ``steps`` training steps compiled and eagerly (gradients accumulate); compare everything."""
    torch._dynamo.reset()
    eager = copy.deepcopy(model)
    backend = fxcost.estimate(devices=["T4"], budget_ms=0.2)
    compiled = torch.compile(model, backend=backend)
    for _ in range(steps):
        for x in inputs:
            out, ref = compiled(x), eager(x)
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
            out.sum().backward()
            ref.sum().backward()
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
    assert not backend.failures
    return fxcost.last_report()


def test_custom_autograd_function_and_in_place_ops() -> None:
    report = _same_as_eager(_InPlace(), [torch.randn(4, 16)])
    ops = {n.op for n in report.nodes}
    assert {"aten.add.Tensor", "aten.relu.default", "aten.mul.Tensor"} <= ops  # functionalized in-place
    assert report.phases() == ["fw", "bw"]


def test_channels_last_convolution() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    report = _same_as_eager(model, [x])
    assert any(n.op == "aten.convolution.default" for n in report.nodes)
    assert report.coverage("T4") == 1.0


def test_gradient_accumulation_over_several_micro_batches() -> None:
    report = _same_as_eager(nn.Linear(16, 4), [torch.randn(4, 16) for _ in range(3)], steps=2)
    assert report.phases() == ["fw", "bw"]  # one graph each, reused by every micro-batch


def test_inference_under_no_grad_is_one_forward_graph() -> None:
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU())
    compiled = torch.compile(model, backend=fxcost.estimate(devices=["T4"], measure=False))
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
    assert fxcost.last_report().phases() == ["fw"]
