"""Activations saved for backward in a compiled training step (fxcost.lowering.fusion_saved): the
forward writes what the backward cannot recompute, the backward recomputes the rest from it."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import fxcost
from fxcost.lowering.fusion import FusedKernel

BF16 = torch.bfloat16


class _Gelu(nn.Module):
    """GPT-2's tanh GELU written out, in fp32 from a bf16 input (as autocast runs it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return 0.5 * x * (1.0 + torch.tanh(0.79788 * (x + 0.044715 * torch.pow(x, 3.0))))


class _Down(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(256, 64, dtype=BF16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.to(BF16))  # autocast's cast for the GEMM


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(64, 256, dtype=BF16), _Gelu(), _Down()
        self.drop, self.norm = nn.Dropout(0.1), nn.BatchNorm1d(64, dtype=BF16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.drop(self.down(self.act(self.up(x)))))


@pytest.fixture(scope="module")
def step() -> fxcost.Report:
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fxcost.profile(_Mlp(), (torch.randn(32, 64, dtype=BF16),), devices=["A100-PCIE-40GB"],
                              measure=False, train=True)  # fmt: skip


def _with(report: fxcost.Report, op: str, phase: str) -> FusedKernel:
    return next(k for k in report.fused_kernels() if report.nodes[k.members[0]].phase == phase
                and any(report.nodes[i].op == op for i in k.members))  # fmt: skip


def test_the_forward_writes_no_intermediate_the_backward_recomputes(step) -> None:
    gelu = _with(step, "aten.tanh.default", "fw")
    # It reads the bf16 GEMM output and writes its bf16 cast, not the fp32 tanh eager saves.
    assert gelu.bytes_read(step.nodes) == gelu.bytes_written(step.nodes) == 32 * 256 * 2


def test_the_backward_recomputes_from_what_the_forward_wrote(step) -> None:
    gelu = _with(step, "aten.tanh_backward.default", "bw")
    assert gelu.recomputes
    # The gradient and the GEMM output it recomputes the GELU from (bf16), not the fp32 intermediates.
    assert gelu.bytes_read(step.nodes) == 2 * 32 * 256 * 2


def test_random_results_and_returned_results_are_written(step) -> None:
    dropout = _with(step, "aten.native_dropout.default", "fw")
    ops = [step.nodes[i].op for i in dropout.members]
    member = ops.index("aten.native_dropout.default")
    assert dropout.writes[member] == (True, True)  # the output and the mask the backward reads
    # The batch norm's step counter (a buffer's new value, returned) is still computed and written.
    counters = [i for i, n in enumerate(step.nodes) if n.phase == "fw" and n.op == "aten.add.Tensor"
                and n.out_dtypes == ["int64"]]  # fmt: skip
    kernels = [k for k in step.fused_kernels() if set(k.members) & set(counters)]
    assert counters and all(k.bytes_written(step.nodes) > 0 for k in kernels)


def test_a_forward_only_step_is_left_as_it_is() -> None:
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fxcost.profile(_Mlp().eval(), (torch.randn(32, 64, dtype=BF16),),
                                devices=["A100-PCIE-40GB"], measure=False, train=False)  # fmt: skip
    assert all(not k.recomputes for k in report.fused_kernels())
