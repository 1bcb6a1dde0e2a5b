"""DeepSeek-V2/V3 decoders: multi-head latent attention, shared experts and dense layers before the
sparse ones, read from their configs, traced a few layers deep and deepened layer kind by layer kind."""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Any

import pytest
import torch

from fxcost.sim import simulate
from fxcost.sim.search import plan
from fxcost.zoo.decoders import Decoder, Latent, decoder

# DeepSeek-V3's released config.json (the keys a plan reads; rope scaling and quantization left out).
V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "vocab_size": 129280, "max_position_embeddings": 163840, "hidden_act": "silu",
    "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}  # fmt: skip
TINY = Decoder("tiny-deepseek", layers=6, hidden=64, heads=4, ffn=32, vocab=256, seq=16, gated=True,
               experts=4, top_k=2, moe_family="deepseek_v3", shared_ffn=32, dense_layers=3, dense_ffn=96,
               latent=Latent(q_rank=32, kv_rank=16, nope=16, rope=8, v=16))  # fmt: skip


def _hf_model(d: Decoder, layers: int) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**d.hf_config(layers, d.seq)))


def test_deepseek_v3s_config_is_read_with_its_latent_attention_shared_expert_and_dense_layers() -> None:
    with pytest.warns(UserWarning, match="its 1 multi-token prediction layer"):
        v3 = decoder(V3)
    assert (v3.experts, v3.top_k, v3.ffn, v3.shared_ffn, v3.dense_layers, v3.dense_ffn, v3.kv_heads) == (
        256, 8, 2048, 2048, 3, 18432, None)  # fmt: skip
    assert v3.latent == Latent(q_rank=1536, kv_rank=512, nope=128, rope=64, v=128)
    # 671B parameters and 37B a token runs, as the technical report gives them (its multi-token module's
    # 14B aside), and exactly the matrices of Hugging Face's model of the same config.
    assert round(v3.params_b) == 671 and round(v3.active_matmul_params / 1e9) == 37
    assert decoder("deepseek-v3") == dataclasses.replace(v3, name="deepseek-v3", seq=4096, tied=None)  # named
    model = _hf_model(v3, v3.layers)
    assert sum(p.numel() for p in model.parameters() if p.dim() >= 2) == v3.params
    traced = v3.hf_config(v3.traced_depth(2), 4096)  # two dense layers (the first apart) and a sparse one
    assert (traced["num_hidden_layers"], traced["first_k_dense_replace"], traced["n_shared_experts"]) == (
        3,
        2,
        1,
    )
    assert traced["intermediate_size"] == 18432 and traced["moe_intermediate_size"] == 2048
    assert v3.layer_sources(2) == (0, 1, 1, *[2] * 58)
    # The attention's FLOPs: scores over 192-wide queries and keys, values 128 wide, per head (PaLM's
    # 12 L h s with h the queries' width where the two are equal).
    assert v3.model_flops(1, 4096) - v3.model_flops(1, 0) == 6 * 61 * 4096 * 128 * (192 + 128)


def test_deepseek_v2_lite_projects_its_queries_without_a_bottleneck() -> None:
    lite = {**V3, "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 32,
            "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8,
            "n_shared_experts": 2, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "intermediate_size": 128, "num_hidden_layers": 4, "first_k_dense_replace": 1, "vocab_size": 512,
            "num_nextn_predict_layers": 0}  # fmt: skip
    d = decoder(lite)
    assert (d.latent.q_rank if d.latent else 0, d.shared_ffn, d.moe_family) == (None, 64, "deepseek_v2")
    model = _hf_model(d, d.layers)
    assert type(model).__name__ == "DeepseekV2ForCausalLM"
    assert sum(p.numel() for p in model.parameters() if p.dim() >= 2) == d.params


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"moe_layer_freq": 2}, r"\(n_routed_experts=256\) with moe_layer_freq=2; accepted: .*DeepSeek-V2"),
        ({"kv_lora_rank": None}, "a DeepSeek config with kv_lora_rank null"),
        ({"first_k_dense_replace": 61}, "dense_layers=61 needs .* fewer dense layers than its 61"),
    ],
)
def test_a_deepseek_config_that_cannot_be_traced_is_refused_naming_the_key(
    change: dict[str, Any], match: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=match):
            decoder({**V3, **change})


