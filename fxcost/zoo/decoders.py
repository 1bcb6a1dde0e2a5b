"""Decoder-only language models by their dimensions: a few named ones, or read from a Hugging Face config.

A :class:`Decoder` holds what a parallel plan depends on (layers, width, heads, MLP width, vocabulary,
context) and becomes a Hugging Face config of the same dimensions, a few layers deep, to trace on meta
tensors and deepen (:mod:`fxcost.sim.deepen`), as the family it belongs to runs it:

- **GPT** (a GELU MLP): GPT-2's blocks, layer norms, learned positions, dropout 0.1 and an output
  layer tied to the embedding, as GPT-3 and Megatron-LM's GPT run.
- **Llama** (``gated``, a SwiGLU MLP): Llama's blocks, eager RMSNorm, rotary embeddings on the queries
  and keys, ``kv_heads`` grouped-query heads, no dropout and an output layer of its own, as Llama 2
  and 3 and torchtitan's Llama run. Before, a gated decoder was traced as GPT-2 with a GELU MLP of
  ``1.5 f`` (the same matmul FLOPs): its norms, rotary embeddings, SwiGLU and grouped-query repeats
  were missing and its dropouts were extra.
- **Mixtral** (``gated`` with ``experts``): Llama's blocks with each MLP a mixture of ``experts``
  SwiGLU experts, a router sending each token to ``top_k`` of them (Hugging Face's Mixtral; the
  simulator assumes balanced routing, :mod:`fxcost.sim.moe`). A Qwen3-MoE, OLMoE or Qwen2-MoE config
  is traced as its own family (``moe_family``): the same experts and router, with RMSNorms on the
  queries and keys (Qwen3, OLMoE), Qwen3's heads as wide as its ``head_dim`` says, and Qwen2-MoE's
  shared expert beside the routed ones with its sigmoid gate.
- **DeepSeek-V2 and -V3** (``moe_family`` ``deepseek_v2``/``deepseek_v3``): Hugging Face's DeepSeek
  blocks: multi-head latent attention (``latent``), ``shared_ffn`` of shared experts beside the
  routed ones (no gate), sigmoid (V3) or softmax (V2) routing in one group of experts, and the first
  ``dense_layers`` layers dense. A trace of such a model holds layers of both kinds
  (:meth:`Decoder.traced_depth`), each deepened as its own (:meth:`Decoder.layer_sources`).

Named models (:data:`DECODERS`), each from its paper:

- ``gpt3-1.3b``, ``gpt3-175b``: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1
  (GPT-3 XL: 24 layers, d_model 2048, 16 heads; GPT-3: 96 layers, 12288, 96 heads; MLP 4 d_model;
  context 2048; the GPT-2 byte-pair vocabulary of 50257).
- ``llama-8b``, ``llama-70b``: Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3:
  32 layers, 4096, 32 heads, FFN 14336; 80 layers, 8192, 64 heads, FFN 28672; 8 key/value heads;
  vocabulary 128000, 128256 in the released configs; context 8192).
- ``mixtral-8x7b``: Jiang et al. 2024, "Mixtral of Experts", Table 1 (32 layers, 4096, 32 heads, 8
  key/value heads, expert width 14336, 8 experts, top 2, vocabulary 32000, context 32768).
- ``deepseek-v3``: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §4.2 (61 layers, 7168, 128 heads
  of 128; key-value compression 512, query compression 1536, rotary key dims 64; every MLP but the
  first three's a mixture of 1 shared and 256 routed experts 2048 wide, 8 per token; its 4,096-token
  pre-training context), with the dense MLP width (18432) and vocabulary (129280) of its released
  config; its multi-token prediction module is left out, as Hugging Face's model leaves it out.

Example:
    >>> decoder("llama-70b").params_b  # doctest: +ELLIPSIS
    7...
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxcost._checks import positive_int
from fxcost.zoo.families import MOE_FAMILIES, Latent, MoeFamily
from fxcost.zoo.hf_configs import read_config

__all__ = ["ATTENTIONS", "DECODERS", "MOE_FAMILIES", "Decoder", "Latent", "MoeFamily", "decoder"]

ATTENTIONS = ("sdpa", "eager")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Decoder:
    """A GPT- or Llama-family decoder by its dimensions.

    Attributes:
        name: what it is called (a named model, or the config file's name).
        layers, hidden, heads: transformer layers, model width, attention heads.
        ffn: MLP width (of each of the gate and up projections when ``gated``; each expert's in a mixture).
        vocab: vocabulary (the input embedding and the output layer).
        seq: the context it was trained at (the default sequence length of a plan).
        gated: a SwiGLU MLP (three ``hidden x ffn`` matrices) rather than two: a Llama-family model.
        kv_heads: key and value heads (grouped-query attention, Llama family only); None: ``heads``.
        tied: the output layer is the input embedding; None: the family's way (GPT tied, Llama not;
            Llama 3.2's 1B and 3B are tied).
        experts, top_k: a mixture of ``experts`` MLPs (each ``ffn`` wide, gated only) of which each
            token runs ``top_k``; 1 and 1: one dense MLP.
        head_dim: each attention head's width; None: ``hidden / heads``.
        moe_family: the Hugging Face family a mixture is traced as (:data:`MOE_FAMILIES`).
        shared_ffn: the width of a shared expert every token runs beside the routed ones (Qwen2-MoE's,
            with its gate; DeepSeek's, ``n_shared_experts`` experts run as one MLP); 0: none.
        latent: multi-head latent attention in place of the heads' own projections (DeepSeek's).
        dense_layers, dense_ffn: a mixture's first ``dense_layers`` layers run one dense MLP
            ``dense_ffn`` wide instead of the experts (DeepSeek's ``first_k_dense_replace``).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    gated: bool = False
    kv_heads: int | None = None
    tied: bool | None = None
    experts: int = 1
    top_k: int = 1
    head_dim: int | None = None
    moe_family: str = "mixtral"
    shared_ffn: int = 0
    latent: Latent | None = None
    dense_layers: int = 0
    dense_ffn: int = 0

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "experts", "top_k", "head_dim"):
            value = getattr(self, key)
            if key == "head_dim" and value is None:
                continue
            if not _whole(value) or value < 1:
                raise ValueError(f"decoder {self.name!r}: {key} must be a whole number >= 1, got {value!r}")
        for key in ("shared_ffn", "dense_layers", "dense_ffn"):
            if not _whole(getattr(self, key)) or getattr(self, key) < 0:
                raise ValueError(
                    f"decoder {self.name!r}: {key} must be a whole number >= 0, got {getattr(self, key)!r}"
                )
        if self.moe_family not in MOE_FAMILIES:
            raise ValueError(
                f"decoder {self.name!r}: unknown moe_family {self.moe_family!r}; accepted: "
                f"{', '.join(MOE_FAMILIES)}"
            )
        self._check_mixture()
        if self.head_dim is not None and not self.gated:
            raise ValueError(
                f"decoder {self.name!r}: head_dim={self.head_dim} needs a gated (Llama-family) decoder; a "
                "GPT-family one is traced as GPT-2, whose heads are hidden / heads wide"
            )
        if self.hidden % self.heads:
            raise ValueError(
                f"decoder {self.name!r}: hidden {self.hidden} is not a multiple of heads {self.heads}"
            )
        kv = self.kv_heads
        if kv is not None and (not _whole(kv) or kv < 1 or self.heads % kv):
            raise ValueError(
                f"decoder {self.name!r}: kv_heads must be a whole number >= 1 dividing heads {self.heads}, "
                f"got {kv!r}"
            )
        if kv is not None and kv != self.heads and not self.gated:
            raise ValueError(
                f"decoder {self.name!r}: kv_heads={kv} needs a gated (Llama-family) decoder; a GPT-family "
                "one is traced as GPT-2, whose every head has its keys and values"
            )

    def _check_mixture(self) -> None:
        family = MOE_FAMILIES[self.moe_family]
        deepseek = family.latent_defaults is not None
        if self.experts > 1 and not self.gated:
            raise ValueError(
                f"decoder {self.name!r}: experts={self.experts} needs a gated decoder (Mixtral's SwiGLU "
                "experts); a GPT-family one is traced as GPT-2, with one MLP"
            )
        if self.top_k > self.experts:
            raise ValueError(f"decoder {self.name!r}: top_k={self.top_k} exceeds experts={self.experts}")
        if self.head_dim is not None and self.moe_family == "olmoe" and self.experts > 1:
            raise ValueError(
                f"decoder {self.name!r}: head_dim={self.head_dim} with OLMoE, whose query norm is as wide as "
                "the model; accepted: head_dim None (hidden / heads)"
            )
        if self.shared_ffn and (self.experts == 1 or not family.shared_key):
            raise ValueError(
                f"decoder {self.name!r}: a shared expert (shared_ffn={self.shared_ffn}) needs experts > 1 "
                "and a family that runs one (qwen2_moe, deepseek_v2, deepseek_v3)"
            )
        if deepseek and self.shared_ffn % self.ffn:
            raise ValueError(
                f"decoder {self.name!r}: DeepSeek's shared experts are ffn={self.ffn} wide each; shared_ffn="
                f"{self.shared_ffn} is not a multiple of it"
            )
        if (self.latent is not None or self.dense_layers) and not (deepseek and self.experts > 1):
            raise ValueError(
                f"decoder {self.name!r}: latent attention and dense_layers are DeepSeek's; accepted with "
                "experts > 1 and moe_family deepseek_v2 or deepseek_v3"
            )
        if deepseek and self.experts > 1 and (self.latent is None or self.head_dim is not None):
            raise ValueError(
                f"decoder {self.name!r}: a DeepSeek mixture needs its latent= attention dims and no head_dim"
            )
        if self.dense_layers >= self.layers or (self.dense_layers and not self.dense_ffn):
            raise ValueError(
                f"decoder {self.name!r}: dense_layers={self.dense_layers} needs dense_ffn >= 1 and fewer "
                f"dense layers than its {self.layers}"
            )

    @property
    def matmul_params(self) -> int:
        """Parameters of the matmuls: the attention's (the queries' and output's ``2 h x heads x head
        dim``, ``2 h^2``, and the keys' and values' ``2 h x kv_heads x head dim``; a latent attention's
        own, :meth:`Latent.params`) per layer, the MLP's ``2 or 3 h f`` (each expert's, the router's
        ``h x experts`` and a shared expert's; a dense layer's), and the output layer."""
        return self._matmul_params(self.experts)

    @property
    def active_matmul_params(self) -> int:
        """:attr:`matmul_params` a token runs through: ``top_k`` of the experts."""
        return self._matmul_params(self.top_k)

    @property
    def attention_width(self) -> int:
        """The width of the attention's output over all heads, what its output projection takes:
        ``heads x head_dim`` (``hidden`` unless the heads say otherwise; a latent attention's ``heads x v``,
        narrower than its queries, :attr:`score_widths`)."""
        if self.latent is not None:
            return self.heads * self.latent.v
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def score_widths(self) -> tuple[int, int]:
        """The widths of the queries (and keys) and of the values over all heads: the score matmul's
        contraction and the value matmul's output."""
        if self.latent is not None:
            return self.heads * (self.latent.nope + self.latent.rope), self.heads * self.latent.v
        return self.attention_width, self.attention_width

    def _matmul_params(self, experts: int) -> int:
        h, kv = self.hidden, (self.kv_heads or self.heads) * (self.attention_width // self.heads)
        if self.latent is not None:
            attention = self.latent.params(h, self.heads)
        else:
            attention = 2 * h * self.attention_width + 2 * h * kv
        mlp = experts * (3 if self.gated else 2) * h * self.ffn
        if self.experts > 1:  # the router, a shared expert, and Qwen2-MoE's gate of it (built even 0 wide)
            mlp += h * self.experts + 3 * h * self.shared_ffn + h * MOE_FAMILIES[self.moe_family].shared_gate
        dense = 3 * h * self.dense_ffn
        return (
            self.layers * attention
            + (self.layers - self.dense_layers) * mlp
            + self.dense_layers * dense
            + self.vocab * h
        )

    @property
    def is_tied(self) -> bool:
        """Whether the output layer is the input embedding (:attr:`tied`, else the family's way)."""
        return not self.gated if self.tied is None else self.tied

    @property
    def params(self) -> int:
        """Parameters: :attr:`matmul_params`, the input embedding unless the output layer is it, and
        GPT's learned positions; biases and norms left out."""
        embedding = 0 if self.is_tied else self.vocab
        return self.matmul_params + (embedding + (0 if self.gated else self.seq)) * self.hidden

    @property
    def params_b(self) -> float:
        return self.params / 1e9

    def hf_config(self, layers: int, seq: int, attention: str = "sdpa") -> dict[str, Any]:
        """The Hugging Face config of this decoder ``layers`` deep at context ``seq``: GPT-2's, or
        Llama's where ``gated`` (the module docstring says what each runs), the attention as
        ``attention`` runs it: ``"sdpa"`` (one fused kernel, as today's training runs it) or ``"eager"``
        (matmuls, softmax and dropout apart, the score matrix kept for the backward)."""
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; accepted: {', '.join(ATTENTIONS)}")
        if attention == "eager" and self.latent is not None:  # its ring's keys are read off the fused op
            raise ValueError(f"decoder {self.name!r}: latent attention is traced fused; accepted: 'sdpa'")
        depth = min(layers, self.layers)
        if self.gated:
            family: dict[str, Any] = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
            if self.experts > 1:
                moe = MOE_FAMILIES[self.moe_family]
                family = {"model_type": self.moe_family, "architectures": [moe.architecture],
                          moe.experts_key: self.experts, "num_experts_per_tok": self.top_k,
                          moe.width_key: self.ffn, "output_router_logits": False, **moe.settings}  # fmt: skip
                if moe.shared_key:
                    family[moe.shared_key] = self.shared_ffn // (self.ffn if moe.counts_experts else 1)
            if self.head_dim is not None:
                family["head_dim"] = self.head_dim
            if self.latent is not None:
                q_rank, kv_rank, nope, rope, v = self.latent
                # its first layers dense, as many as it has (and at least one sparse one)
                dense = min(self.dense_layers, depth - 1)
                family.update(q_lora_rank=q_rank, kv_lora_rank=kv_rank, qk_nope_head_dim=nope,
                              qk_rope_head_dim=rope, v_head_dim=v, first_k_dense_replace=dense)  # fmt: skip
            return {
                **family,
                "num_hidden_layers": depth,
                "hidden_size": self.hidden,
                "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads or self.heads,
                "intermediate_size": self.dense_ffn if self.dense_layers else self.ffn,
                "vocab_size": self.vocab,
                "max_position_embeddings": seq,
                "hidden_act": "silu",
                "tie_word_embeddings": self.is_tied,
                "attn_implementation": attention,
            }
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "n_layer": depth,
            "n_embd": self.hidden,
            "n_head": self.heads,
            "n_inner": self.ffn,
            "vocab_size": self.vocab,
            "n_positions": seq,
            "activation_function": "gelu_pytorch_tanh",
            "bos_token_id": 0,
            "eos_token_id": 0,
            "tie_word_embeddings": self.is_tied,
            "attn_implementation": attention,
        }

    def model_flops(self, tokens: int, seq: int) -> float:
        """Model FLOPs of a training step (forward and backward, no recomputation) on ``tokens`` tokens
        of sequences ``seq`` long: PaLM's count (Chowdhery et al. 2022, appendix B) ``6 N + 12 L h s``
        per token, with ``N`` the matmul parameters (the layers' and the output layer's; the embedding
        lookup and positions do no matmul) and ``12 L h s`` the attention's score and value matmuls
        (``h`` the heads' width, :attr:`attention_width`; ``6 L s (h_qk + h_v)`` where the values are
        narrower than the queries, :attr:`score_widths`) (Narayanan et al. 2021, eq. 3, has the same
        terms); a mixture of experts counts the ``top_k`` experts a token runs
        (:attr:`active_matmul_params`)."""
        return tokens * (6.0 * self.active_matmul_params + 6.0 * self.layers * sum(self.score_widths) * seq)

    def traced_depth(self, layers: int) -> int:
        """How deep a trace that stands for the whole model is, traced with ``layers`` layers of each
        kind: ``layers`` (at most the model's), or where the first layers are dense,
        ``min(layers, dense_layers)`` of them and one sparse layer."""
        positive_int("layers", layers)
        if self.dense_layers:
            return min(layers, self.dense_layers) + 1
        return min(layers, self.layers)

    def layer_sources(self, layers: int) -> tuple[int, ...]:
        """The layer of a trace :meth:`traced_depth` ``(layers)`` deep that each of the model's layers
        repeats: itself, else the last traced one of its kind (:func:`fxcost.sim.deepen.deepen`)."""
        traced = self.traced_depth(layers)
        if not self.dense_layers:
            return tuple(min(i, traced - 1) for i in range(self.layers))
        dense = traced - 1
        return tuple(min(i, dense - 1) if i < self.dense_layers else dense for i in range(self.layers))


DECODERS: dict[str, Decoder] = {
    d.name: d
    for d in (
        Decoder("gpt3-1.3b", 24, 2048, 16, 4 * 2048, 50257, 2048),
        Decoder("gpt3-175b", 96, 12288, 96, 4 * 12288, 50257, 2048),
        Decoder("llama-8b", 32, 4096, 32, 14336, 128256, 8192, gated=True, kv_heads=8),
        Decoder("llama-70b", 80, 8192, 64, 28672, 128256, 8192, gated=True, kv_heads=8),
        Decoder(
            "mixtral-8x7b", 32, 4096, 32, 14336, 32000, 32768, gated=True, kv_heads=8, experts=8, top_k=2
        ),
        Decoder(
            "deepseek-v3",
            61,
            7168,
            128,
            2048,
            129280,
            4096,
            gated=True,
            experts=256,
            top_k=8,
            moe_family="deepseek_v3",
            shared_ffn=2048,
            latent=Latent(1536, 512, 128, 64, 128),
            dense_layers=3,
            dense_ffn=18432,
        ),
    )
}


def decoder(model: str | Path | dict[str, Any] | Decoder) -> Decoder:
    """A named decoder (:data:`DECODERS`), or one read from a Hugging Face ``config.json`` (a path or
    its dict) of a decoder-only model.

    Raises:
        ValueError: an unknown name, a file that does not exist, or a config without the dimensions.
    """
    if isinstance(model, Decoder):
        return model
    if isinstance(model, str) and model in DECODERS:
        return DECODERS[model]
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise ValueError(
                f"unknown model {str(model)!r}; accepted: a Hugging Face config.json or one of "
                f"{', '.join(DECODERS)}"
            )
        return Decoder(**read_config(json.loads(path.read_text(encoding="utf-8")), path.stem))
    name = str(model.get("_name_or_path") or model.get("model_type") or "model")
    return Decoder(**read_config(dict(model), name))
