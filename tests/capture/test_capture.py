"""fxcost.profile and fxcost.cost: programmatic capture that leaves the model as it found it."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import fxcost


def test_cost_returns_fw_and_bw_for_one_device() -> None:
    model, x = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)), torch.randn(16, 32)
    c = fxcost.cost(model, (x,), device="NVIDIA A100-SXM4-80GB")
    assert c.device == "A100-SXM4-80GB"
    assert c.ms == pytest.approx(c.fw_ms + c.bw_ms) and c.fw_ms > 0 and c.bw_ms > 0
    assert float(c) == c.ms
    inference = fxcost.cost(model, x, device="A100-SXM4-80GB", train=False)
    assert inference.bw_ms == 0 and inference.ms == pytest.approx(inference.fw_ms)


def test_cost_grows_with_batch_and_shrinks_with_a_faster_gpu() -> None:
    model = nn.Linear(512, 512)
    small = fxcost.cost(model, torch.randn(64, 512), device="T4")
    large = fxcost.cost(model, torch.randn(4096, 512), device="T4")
    fast = fxcost.cost(model, torch.randn(4096, 512), device="H100-SXM")
    assert small.ms < large.ms
    assert fast.ms < large.ms


def test_repeated_costs_do_not_hit_dynamo_recompile_limit() -> None:
    model, x = nn.Linear(8, 8), torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a recompile-limit warning would fail here
        costs = [fxcost.cost(model, (x,), device="T4").ms for _ in range(12)]
    assert len(set(costs)) == 1


def test_profile_restores_gradients_and_buffers() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model(torch.randn(3, 4)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    stats = model[1].running_mean.clone()
    fxcost.profile(model, torch.randn(3, 4), devices=["T4"], measure=False)
    for p, g in zip(model.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)
    assert torch.equal(model[1].running_mean, stats)


def test_dict_inputs_and_hf_style_loss() -> None:
    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, target: torch.Tensor):
            from types import SimpleNamespace

            out = self.lin(x)
            return SimpleNamespace(logits=out, loss=nn.functional.mse_loss(out, target))

    report = fxcost.profile(WithLoss(), {"x": torch.randn(3, 4), "target": torch.randn(3, 2)},
                            devices=["T4"], measure=False)  # fmt: skip
    assert any(n.op == "aten.mse_loss.default" for n in report.nodes)
    assert any(n.phase == "bw" for n in report.nodes)


def test_bad_inputs_get_clear_errors() -> None:
    with pytest.raises(TypeError, match="example_inputs must be a tensor"):
        fxcost.cost(nn.Linear(2, 2), 3.0, device="T4")
    with pytest.raises(ValueError, match="nothing to backpropagate"):
        fxcost.cost(nn.Linear(2, 2).requires_grad_(False), torch.randn(1, 2), device="T4")
    with pytest.raises(fxcost.gpus.UnknownDeviceError):
        fxcost.cost(nn.Linear(2, 2), torch.randn(1, 2), device="Z9000")


def test_inactive_dropout_launches_nothing_as_in_eager() -> None:
    model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.1), nn.ReLU())
    model.eval()  # AOTAutograd turns the inactive dropout into a clone; eager returns its input
    report = fxcost.profile(model, (torch.randn(4, 32),), devices=["T4"], train=False, measure=False)
    clones = [n for n in report.nodes if n.op == "aten.clone.default"]
    assert clones and not any(n.has_kernel for n in clones)
    assert all(n.pred_ms["T4"] == 0 for n in clones)
    model.train()  # an active dropout draws a mask: real kernels
    report = fxcost.profile(model, (torch.randn(4, 32),), devices=["T4"], measure=False)
    dropout = [n for n in report.nodes if n.module == "1" and n.phase == "fw"]
    assert any(n.has_kernel and n.pred_ms["T4"] > 0 for n in dropout)


def test_models_that_fail_to_trace_do_not_use_up_dynamos_recompile_cap() -> None:
    """Dynamo counts every compile of a code object, failed ones too, and stops at a cap: a search
    loop meeting many broken candidates must still trace the next good one."""
    with torch._dynamo.config.patch(accumulated_recompile_limit=3):
        for width in range(9, 14):  # the input does not fit the layer: the trace fails
            with pytest.raises(Exception, match=r"same reduction dim|cannot be multiplied"):
                fxcost.cost(nn.Linear(8, 8), torch.randn(4, width), device="T4")
        assert fxcost.cost(nn.Linear(8, 8), torch.randn(4, 8), device="T4").ms > 0


def test_an_input_without_elements_is_refused_naming_it_and_its_shape() -> None:
    model = nn.Linear(4, 2)
    with pytest.raises(ValueError, match=r"example_inputs\[0\] has shape \(0, 4\), no elements"):
        fxcost.cost(model, (torch.zeros(0, 4),), device="T4")
    with pytest.raises(ValueError, match=r"example_inputs has shape \(0, 4\)"):
        fxcost.profile(model, torch.zeros(0, 4), devices=["T4"])  # before anything is measured
    with pytest.raises(ValueError, match=r"example_inputs\['mask'\] has shape \(2, 0\)"):
        fxcost.profile(lambda x, mask: model(x), {"x": torch.ones(2, 4), "mask": torch.ones(2, 0)},
                       devices=["T4"], measure=False)  # fmt: skip


def test_the_backend_runs_an_empty_batch_as_eager_does() -> None:
    """Bad input to fxcost's own entry points is an error; a step the user compiles runs regardless."""
    torch._dynamo.reset()
    model = nn.Linear(4, 2)
    x = torch.zeros(0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fxcost may warn that it could not price the step
        out = torch.compile(model, backend=fxcost.estimate(devices=["T4"]))(x)
    assert out.shape == (0, 2) and torch.equal(out, model(x))