def test_a_deepseek_config_omitting_a_key_takes_hugging_faces_default() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bare = decoder({k: v for k, v in V3.items() if k not in ("q_lora_rank", "first_k_dense_replace")})
        assert bare == decoder(V3)  # V3's defaults: a 1,536-wide query bottleneck, three dense layers
        v2 = {**V3, "model_type": "deepseek_v2"}
        two = decoder({k: v for k, v in v2.items() if k not in ("n_shared_experts", "first_k_dense_replace")})
        assert (two.shared_ffn, two.dense_layers) == (2 * 2048, 0)  # V2's: two shared experts, no dense layer
        assert decoder({**V3, "moe_intermediate_size": 3000}).shared_ffn == 3000  # as wide as an expert
    with pytest.raises(ValueError, match="latent attention is traced fused; accepted: 'sdpa'"):
        TINY.hf_config(3, 16, "eager")
    with pytest.raises(ValueError, match="layers must be a whole number >= 1"):
        TINY.traced_depth(0)


def test_latent_attention_and_dense_layers_are_deepseeks_alone() -> None:
    llama = Decoder("l", 2, 64, 4, 32, 256, 16, gated=True)
    with pytest.raises(ValueError, match="latent attention and dense_layers are DeepSeek's"):
        dataclasses.replace(llama, latent=TINY.latent)
    with pytest.raises(ValueError, match="a DeepSeek mixture needs its latent= attention dims"):
        dataclasses.replace(TINY, latent=None, dense_layers=0, dense_ffn=0)
    with pytest.raises(ValueError, match="shared experts are ffn=32 wide each; shared_ffn=48"):
        dataclasses.replace(TINY, shared_ffn=48)


@pytest.mark.parametrize(
    ("strategy", "cluster", "batch"),
    [
        ("dp=2,ep=2,pp=2,mb=4", "4xH100-SXM", 16),
        ("tp=2,sp=1,pp=2,mb=2", "4xH100-SXM", 4),
        ("dp=2,pp=3,mb=2,zero=3,recompute=1", "6xH100-SXM", 8),
        ("tp=2,sp=1,dp=2,ep=2,mb=2", "4xH100-SXM", 8),
    ],
)
def test_a_trace_of_each_layer_kind_stands_for_the_deep_model_exactly(
    strategy: str, cluster: str, batch: int
) -> None:
    # Six layers, the first three dense: traced with two dense layers (the first, whose backward adds
    # no residual gradient, apart) and one sparse layer, then each kind repeated.
    whole = simulate(TINY.hf_config(TINY.layers, TINY.seq), strategy, cluster, batch=batch, seqlen=TINY.seq,
                     precision="bf16")  # fmt: skip
    traced = TINY.hf_config(TINY.traced_depth(2), TINY.seq)
    deepened = simulate(traced, strategy, cluster, batch=batch, seqlen=TINY.seq, precision="bf16",
                        layers=TINY.layer_sources(2))  # fmt: skip
    assert TINY.layer_sources(2) == (0, 1, 1, 2, 2, 2)
    assert deepened.iteration_ms == pytest.approx(whole.iteration_ms, rel=1e-9)
    assert deepened.collectives == whole.collectives
    assert [m.total for m in deepened.memory] == pytest.approx([m.total for m in whole.memory], rel=1e-9)
    # Repeating the last traced layer alone would have made every deep layer sparse.
    as_before = simulate(traced, strategy, cluster, batch=batch, seqlen=TINY.seq, precision="bf16", layers=6)
    assert [m.params for m in as_before.memory] != [m.params for m in whole.memory]


def test_layer_sources_name_traced_layers() -> None:
    from fxcost.sim.deepen import layer_sources

    assert layer_sources(4, 2) == (0, 1, 1, 1) and layer_sources((0, 1, 1, 2), 3) == (0, 1, 1, 2)
    with pytest.raises(ValueError, match=r"layer sources \(0, 3\) must each be the index of one of the 3"):
        layer_sources((0, 3), 3)


