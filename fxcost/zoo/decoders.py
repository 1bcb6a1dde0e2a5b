"""Decoder-only language models by their dimensions: a few named ones, or read from a Hugging Face config.

A :class:`Decoder` holds what a parallel plan depends on (layers, width, heads, MLP width, vocabulary,
context) and becomes a Hugging Face GPT-2 config of the same dimensions, a few layers deep, to trace on
meta tensors and deepen (:mod:`fxcost.sim.deepen`). GPT-2 blocks are the ones the simulator shards
(its layer norms tell it the width; an RMSNorm does not); a gated (SwiGLU) MLP of width ``f``, as in
Llama, becomes a GELU MLP of width ``1.5 f``: the same FLOPs and parameters. Grouped-query attention
is traced as full multi-head attention (its key and value projections as wide as the queries): for
Llama 3 70B that overstates a layer's parameters and matmul FLOPs by about 12%.

Named models (:data:`DECODERS`), each from its paper:

- ``gpt3-1.3b``, ``gpt3-175b``: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1
  (GPT-3 XL: 24 layers, d_model 2048, 16 heads; GPT-3: 96 layers, 12288, 96 heads; MLP 4 d_model;
  context 2048; the GPT-2 byte-pair vocabulary of 50257).
- ``llama-8b``, ``llama-70b``: Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3:
  32 layers, 4096, 32 heads, FFN 14336; 80 layers, 8192, 64 heads, FFN 28672; vocabulary 128000,
  128256 in the released configs; context 8192).

Example:
    >>> decoder("llama-70b").params_b  # doctest: +ELLIPSIS
    7...
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ATTENTIONS", "DECODERS", "Decoder", "decoder"]

ATTENTIONS = ("sdpa", "eager")


@dataclass(frozen=True)
class Decoder:
    """A GPT-style decoder by its dimensions.

    Attributes:
        name: what it is called (a named model, or the config file's name).
        layers, hidden, heads: transformer layers, model width, attention heads.
        ffn: MLP width (of each of the gate and up projections when ``gated``).
        vocab: vocabulary (the embedding and the tied output layer).
        seq: the context it was trained at (the default sequence length of a plan).
        gated: a SwiGLU MLP (three ``hidden x ffn`` matrices) rather than two.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    gated: bool = False

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"decoder {self.name!r}: {key} must be a whole number >= 1, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(
                f"decoder {self.name!r}: hidden {self.hidden} is not a multiple of heads {self.heads}"
            )

    @property
    def params(self) -> int:
        """Parameters: attention ``4 h^2`` and the MLP's ``2 or 3 h f`` per layer, the embeddings
        (tied with the output layer) and learned positions; biases and norms left out."""
        mlp = (3 if self.gated else 2) * self.hidden * self.ffn
        return self.layers * (4 * self.hidden**2 + mlp) + (self.vocab + self.seq) * self.hidden

    @property
    def params_b(self) -> float:
        return self.params / 1e9

    def hf_config(self, layers: int, seq: int, attention: str = "sdpa") -> dict[str, Any]:
        """The Hugging Face GPT-2 config of this decoder ``layers`` deep at context ``seq``: a gated (SwiGLU)
        MLP of ``ffn`` as a GELU one of ``1.5 x ffn`` (the same FLOPs and parameters), the attention as
        ``attention`` runs it: ``"sdpa"`` (one fused kernel, as today's training runs it) or ``"eager"``
        (matmuls, softmax and dropout apart, the score matrix kept for the backward)."""
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; accepted: {', '.join(ATTENTIONS)}")
        width = self.ffn * 3 // 2 if self.gated else self.ffn
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "n_layer": min(layers, self.layers),
            "n_embd": self.hidden,
            "n_head": self.heads,
            "n_inner": width,
            "vocab_size": self.vocab,
            "n_positions": seq,
            "activation_function": "gelu_pytorch_tanh",
            "bos_token_id": 0,
            "eos_token_id": 0,
            "attn_implementation": attention,
        }

    def model_flops(self, tokens: int, seq: int) -> float:
        """Model FLOPs of a training step (forward and backward, no recomputation) on ``tokens`` tokens
        of sequences ``seq`` long: PaLM's count (Chowdhery et al. 2022, appendix B) ``6 N + 12 L h s``
        per token, with ``N`` the matmul parameters (the layers' and the output layer's; the embedding
        lookup and positions do no matmul) and ``12 L h s`` the attention's score and value matmuls
        (Narayanan et al. 2021, eq. 3, has the same terms)."""
        matmul_params = self.params - self.seq * self.hidden
        return tokens * (6.0 * matmul_params + 12.0 * self.layers * self.hidden * seq)


DECODERS: dict[str, Decoder] = {
    d.name: d
    for d in (
        Decoder("gpt3-1.3b", 24, 2048, 16, 4 * 2048, 50257, 2048),
        Decoder("gpt3-175b", 96, 12288, 96, 4 * 12288, 50257, 2048),
        Decoder("llama-8b", 32, 4096, 32, 14336, 128256, 8192, gated=True),
        Decoder("llama-70b", 80, 8192, 64, 28672, 128256, 8192, gated=True),
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
    found: dict[str, int] = {}
    for key, names in _KEYS.items():
        value = next((raw[n] for n in names if raw.get(n) is not None), None)
        if value is None and key == "ffn" and "hidden" in found:
            value = 4 * found["hidden"]  # GPT-2's default MLP width
        if value is None:
            raise ValueError(f"{name}: the config has no {key} ({' or '.join(names)})")
        found[key] = int(value)
    activation = str(raw.get("hidden_act") or raw.get("activation_function") or "")
    return Decoder(name, gated=activation in _GATED_ACTIVATIONS, **found)
