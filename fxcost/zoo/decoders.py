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

Named models (:data:`DECODERS`), each from its paper:

- ``gpt3-1.3b``, ``gpt3-175b``: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1
  (GPT-3 XL: 24 layers, d_model 2048, 16 heads; GPT-3: 96 layers, 12288, 96 heads; MLP 4 d_model;
  context 2048; the GPT-2 byte-pair vocabulary of 50257).
- ``llama-8b``, ``llama-70b``: Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3:
  32 layers, 4096, 32 heads, FFN 14336; 80 layers, 8192, 64 heads, FFN 28672; 8 key/value heads;
  vocabulary 128000, 128256 in the released configs; context 8192).
- ``mixtral-8x7b``: Jiang et al. 2024, "Mixtral of Experts", Table 1 (32 layers, 4096, 32 heads, 8
  key/value heads, expert width 14336, 8 experts, top 2, vocabulary 32000, context 32768).

Example:
    >>> decoder("llama-70b").params_b  # doctest: +ELLIPSIS
    7...
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["ATTENTIONS", "DECODERS", "MOE_FAMILIES", "Decoder", "MoeFamily", "decoder"]

ATTENTIONS = ("sdpa", "eager")


class MoeFamily(NamedTuple):
    """A Hugging Face family a mixture of experts is traced as."""

    architecture: str
    experts_key: str  # the config's key for the experts per layer
    width_key: str  # and for each expert's width
    top_k: int  # experts per token where the config does not say (the family's default)
    shared_ffn: int  # its shared expert's width where the config does not say (0: it has none)
    settings: dict[str, Any]  # what else makes every layer's MLP a mixture


_EVERY_LAYER = {"decoder_sparse_step": 1, "mlp_only_layers": []}
# fmt: off
MOE_FAMILIES: dict[str, MoeFamily] = {
    "mixtral": MoeFamily("MixtralForCausalLM", "num_local_experts", "intermediate_size", 2, 0, {}),
    "qwen3_moe": MoeFamily("Qwen3MoeForCausalLM", "num_experts", "moe_intermediate_size", 8, 0,
                           {**_EVERY_LAYER, "norm_topk_prob": True}),
    "olmoe": MoeFamily("OlmoeForCausalLM", "num_experts", "intermediate_size", 8, 0, {}),
    "qwen2_moe": MoeFamily("Qwen2MoeForCausalLM", "num_experts", "moe_intermediate_size", 4, 5632,
                           {**_EVERY_LAYER, "norm_topk_prob": False}),
}
# fmt: on
"""The families a mixture of experts is traced as, by ``model_type``, with Hugging Face's defaults."""


