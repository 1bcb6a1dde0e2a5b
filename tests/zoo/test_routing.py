"""Mixture-of-experts layers that route through ``nonzero()`` (Switch Transformers) captured on meta
tensors under a stated routing: each expert's GEMMs at the rows the routing gives it."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fxcost
from fxcost.lowering import is_matmul_class
from fxcost.report import Report
from fxcost.report.header import header_lines
from fxcost.zoo.routing import Routing

transformers = pytest.importorskip("transformers")
from fxcost.zoo.hf import hf_step  # noqa: E402  (needs transformers)

WIDTH, FFN, EXPERTS, BATCH, SEQ = 32, 48, 4, 2, 16
# One encoder and one decoder block, each with a Switch MoE feed-forward (top-1).
SWITCH = dict(model_type="switch_transformers", architectures=["SwitchTransformersForConditionalGeneration"],
              d_model=WIDTH, d_ff=FFN, d_kv=8, num_heads=4, num_layers=1, num_decoder_layers=1,
              num_experts=EXPERTS, expert_capacity=64, vocab_size=64, encoder_sparse_step=1,
              decoder_sparse_step=1, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1)  # fmt: skip
MOE = "encoder.block.0.layer.1.mlp"  # the encoder's MoE layer


def _capture(config: dict[str, Any], train: bool, load: tuple[float, ...] | None = None) -> Report:
    step = hf_step(config, BATCH, SEQ, train=train, expert_load=load)
    report = fxcost.profile(step.model, step.inputs, devices=["A100-SXM4-40GB"], train=train, measure=False,
                            loss_fn=step.loss_fn)  # fmt: skip
    report.routing = step.routing
    return report


def _expert_rows(report: Report) -> list[int]:
    """Rows of each expert's first forward GEMM (``wi``: rows x width times width x ffn) in the MoE layer."""
    rows = []
    for e in range(EXPERTS):
        (gemm,) = [n for n in report.nodes if n.phase == "fw" and n.module == f"{MOE}.experts.expert_{e}.wi"
                   and n.op == "aten.mm.default"]  # fmt: skip
        assert gemm.in_shapes[1] == (WIDTH, FFN)
        rows.append(gemm.in_shapes[0][0])
    return rows


def _moe_flops(report: Report, phase: str, within: str = MOE) -> int:
    """GEMM FLOPs of the MoE layer, or of a part ``within`` it (elementwise ops' few FLOPs left out)."""
    return sum(n.flops or 0 for n in report.nodes
               if n.phase == phase and n.module.startswith(within) and is_matmul_class(n.op))  # fmt: skip


@pytest.fixture(scope="module")
def balanced() -> Report:
    return _capture(SWITCH, train=True)


def test_routing_splits_the_routed_rows_in_whole_rows_and_cuts_them_at_capacity() -> None:
    assert Routing().rows(tokens=16, experts=4, top_k=1) == [4, 4, 4, 4]
    assert Routing().rows(tokens=10, experts=4, top_k=2) == [5, 5, 5, 5]
    assert Routing().rows(tokens=6, experts=4, top_k=1) == [2, 2, 1, 1]  # the remainders to the first
    assert Routing((0.5, 0.25, 0.25, 0.0)).rows(tokens=16, experts=4, top_k=1) == [8, 4, 4, 0]
    # 11.2, 1.6, 1.6, 1.6 rows: the two largest remainders (ties: the first) round up; then capacity 5.
    assert Routing((0.7, 0.1, 0.1, 0.1)).rows(tokens=16, experts=4, top_k=1, capacity=5) == [5, 2, 2, 1]
    with pytest.raises(ValueError, match="expert_load has 2 fractions; the layer has 4 experts"):
        Routing((0.5, 0.5)).rows(tokens=16, experts=4, top_k=1)
    with pytest.raises(ValueError, match="summing to 1"):
        Routing((0.5, 0.6))
    with pytest.raises(ValueError, match="non-negative fractions"):
        Routing((1.5, -0.5))