def test_the_ring_passes_latent_attentions_keys_and_values_not_its_latents() -> None:
    # Keys 4 heads x (16 + 8) wide, values 4 x 16: a rank sends its half of the tokens' keys and values
    # to the next one at each of the ring's cp - 1 steps, forward (and twice the bytes backward).
    config = TINY.hf_config(TINY.traced_depth(2), TINY.seq)
    r = simulate(config, "dp=1,cp=2", "2xH100-SXM", batch=1, seqlen=TINY.seq, precision="bf16")
    rings = {kind_group_bytes for kind_group_bytes in r.collectives if kind_group_bytes[0] == "send_recv"}
    tokens = TINY.seq // 2
    assert (tokens * (4 * 24 + 4 * 16) * 2,) in {(b,) for _, _, b in rings}


def test_fxcost_plan_ranks_deepseek_plans_and_its_fast_pass_agrees_with_the_simulator(tmp_path: Any) -> None:
    path = tmp_path / "tiny-deepseek.json"
    tiny = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
            "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "intermediate_size": 96, "num_hidden_layers": 6, "vocab_size": 256, "max_position_embeddings": 16,
            "num_nextn_predict_layers": 0}  # fmt: skip  # V3's 8 groups of experts, traced as one
    path.write_text(json.dumps({**V3, **tiny}))
    assert dataclasses.replace(decoder(path), name=TINY.name) == dataclasses.replace(TINY, seq=16, tied=False)
    found = plan(path, "2x2xH100-SXM", 8, 16, exact=3, micro_sizes=(1,))
    simulated = [c for c in found.candidates if c.exact]
    assert simulated and not simulated[0].oom
    assert found.max_gap < 0.05


def test_expert_tensor_parallelism_leaves_the_dense_layers_as_tensor_parallelism_runs_them() -> None:
    # Under tp=2 with ep=2 a dense layer's MLP is a tensor-parallel block as under tp=2 alone (an
    # all-gather and a reduce-scatter around it, its SwiGLU split): only the sparse layer's experts run
    # between all-to-alls. Matching the MoE blocks by their path with the index wildcarded had made the
    # dense layers' MLPs (``model.layers.#.mlp``) blocks too.
    from fxcost.capture import default_loss
    from fxcost.estimator import default_estimator
    from fxcost.gpus import get_device
    from fxcost.sim import Strategy
    from fxcost.sim.plan import compile_plan
    from fxcost.sim.simulator import _traced

    config = TINY.hf_config(TINY.traced_depth(2), TINY.seq)

    def dense_layers(strategy: str) -> list[tuple[str, list[tuple[str, float]]]]:
        s = Strategy.parse(strategy)
        captured, params, _ = _traced(config, None, 8, TINY.seq, None, default_loss, s, default_estimator())
        p = compile_plan(captured, params, s, get_device("H100-SXM"), 8, "bf16")
        segments = p.stages[0].forward + p.stages[0].backward
        return [(seg.layer, [(c.kind, c.nbytes) for c in seg.inside]) for seg in segments
                if seg.layer in ("model.layers.0", "model.layers.1")]  # fmt: skip

    assert dense_layers("tp=2,sp=1,dp=2,ep=2,mb=2") == dense_layers("tp=2,sp=1,dp=2,mb=2")


def test_a_qwen2_moe_shared_expert_of_no_width_keeps_its_gate() -> None:
    # Hugging Face builds Qwen2-MoE's shared-expert gate (one column a layer) whatever the expert's width.
    qwen2 = Decoder("q", 2, 64, 4, 32, 256, 16, gated=True, kv_heads=2, experts=4, top_k=2,
                    moe_family="qwen2_moe", shared_ffn=0)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zero-element tensors
        model = _hf_model(qwen2, qwen2.layers)
    assert sum(p.numel() for p in model.parameters() if p.dim() >= 2) == qwen2.params
