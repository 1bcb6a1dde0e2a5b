"""Hugging Face models built from a config (no download), when transformers is installed."""

from __future__ import annotations

import pytest
import torch

import fxcost

transformers = pytest.importorskip("transformers")


def test_gpt2_two_layers_captures_and_reports() -> None:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    config._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # keeps the loss inside the captured graph
    tokens = torch.randint(0, 128, (2, 16))
    backend = fxcost.estimate(devices=["H100-SXM", "T4"], budget_ms=0.2)
    compiled = torch.compile(model, backend=backend)
    out = compiled(input_ids=tokens, labels=tokens)
    out.loss.backward()
    report = fxcost.last_report()
    assert not backend.failures
    assert set(report.phases()) == {"fw", "bw"}
    mms = [n for n in report.nodes if n.op in ("aten.addmm.default", "aten.mm.default")]
    assert len(mms) >= 2 * 4 * 2  # 4 linear layers per block, fw and bw
    assert any(n.module.startswith("transformer.h.1") for n in report.nodes)
    assert report.total_ms("T4") > report.total_ms("H100-SXM") > 0
    assert all(n.origin_ms is not None for n in report.nodes)