def test_switch_captures_on_meta_tensors_with_balanced_expert_rows(balanced: Report) -> None:
    assert balanced.phases() == ["fw", "bw"]
    assert _expert_rows(balanced) == [BATCH * SEQ // EXPERTS] * EXPERTS  # top-1: tokens / experts each
    tokens = BATCH * SEQ
    # The router's GEMM (tokens x width x experts) and each expert's two GEMMs at its rows.
    assert _moe_flops(balanced, "fw") == 2 * tokens * WIDTH * EXPERTS + 2 * 2 * tokens * WIDTH * FFN
    # Backward: the gradients of the input and the weight of each expert GEMM, twice the forward.
    experts = f"{MOE}.experts."
    assert (
        _moe_flops(balanced, "bw", experts)
        == 2 * _moe_flops(balanced, "fw", experts)
        == 2 * 2 * 2 * tokens * WIDTH * FFN
    )
    assert "balanced" in balanced.routing and "top-1, capacity 64 per sequence" in balanced.routing
    assert all(n.pred_ms.get("A100-SXM4-40GB") for n in balanced.nodes
               if n.module.startswith(experts) and is_matmul_class(n.op))  # fmt: skip


def test_switch_experts_run_a_given_load_cut_at_the_expert_capacity() -> None:
    load = (0.5, 0.25, 0.125, 0.125)
    report = _capture(SWITCH, train=False, load=load)
    assert _expert_rows(report) == [BATCH * round(SEQ * f) for f in load]  # per sequence: 8, 4, 2, 2
    assert "expert load 0.5/0.25/0.125/0.125" in report.routing
    # A capacity of 3 tokens per expert per sequence drops the rest, as Switch's router mask does.
    capped = _capture(SWITCH | {"expert_capacity": 3}, train=False)
    assert _expert_rows(capped) == [BATCH * 3] * EXPERTS
    tokens = BATCH * SEQ
    assert (
        _moe_flops(capped, "fw") == 2 * tokens * WIDTH * EXPERTS + 2 * 2 * (BATCH * 3 * EXPERTS) * WIDTH * FFN
    )


def test_the_routing_is_said_in_the_header_and_kept_in_the_trace(balanced: Report, tmp_path) -> None:
    assert any(line.startswith("mixture-of-experts routing assumed") and balanced.routing in line
               for line in header_lines(balanced))  # fmt: skip
    assert Report.load(balanced.save(tmp_path / "switch.json.gz")).routing == balanced.routing
    assert not any("routing" in line for line in header_lines(Report()))


def test_profile_command_says_the_routing_of_a_switch_config(tmp_path, capsys) -> None:
    from fxcost.cli import main

    path = tmp_path / "switch.json"
    path.write_text(json.dumps(SWITCH))
    assert main(["profile", str(path), "--batch", "1", "--seqlen", "8", "--devices", "T4", "--top", "1"]) == 0
    assert "mixture-of-experts routing assumed" in capsys.readouterr().out


def test_expert_load_needs_a_layer_that_takes_it_and_one_fraction_per_expert() -> None:
    with pytest.raises(ValueError, match="expert_load has 3 fractions; the layer has 4 experts"):
        hf_step(SWITCH, BATCH, SEQ, expert_load=(0.5, 0.25, 0.25))
    mixtral = dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=32,
                   intermediate_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                   num_local_experts=4, num_experts_per_tok=2, vocab_size=64)  # fmt: skip
    with pytest.raises(ValueError, match=r"MixtralForCausalLM has none.*Strategy\(expert_load"):
        hf_step(mixtral, BATCH, SEQ, expert_load=(0.25,) * 4)
    assert "grouped GEMMs" in hf_step(mixtral, BATCH, SEQ).routing  # balanced, said all the same
    gpt2 = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_layer": 1,
        "n_embd": 32,
        "n_head": 2,
    }
    assert hf_step(gpt2, BATCH, SEQ).routing == ""


def test_a_switch_built_outside_fxcost_keeps_its_own_forward() -> None:
    hf_step(SWITCH, BATCH, SEQ)
    settings = {k: v for k, v in SWITCH.items() if k not in ("model_type", "architectures")}
    own = transformers.SwitchTransformersForConditionalGeneration(
        transformers.SwitchTransformersConfig(**settings)
    )
    layers = [m for m in own.modules() if type(m).__name__ == "SwitchTransformersSparseMLP"]
    assert layers and all(type(m) is transformers.SwitchTransformersSparseMLP for m in layers)  # real routing