@dataclass(frozen=True)
class Decoder:
    """A GPT- or Llama-family decoder by its dimensions.

    Attributes:
        name: what it is called (a named model, or the config file's name).
        layers, hidden, heads: transformer layers, model width, attention heads.
        ffn: MLP width (of each of the gate and up projections when ``gated``).
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
        shared_ffn: the width of a shared expert every token runs beside the routed ones, with a
            one-column sigmoid gate (Qwen2-MoE's); 0: none.
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

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "experts", "top_k", "head_dim"):
            value = getattr(self, key)
            if key == "head_dim" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"decoder {self.name!r}: {key} must be a whole number >= 1, got {value!r}")
        if self.moe_family not in MOE_FAMILIES:
            raise ValueError(
                f"decoder {self.name!r}: unknown moe_family {self.moe_family!r}; accepted: "
                f"{', '.join(MOE_FAMILIES)}"
            )
        if not isinstance(self.shared_ffn, int) or isinstance(self.shared_ffn, bool) or self.shared_ffn < 0:
            raise ValueError(
                f"decoder {self.name!r}: shared_ffn must be a whole number >= 0, got {self.shared_ffn!r}"
            )
        if self.head_dim is not None and self.moe_family == "olmoe" and self.experts > 1:
            raise ValueError(
                f"decoder {self.name!r}: head_dim={self.head_dim} with OLMoE, whose query norm is as wide as "
                "the model; accepted: head_dim None (hidden / heads)"
            )
        if self.shared_ffn and not self.has_shared_expert:
            raise ValueError(
                f"decoder {self.name!r}: a shared expert (shared_ffn={self.shared_ffn}) needs experts > 1 "
                "and a family that runs one (qwen2_moe)"
            )
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
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.heads % kv):
            raise ValueError(
                f"decoder {self.name!r}: kv_heads must be a whole number >= 1 dividing heads {self.heads}, "
                f"got {kv!r}"
            )
        if kv is not None and kv != self.heads and not self.gated:
            raise ValueError(
                f"decoder {self.name!r}: kv_heads={kv} needs a gated (Llama-family) decoder; a GPT-family "
                "one is traced as GPT-2, whose every head has its keys and values"
            )
        if self.experts > 1 and not self.gated:
            raise ValueError(
                f"decoder {self.name!r}: experts={self.experts} needs a gated decoder (Mixtral's SwiGLU "
                "experts); a GPT-family one is traced as GPT-2, with one MLP"
            )
        if self.top_k > self.experts:
            raise ValueError(f"decoder {self.name!r}: top_k={self.top_k} exceeds experts={self.experts}")

    @property
    def matmul_params(self) -> int:
        """Parameters of the matmuls: the queries' and output's ``2 h x heads x head dim`` (``2 h^2``)
        and the keys' and values' ``2 h x kv_heads x head dim`` per layer, the MLP's ``2 or 3 h f``
        (each expert's, and the router's ``h x experts``), and the output layer."""
        return self._matmul_params(self.experts)

    @property
    def active_matmul_params(self) -> int:
        """:attr:`matmul_params` a token runs through: ``top_k`` of the experts."""
        return self._matmul_params(self.top_k)

    @property
    def has_shared_expert(self) -> bool:
        """Whether its mixture runs a shared expert beside the routed ones (Qwen2-MoE's family does)."""
        return self.experts > 1 and MOE_FAMILIES[self.moe_family].shared_ffn > 0

    @property
    def attention_width(self) -> int:
        """The queries' width, ``heads x head_dim`` (``hidden`` unless the heads say otherwise)."""
        return self.heads * (self.head_dim or self.hidden // self.heads)

    def _matmul_params(self, experts: int) -> int:
        h, kv = self.hidden, (self.kv_heads or self.heads) * (self.attention_width // self.heads)
        attention = 2 * h * self.attention_width + 2 * h * kv
        mlp = experts * (3 if self.gated else 2) * h * self.ffn + (
            h * self.experts if self.experts > 1 else 0
        )
        if self.has_shared_expert:  # and that expert's gate
            mlp += 3 * h * self.shared_ffn + h
        return self.layers * (attention + mlp) + self.vocab * h

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
        depth = min(layers, self.layers)
        if self.gated:
            family: dict[str, Any] = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
            if self.experts > 1:
                moe = MOE_FAMILIES[self.moe_family]
                family = {"model_type": self.moe_family, "architectures": [moe.architecture],
                          moe.experts_key: self.experts, "num_experts_per_tok": self.top_k,
                          moe.width_key: self.ffn, "output_router_logits": False, **moe.settings}  # fmt: skip
            if self.has_shared_expert:
                family[_SHARED_EXPERTS[0]] = self.shared_ffn
            if self.head_dim is not None:
                family["head_dim"] = self.head_dim
            return {
                **family,
                "num_hidden_layers": depth,
                "hidden_size": self.hidden,
                "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads or self.heads,
                "intermediate_size": self.ffn,
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
        (``h`` the queries' width, :attr:`attention_width`)
        (Narayanan et al. 2021, eq. 3, has the same terms); a mixture of experts counts the ``top_k``
        experts a token runs (:attr:`active_matmul_params`)."""
        return tokens * (6.0 * self.active_matmul_params + 12.0 * self.layers * self.attention_width * seq)


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
    )
}

# Hugging Face config keys for each dimension, by the names the model families use.
_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
    "seq": ("max_position_embeddings", "n_positions", "seq_length"),
}
_GATED_ACTIVATIONS = ("silu", "swiglu", "swish")
# Mixture-of-experts configs name their experts so: Mixtral's, Qwen3-MoE's, OLMoE's and Qwen2-MoE's
# (read; Qwen2-MoE's shared expert too), DeepSeek's and DBRX's (shared experts of their own kind, dense
# layers among the sparse ones: refused).
_MIXTRAL_EXPERTS = "num_local_experts"
_OTHER_EXPERT_KEYS = ("num_experts", "n_routed_experts", "moe_num_experts")
_SHARED_EXPERTS = ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts")


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
        return _from_config(json.loads(path.read_text(encoding="utf-8")), path.stem)
    return _from_config(dict(model), str(model.get("_name_or_path") or model.get("model_type") or "model"))


def _from_config(raw: dict[str, Any], name: str) -> Decoder:
    if raw.get("is_encoder_decoder"):
        raise ValueError(
            f"{name}: an encoder-decoder config; accepted: decoder-only models (GPT, Llama, ...)"
        )
    nested = {k: v for part in raw.values() if isinstance(part, dict) for k, v in part.items()}  # DBRX's
    other = next((k for k in _OTHER_EXPERT_KEYS if (raw.get(k) or nested.get(k) or 0) > 1), None)
    family = str(raw.get("model_type") or "")
    own = _SHARED_EXPERTS[:1] if family in MOE_FAMILIES and MOE_FAMILIES[family].shared_ffn else ()
    shared = [k for k in _SHARED_EXPERTS if raw.get(k) and k not in own]
    unread = [f"{k}={raw[k]}" for k in shared]  # what fxcost plan does not trace
    if other != "num_experts" or family not in MOE_FAMILIES:
        unread.insert(0, f"model_type={family!r}")
    if raw.get("decoder_sparse_step", 1) != 1:
        unread.append(f"decoder_sparse_step={raw['decoder_sparse_step']}")
    if raw.get("mlp_only_layers"):
        unread.append(f"mlp_only_layers={raw['mlp_only_layers']}")
    if other is not None and unread:
        raise ValueError(
            f"{name}: a mixture-of-experts config ({other}={raw.get(other) or nested[other]}) with "
            f"{', '.join(unread)}; accepted: dense decoders, and Mixtral ({_MIXTRAL_EXPERTS}), Qwen3-MoE, "
            "OLMoE and Qwen2-MoE (num_experts) mixtures with experts in every layer and no shared expert but "
            "Qwen2-MoE's; simulate others with fxcost.simulate and ep=..."
        )
    found: dict[str, int] = {}
    for key, names in _KEYS.items():
        value = next((raw[n] for n in names if raw.get(n) is not None), None)
        if value is None and key == "ffn" and "hidden" in found:
            value = 4 * found["hidden"]  # GPT-2's default MLP width
        if value is None:
            raise ValueError(f"{name}: the config has no {key} ({' or '.join(names)})")
        found[key] = int(value)
    activation = str(raw.get("hidden_act") or raw.get("activation_function") or "")
    gated = activation in _GATED_ACTIVATIONS
    kv = raw.get("num_key_value_heads")
    if not gated and kv is not None and int(kv) != found["heads"]:
        warnings.warn(
            f"{name}: its {kv} key/value heads are traced as full attention (a GELU MLP: GPT-2 blocks), "
            "which overstates its attention parameters and FLOPs",
            stacklevel=3,
        )
    kv = kv if gated else None
    tied = raw.get("tie_word_embeddings")
    experts, moe_family = int(raw.get(_MIXTRAL_EXPERTS) or 1), "mixtral"
    if other is not None:  # Qwen's or OLMoE's: the experts' own width where it is given
        experts, moe_family = int(raw[other]), family
        found["ffn"] = int(raw.get(MOE_FAMILIES[family].width_key) or found["ffn"])
    moe = MOE_FAMILIES[moe_family]
    top_k = int(raw.get("num_experts_per_tok") or moe.top_k) if experts > 1 else 1
    head_dim = raw.get("head_dim") if gated else None
    head_dim = (
        None if head_dim is None or int(head_dim) * found["heads"] == found["hidden"] else int(head_dim)
    )
    shared_ffn = int(raw.get(_SHARED_EXPERTS[0], moe.shared_ffn)) if experts > 1 else 0
    return Decoder(name, gated=gated, kv_heads=None if kv is None else int(kv),
                   tied=None if tied is None else bool(tied), experts=experts, top_k=top_k,
                   head_dim=head_dim, moe_family=moe_family, shared_ffn=shared_ffn, **found)  # fmt: skip
