"""The wider zoo's hand-written models, and the coverage benchmark that runs them through the backend."""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch

import fxcost
from fxcost.zoo import vision


@pytest.mark.parametrize("name", list(vision.MODELS))
def test_each_model_trains_one_step_reproducibly(name: str) -> None:
    (model, inputs), (again, same_inputs) = vision.build(name), vision.build(name)
    assert all(torch.equal(a, b) for a, b in zip(inputs, same_inputs, strict=True))
    weights = zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in weights)
    loss = model(*inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_unknown_model_and_bad_batch_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg'; models: mobilenet_v3"):
        vision.build("vgg")
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        vision.build("unet", batch=0)


def _step(model: torch.nn.Module, inputs: tuple, backend: object) -> list[torch.Tensor]:
    torch._dynamo.reset()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        loss = torch.compile(model, backend=backend)(*inputs)
        loss.backward()
    return [loss.detach(), *(p.grad for p in model.parameters()), *model.buffers()]


@pytest.mark.parametrize("name", [pytest.param("detector", marks=pytest.mark.slow), "embedding_bag"])
def test_backend_results_are_bit_identical_to_aot_eager(name: str) -> None:
    model, inputs = vision.build(name)
    reference = _step(copy.deepcopy(model), inputs, "aot_eager")
    backend = fxcost.estimate(devices=["H100-SXM"], budget_ms=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = _step(copy.deepcopy(model), inputs, backend)
    assert not backend.failures
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    fallback = [n.op for n in backend.report().nodes if n.has_kernel and n.pred_source["H100-SXM"] != "mlp"]
    assert fallback == []


def test_coverage_benchmark_reports_fallbacks_and_changed_models(load_script, capsys) -> None:
    coverage = load_script("benchmarks/coverage.py")
    assert coverage.main(["--only", "embedding_bag"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    figures = dict(re.findall(r"(\w+)=([\d.]+)", last))
    assert figures["models"] == "1" and figures["failed_models"] == "0"
    assert float(figures["fallback_node_pct"]) == 0.0 and figures["changed_models"] == "0"
