"""``fxcost.plan``: the search space, its ranking under memory, the exact pass, the CSV and bad input."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest

import fxcost
from fxcost.cli import main
from fxcost.cli.status import BAD_INPUT, INTERRUPTED
from fxcost.gpus import get_device
from fxcost.sim import Cluster, SimResult, Strategy, simulate
from fxcost.sim.ranked import PlanSearch
from fxcost.sim.search import CP_MIN_TOKENS, Space, candidates, plan
from fxcost.zoo.decoders import Decoder, decoder

TINY = Decoder("tiny", layers=4, hidden=64, heads=4, ffn=128, vocab=256, seq=32)
BATCH, SEQ, MICRO = 8, 32, (1, 2)
TRACED_AT = (2,)  # one capture (each micro-batch size is traced once, seconds each)
CLUSTER = "2x2xA100-SXM4-40GB"


@pytest.fixture(scope="module")
def search() -> PlanSearch:
    return plan(TINY, CLUSTER, BATCH, SEQ, precision="bf16", exact=3, micro_sizes=TRACED_AT)


def test_every_candidate_is_valid_and_the_invalid_are_counted() -> None:
    space = Space(TINY, gpus=8, gpus_per_node=4, batch=BATCH, micro_sizes=MICRO)
    valid, skipped = candidates(space)
    for c in valid:
        assert c["dp"] * c["tp"] * c["pp"] == 8
        assert TINY.heads % c["tp"] == 0 and c["pp"] <= TINY.layers
        assert BATCH % (c["dp"] * c["micro_batch"]) == 0
        assert not (c["sp"] and c["tp"] == 1) and not (c["zero"] and c["dp"] == 1)
        micro_batches = BATCH // (c["dp"] * c["micro_batch"])
        assert c["vpp"] == 1 or (c["pp"] > 1 and micro_batches % c["pp"] == 0)
    # tp 1,2,4 x pp 1..8 x 2 micro sizes x 4 ZeRO stages x 4 recompute policies x sp x vpp
    assert len(valid) + sum(skipped.values()) == 3 * 4 * 2 * 4 * 4 * 2 * 2
    assert any(c["vpp"] == 2 for c in valid)
    assert skipped["pp exceeds the layers"] > 0 and skipped["the batch does not split"] > 0
    assert len({tuple(sorted(c.items())) for c in valid}) == len(valid)


def test_context_parallel_rings_split_long_sequences_only() -> None:
    """cp takes powers of two that leave each rank CP_MIN_TOKENS or more and split the sequence into
    2 cp chunks (Megatron's causal balancing); it splits the GPUs with tp, pp and dp."""
    long = Space(TINY, gpus=8, gpus_per_node=4, batch=BATCH, micro_sizes=MICRO, seq=4 * CP_MIN_TOKENS)
    rings, _ = candidates(long)
    assert {c["cp"] for c in rings} == {1, 2, 4}
    assert all(c["dp"] * c["tp"] * c["pp"] * c["cp"] == 8 for c in rings)
    # ZeRO shards over the dp x cp ranks: a context-parallel ring alone may run it
    assert any(c["zero"] and c["dp"] == 1 and c["cp"] > 1 for c in rings)
    short = Space(TINY, gpus=8, gpus_per_node=4, batch=BATCH, micro_sizes=MICRO, seq=2 * CP_MIN_TOKENS + 2)
    valid, skipped = candidates(short)
    assert {c["cp"] for c in valid} == {1} and skipped["2 x cp does not divide the sequence"] > 0
    assert {c["cp"] for c in candidates(Space(TINY, 8, 4, BATCH, MICRO))[0]} == {1}  # the model's 32 tokens
    odd, _ = candidates(Space(TINY, 8, 4, BATCH, MICRO, seq=31))  # cp=1 takes any sequence
    assert odd and {c["cp"] for c in odd} == {1}


@pytest.mark.slow
def test_a_context_parallel_plan_is_estimated_as_simulated() -> None:
    """Over a sequence long enough for cp=2, the analytic pass gives a cp plan the simulator's memory
    (exactly) and its iteration (closely), and the exact pass simulates what ``fxcost.simulate`` does."""
    seq = 2 * CP_MIN_TOKENS
    found = plan(TINY, CLUSTER, 4, seq, precision="bf16", exact=2, micro_sizes=(1,))
    rings = [c for c in found.candidates if c.strategy.cp == 2]
    assert rings and {c.strategy.cp for c in found.candidates} == {1, 2}
    for c in rings[:: max(len(rings) // 4, 1)] + [c for c in rings if c.exact]:
        result = simulate(TINY.hf_config(2, seq), c.strategy, CLUSTER, batch=4, seqlen=seq, precision="bf16",
                          layers=TINY.layers)  # fmt: skip
        assert c.memory_gib * 2**30 == pytest.approx(max(m.total for m in result.memory), rel=1e-9)
        assert c.analytic_ms == pytest.approx(result.iteration_ms, rel=0.15), c.strategy
        if c.exact:
            assert c.iteration_ms == result.iteration_ms


MOE = dataclasses.replace(TINY, name="tiny-moe", gated=True, kv_heads=2, experts=4, top_k=2)


def test_expert_parallel_degrees_divide_the_experts_and_dp() -> None:
    space = Space(MOE, gpus=8, gpus_per_node=4, batch=BATCH, micro_sizes=MICRO)
    valid, skipped = candidates(space)
    assert {c["ep"] for c in valid} == {1, 2, 4}
    assert all(c["dp"] % c["ep"] == 0 and (c["ep"] == 1 or c["tp"] == 1 or c["sp"]) for c in valid)
    assert any(c["ep"] > 1 and c["tp"] > 1 for c in valid)  # experts split over tp too, with sp
    assert skipped["ep does not divide dp"] > 0 and skipped["ep with tp without sp"] > 0
    assert {c["ep"] for c in candidates(Space(TINY, 8, 4, BATCH, MICRO))[0]} == {1}  # a dense model


@pytest.mark.slow
def test_an_expert_parallel_plan_is_estimated_as_simulated() -> None:
    """A Mixtral-style decoder's ep plans: the analytic pass has the simulator's memory (exactly) and
    iteration (closely), and the exact pass is what ``fxcost.simulate`` says."""
    found = plan(MOE, CLUSTER, BATCH, SEQ, precision="bf16", exact=3, micro_sizes=TRACED_AT)
    experts = [c for c in found.candidates if c.strategy.ep > 1]
    assert experts and {c.strategy.ep for c in experts} == {2, 4}
    split = [c for c in experts if c.strategy.tp > 1]  # expert tensor parallelism
    assert split
    for c in (
        experts[:: max(len(experts) // 4, 1)]
        + split[:: max(len(split) // 2, 1)]
        + [c for c in experts if c.exact]
    ):
        result = simulate(MOE.hf_config(2, SEQ), c.strategy, CLUSTER, batch=BATCH, seqlen=SEQ,
                          precision="bf16", layers=MOE.layers)  # fmt: skip
        assert c.memory_gib * 2**30 == pytest.approx(max(m.total for m in result.memory), rel=1e-9)
        assert c.analytic_ms == pytest.approx(result.iteration_ms, rel=0.05), c.strategy
        if c.exact:
            assert c.iteration_ms == result.iteration_ms


def _simulated(strategy: Strategy) -> SimResult:
    """``fxcost.simulate`` of the tiny decoder under ``strategy``, as the search's exact pass runs it."""
    return simulate(TINY.hf_config(2, SEQ), strategy, CLUSTER, batch=BATCH, seqlen=SEQ, precision="bf16",
                    layers=TINY.layers)  # fmt: skip


def test_the_best_plan_is_what_simulate_says(search: PlanSearch) -> None:
    best = search.best
    assert best.exact and not best.oom
    result = _simulated(best.strategy)
    assert best.iteration_ms == result.iteration_ms
    assert best.memory_gib * 2**30 == pytest.approx(max(m.total for m in result.memory), rel=1e-12)
    assert best.tokens_per_s == pytest.approx(BATCH * SEQ / result.iteration_ms * 1000)
    peak = get_device("A100-SXM4-40GB").bf16_tflops * 1e12 * 4
    assert best.mfu_pct == pytest.approx(
        TINY.model_flops(BATCH * SEQ, SEQ) / (result.iteration_ms / 1000) / peak * 100
    )


def test_analytic_memory_is_the_simulated_memory(search: PlanSearch) -> None:
    simulated = [c for c in search.candidates if c.exact]
    assert len(simulated) == 3
    assert 0 < search.max_gap < 0.5  # the analytic pass is close to, not equal to, the event simulation
    for c in search.candidates[:: max(len(search.candidates) // 6, 1)]:
        result = _simulated(c.strategy)
        assert c.memory_gib * 2**30 == pytest.approx(max(m.total for m in result.memory), rel=1e-9), (
            c.strategy
        )


def test_an_oom_plan_is_never_ranked_above_a_fitting_one(search: PlanSearch) -> None:
    memory = sorted(c.memory_gib for c in search.candidates)
    small = dataclasses.replace(get_device("A100-SXM4-40GB"), memory_gb=memory[len(memory) // 2])
    tight = Cluster.parse(CLUSTER)
    tight = dataclasses.replace(tight, device=small)
    result = plan(TINY, tight, BATCH, SEQ, precision="bf16", exact=3, micro_sizes=TRACED_AT)
    verdicts = [c.oom for c in result.candidates]
    assert any(verdicts) and not all(verdicts)
    assert verdicts == sorted(verdicts)  # every fitting plan first
    assert all(c.memory_gib <= small.memory_gb for c in result.candidates if not c.oom)
    assert not any(c.exact for c in result.candidates if c.oom)


def test_the_csv_has_every_candidate(search: PlanSearch, tmp_path: Path) -> None:
    path = search.to_csv(tmp_path / "plans.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(search.candidates)
    assert [int(r["rank"]) for r in rows] == list(range(1, len(rows) + 1))
    assert {r["strategy"] for r in rows} == {str(c.strategy) for c in search.candidates}
    for r in rows:  # each searched dimension has its column
        s = Strategy.parse(r["strategy"])
        assert [int(r[k]) for k in ("dp", "tp", "pp", "zero", "sp", "vpp", "cp", "ep")] == [
            s.dp, s.tp, s.pp, s.zero, int(s.sp), s.vpp, s.cp, s.ep
        ]  # fmt: skip
    assert "OUT OF MEMORY" not in search.table(3).splitlines()[2]


def test_model_flops_by_hand() -> None:
    # PaLM's 6N + 12 L h s per token; N: 4 layers of 4h^2 + 2hf, and the output layer's vocab x h
    n = 4 * (4 * 64 * 64 + 2 * 64 * 128) + 256 * 64
    assert TINY.model_flops(100, 32) == 100 * (6 * n + 12 * 4 * 64 * 32)
    assert TINY.params == n + 32 * 64  # and learned positions; the embedding is the tied output layer
    # Llama 3 8B: queries and output 2h^2, keys and values 2 h x 8 heads x 128, SwiGLU 3hf; an output
    # layer and an input embedding of its own (8.03B, as Meta gives it).
    llama = decoder("llama-8b")
    n = 32 * (2 * 4096**2 + 2 * 4096 * 8 * 128 + 3 * 4096 * 14336) + 128256 * 4096
    assert (llama.matmul_params, llama.params) == (n, n + 128256 * 4096)
    assert round(llama.params_b, 2) == 8.03
    # Mixtral 8x7B: 8 experts of 3hf and a router of h x 8 per layer, two of them run per token (46.7B
    # parameters, 12.9B active with the embedding, as Jiang et al. give them).
    mixtral = decoder("mixtral-8x7b")
    attention, expert = 2 * 4096**2 + 2 * 4096 * 8 * 128, 3 * 4096 * 14336
    assert mixtral.matmul_params == 32 * (attention + 8 * expert + 4096 * 8) + 32000 * 4096
    assert mixtral.active_matmul_params == 32 * (attention + 2 * expert + 4096 * 8) + 32000 * 4096
    assert mixtral.model_flops(10, 4096) == 10 * (6 * mixtral.active_matmul_params + 12 * 32 * 4096 * 4096)
    assert (round(mixtral.params_b, 1), round((mixtral.active_matmul_params + 32000 * 4096) / 1e9, 1)) == (
        46.7,
        12.9,
    )


@pytest.mark.parametrize(
    ("gated", "tied", "experts", "family", "head_dim"),
    [(False, None, 1, "", None), (True, None, 1, "LlamaForCausalLM", None), (True, True, 1, "", 32),
     (True, None, 4, "MixtralForCausalLM", None), (True, None, 4, "Qwen3MoeForCausalLM", 32),
     (True, None, 4, "OlmoeForCausalLM", None), (True, None, 4, "Qwen2MoeForCausalLM", None)],
)  # fmt: skip
def test_the_traced_model_has_the_parameters_the_decoder_counts(
    gated: bool, tied: bool | None, experts: int, family: str, head_dim: int | None
) -> None:
    # Each family's matrices as the Decoder counts them (GPT: tied output layer and learned positions;
    # Llama: grouped-query keys and values, an output layer of its own unless tied, as Llama 3.2 1B's,
    # heads wider than hidden / heads where the config says; Mixtral, Qwen3-MoE, OLMoE: their experts
    # and router; Qwen2-MoE also its shared expert and that expert's gate); biases and norms left out.
    from fxcost.zoo.decoders import MOE_FAMILIES
    from fxcost.zoo.hf import hf_step

    moe = next((k for k, v in MOE_FAMILIES.items() if v.architecture == family), "mixtral")
    d = dataclasses.replace(TINY, gated=gated, kv_heads=2 if gated else None, tied=tied, experts=experts,
                            top_k=min(experts, 2), head_dim=head_dim, moe_family=moe,
                            shared_ffn=96 if moe == "qwen2_moe" else 0)  # fmt: skip
    model = hf_step(d.hf_config(d.layers, d.seq), batch=1, seqlen=d.seq).model
    assert type(model).__name__ == (family or type(model).__name__)
    # parameters() counts a tie once; Mixtral's experts may be one 3-D tensor per layer
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    assert matrices == d.params
    plan_of = plan(d, CLUSTER, BATCH, SEQ, precision="bf16", exact=1, micro_sizes=(1,))
    assert plan_of.candidates and not plan_of.candidates[0].oom


def test_a_hugging_face_config_becomes_a_decoder(tmp_path: Path) -> None:
    config = {
        "model_type": "llama",
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "intermediate_size": 28672,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "hidden_act": "silu",
        "num_key_value_heads": 8,
    }
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(config))
    d = decoder(path)
    assert d == dataclasses.replace(decoder("llama-70b"), name="config")
    llama = d.hf_config(2, 4096)  # traced as Llama: SwiGLU, grouped-query heads, its own output layer
    assert (llama["model_type"], llama["intermediate_size"], llama["num_key_value_heads"]) == (
        "llama",
        28672,
        8,
    )
    assert not llama["tie_word_embeddings"] and llama["num_hidden_layers"] == 2
    with pytest.warns(UserWarning, match="its 8 key/value heads are traced as full attention"):
        gpt = decoder({**config, "hidden_act": "gelu"})  # a GELU MLP: GPT-2 blocks, every head's keys
    assert gpt.hf_config(2, 4096)["model_type"] == "gpt2" and gpt.kv_heads is None
    assert decoder({**config, "tie_word_embeddings": True}).params == decoder(path).params - 128256 * 8192
    with pytest.raises(ValueError, match="no heads"):
        decoder({k: v for k, v in config.items() if k != "num_attention_heads"})
    # Mixtral's experts are read (top 2 unless it says); other mixtures are refused by name, not planned
    # as the dense model of one expert.
    mixtral = decoder({**config, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 1})
    assert (mixtral.experts, mixtral.top_k) == (8, 1)
    assert mixtral.hf_config(2, 4096)["model_type"] == "mixtral"
    assert decoder({**config, "num_local_experts": 8}).top_k == 2
    with pytest.raises(
        ValueError,
        match=r"mixture-of-experts config \(num_experts=60\) with model_type='llama'; accepted: dense",
    ):
        decoder({**config, "num_experts": 60, "moe_intermediate_size": 1408})
    with pytest.raises(ValueError, match=r"\(moe_num_experts=16\) with model_type='llama'"):  # DBRX's, nested
        decoder({**config, "ffn_config": {"moe_num_experts": 16, "moe_top_k": 4}})
    with pytest.raises(ValueError, match="experts=8 needs a gated decoder"), pytest.warns(UserWarning):
        decoder({**config, "num_local_experts": 8, "hidden_act": "gelu"})  # warns of its 8 key/value heads
    assert decoder({**config, "num_experts": 1}) == decoder(config)
    # Qwen3-MoE and OLMoE: routed experts in every layer, read with their own family; Qwen3's heads are
    # head_dim wide (128 x 32 = 4,096 > hidden 2,048 in Qwen3-30B-A3B). A shared expert or dense layers
    # among the sparse ones are refused.
    qwen3 = {**config, "model_type": "qwen3_moe", "hidden_size": 2048, "num_attention_heads": 32,
             "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
             "moe_intermediate_size": 768, "intermediate_size": 6144, "num_hidden_layers": 48,
             "vocab_size": 151936}  # fmt: skip
    q = decoder(qwen3)
    assert (q.experts, q.top_k, q.ffn, q.head_dim, q.moe_family, q.attention_width) == (
        128, 8, 768, 128, "qwen3_moe", 4096)  # fmt: skip
    assert round(q.params_b, 1) == 30.5  # Qwen3-30B-A3B: 30.5B parameters (Qwen's model card)
    traced = q.hf_config(2, 4096)
    keys = ("model_type", "num_experts", "moe_intermediate_size", "head_dim")
    assert [traced[k] for k in keys] == ["qwen3_moe", 128, 768, 128]
    olmoe = decoder({**config, "model_type": "olmoe", "num_experts": 64, "num_experts_per_tok": 8,
                     "intermediate_size": 1024})  # fmt: skip
    assert (olmoe.experts, olmoe.ffn, olmoe.moe_family, olmoe.head_dim) == (64, 1024, "olmoe", None)
    # Qwen1.5-MoE-A2.7B: 60 experts of 1,408, 4 per token, a shared expert of 5,632 with its gate (14.3B
    # parameters, as its card gives them).
    qwen2 = decoder({**config, "model_type": "qwen2_moe", "hidden_size": 2048, "num_attention_heads": 16,
                     "num_key_value_heads": 16, "num_hidden_layers": 24, "num_experts": 60,
                     "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "intermediate_size": 5632,
                     "shared_expert_intermediate_size": 5632, "vocab_size": 151936})  # fmt: skip
    assert (qwen2.experts, qwen2.top_k, qwen2.ffn, qwen2.shared_ffn) == (60, 4, 1408, 5632)
    assert round(qwen2.params_b, 1) == 14.3
    assert qwen2.hf_config(2, 4096)["shared_expert_intermediate_size"] == 5632
    with pytest.raises(
        ValueError, match=r"\(n_routed_experts=64\) with model_type='llama', n_shared_experts=2"
    ):
        decoder({**config, "n_routed_experts": 64, "n_shared_experts": 2})  # DeepSeek's keys, Llama's type
    with pytest.raises(
        ValueError, match=r"\(num_experts=128\) with n_shared_experts=1"
    ):  # a shared expert Qwen3 has not
        decoder({**qwen3, "n_shared_experts": 1})
    with pytest.raises(ValueError, match=r"with mlp_only_layers=\[0\]; accepted: .*experts in every layer"):
        decoder({**qwen3, "mlp_only_layers": [0]})
    with pytest.raises(ValueError, match="with decoder_sparse_step=0"):
        decoder({**qwen3, "decoder_sparse_step": 0})
    with pytest.raises(ValueError, match="head_dim=32 with OLMoE"):
        dataclasses.replace(olmoe, head_dim=32)
    with pytest.raises(ValueError, match="shared_ffn must be a whole number >= 0"):
        dataclasses.replace(qwen2, shared_ffn=-1)
    # Qwen3's attention FLOPs are its queries' width's, 4,096, not the model's 2,048 (PaLM's 12 L h s).
    assert q.model_flops(1, 4096) - q.model_flops(1, 0) == 12 * 48 * 4096 * 4096


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: plan("nosuch", CLUSTER, BATCH), "unknown model 'nosuch'; accepted: .*llama-70b"),
        (lambda: plan(TINY, CLUSTER, 0), "batch must be a whole number >= 1"),
        (lambda: plan(TINY, CLUSTER, 3, micro_sizes=(2,)), "no valid plan .* accepted: a batch"),
        (lambda: plan(TINY, CLUSTER, BATCH, precision="fp8"), "precision"),
        (lambda: Decoder("odd", 2, 66, 4, 8, 8, 8), "hidden 66 is not a multiple of heads 4"),
        (
            lambda: Decoder("gqa", 2, 64, 4, 8, 8, 8, gated=True, kv_heads=3),
            "kv_heads must be .* dividing heads 4, got 3",
        ),
        (lambda: Decoder("gpt", 2, 64, 4, 8, 8, 8, kv_heads=2), "kv_heads=2 needs a gated"),
        (
            lambda: Decoder("moe", 2, 64, 4, 8, 8, 8, gated=True, experts=4, top_k=5),
            "top_k=5 exceeds experts=4",
        ),
        (lambda: Decoder("moe", 2, 64, 4, 8, 8, 8, experts=0), "experts must be a whole number >= 1"),
    ],
)
def test_bad_input_is_one_clear_error(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_the_command_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "nosuch", "--cluster", CLUSTER, "--batch", "8"]) == BAD_INPUT
    assert "accepted" in capsys.readouterr().err

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fxcost.sim.search, "plan", interrupted)
    assert main(["plan", "llama-8b", "--cluster", CLUSTER, "--batch", "8"]) == INTERRUPTED
