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


def test_hf_step_captures_a_training_step_on_meta_tensors() -> None:
    from fxcost.zoo.hf import hf_step

    # GPT-2 large's width at two layers: on the meta device nothing is allocated.
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_embd": 1280,
              "n_head": 20, "vocab_size": 50257, "n_positions": 1024}  # fmt: skip
    step = hf_step(config, batch=2, seqlen=256)
    assert step.inputs["input_ids"].device.type == "meta"
    report = fxcost.profile(step.model, step.inputs, devices=["V100-PCIE-32GB"], train=step.train,
                            measure=False, loss_fn=step.loss_fn)  # fmt: skip
    assert report.phases() == ["fw", "bw"]
    fw, bw = report.total_ms("V100-PCIE-32GB", "fw"), report.total_ms("V100-PCIE-32GB", "bw")
    assert 1.5 < bw / fw < 3  # the backward graph holds the gradient GEMMs (it is empty if the loss is cut)
    lm_head = [n for n in report.nodes if n.phase == "fw" and n.op == "aten.mm.default" and n.flops]
    assert max(n.flops for n in lm_head) == 2 * 2 * 256 * 1280 * 50257
    assert report.coverage("V100-PCIE-32GB") == 1.0


def test_a_config_asking_for_sdpa_runs_the_fused_kernel_on_meta_tensors() -> None:
    """PyTorch picks SDPA's math path for meta tensors; a config naming ``sdpa`` gets the fused op, forward
    and backward, with the causal mask's half of the work, and no score matrix among the nodes."""
    from fxcost.zoo.hf import hf_step

    base = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_embd": 64,
            "n_head": 4, "vocab_size": 128, "n_positions": 64}  # fmt: skip
    ops = {}
    for attention in ("eager", "sdpa"):
        step = hf_step({**base, "attn_implementation": attention}, batch=2, seqlen=64)
        report = fxcost.profile(step.model, step.inputs, devices=["H100-SXM"], train=step.train,
                                measure=False, loss_fn=step.loss_fn)  # fmt: skip
        ops[attention] = {n.op for n in report.nodes}
    fused = {"aten._scaled_dot_product_flash_attention_for_cpu.default",
             "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"}  # fmt: skip
    assert fused <= ops["sdpa"] and not fused & ops["eager"]
    assert not any("softmax.default" in op and "log" not in op for op in ops["sdpa"])
    with pytest.raises(ValueError, match="unknown attn_implementation 'flex'"):
        hf_step({**base, "attn_implementation": "flex"}, batch=1, seqlen=8)


def test_hf_step_rejects_bad_configs() -> None:
    from fxcost.zoo.hf import hf_step

    with pytest.raises(ValueError, match="needs 'model_type' and 'architectures'"):
        hf_step({"n_layer": 2}, batch=1, seqlen=8)
    with pytest.raises(ValueError, match="no model class 'NoSuchModel'"):
        hf_step({"architectures": ["NoSuchModel"], "model_type": "gpt2"}, batch=1, seqlen=8)
    with pytest.raises(ValueError, match="batch and seqlen must be positive"):
        hf_step({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, batch=0, seqlen=8)


def test_profile_command_takes_a_hugging_face_config(tmp_path, capsys) -> None:
    import json

    from fxcost.cli import main

    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_embd": 256,
              "n_head": 4, "vocab_size": 1000, "n_positions": 256}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "trace.json.gz"
    argv = ["profile", str(path), "--batch", "2", "--seqlen", "128", "--devices", "T4", "--top", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "nothing timed" in printed and "eager step" in printed
    report = fxcost.Report.load(out)
    assert report.phases() == ["fw", "bw"] and report.total_ms("T4") > 0


def test_hf_step_builds_each_config_once() -> None:
    from fxcost.zoo.hf import hf_step

    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 1, "n_embd": 64,
              "n_head": 2, "vocab_size": 128, "n_positions": 64}  # fmt: skip
    a, b = hf_step(config, batch=2, seqlen=16), hf_step(dict(reversed(config.items())), batch=4, seqlen=8)
    assert a.model is b.model  # equal configs, in any key order
    assert b.inputs["input_ids"].shape == (4, 8)
    assert hf_step(config, 2, 16, train=False).model is not a.model
    assert not hf_step(config, 2, 16, train=False).model.training and a.model.training
    assert hf_step(config | {"n_layer": 2}, 2, 16).model is not a.model
