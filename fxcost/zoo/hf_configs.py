"""A decoder's dimensions read from a Hugging Face ``config.json`` (:func:`read_config`), as the fields
of a :class:`fxcost.zoo.decoders.Decoder`.

Dense GPT- and Llama-family configs are read by their common keys (``hidden_size`` or ``n_embd``, ...).
Of mixtures of experts, the families of :data:`~fxcost.zoo.families.MOE_FAMILIES` are read: Mixtral
(``num_local_experts``), Qwen3-MoE, OLMoE and Qwen2-MoE (``num_experts``; Qwen2-MoE's shared expert
too), DeepSeek-V2 and -V3 (``n_routed_experts``: their latent attention, shared experts and leading
dense layers). Others (DBRX's, a Qwen mixture with dense layers among the sparse ones) are refused,
naming the key at fault.
"""

from __future__ import annotations

import warnings
from typing import Any

from fxcost.zoo.families import MOE_FAMILIES, Latent

__all__ = ["read_config"]

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
_MIXTRAL_EXPERTS = "num_local_experts"
_OTHER_EXPERT_KEYS = ("num_experts", "n_routed_experts", "moe_num_experts")
_SHARED_EXPERTS = ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts")
_LATENT = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")  # after q_lora_rank


def read_config(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """The fields of the :class:`~fxcost.zoo.decoders.Decoder` a Hugging Face config describes (the
    config's file name or model type ``name`` among them for its messages).

    Raises:
        ValueError: an encoder-decoder, a config without the dimensions, or a mixture of experts of a
            family that is not read (naming the key at fault).
    """
    if raw.get("is_encoder_decoder"):
        raise ValueError(
            f"{name}: an encoder-decoder config; accepted: decoder-only models (GPT, Llama, ...)"
        )
    nested = {k: v for part in raw.values() if isinstance(part, dict) for k, v in part.items()}  # DBRX's
    other = next((k for k in _OTHER_EXPERT_KEYS if (raw.get(k) or nested.get(k) or 0) > 1), None)
    family = str(raw.get("model_type") or "")
    known = MOE_FAMILIES.get(family)
    own = (known.shared_key,) if known is not None and known.shared_key else ()
    unread = [f"{k}={raw[k]}" for k in _SHARED_EXPERTS if raw.get(k) and k not in own]
    if known is None or other != known.experts_key:
        unread.insert(0, f"model_type={family!r}")
    for key, every in (("decoder_sparse_step", 1), ("moe_layer_freq", 1)):
        if raw.get(key, every) != every:
            unread.append(f"{key}={raw[key]}")
    if raw.get("mlp_only_layers"):
        unread.append(f"mlp_only_layers={raw['mlp_only_layers']}")
    if other is not None and unread:
        raise ValueError(
            f"{name}: a mixture-of-experts config ({other}={raw.get(other) or nested[other]}) with "
            f"{', '.join(unread)}; accepted: dense decoders, and Mixtral ({_MIXTRAL_EXPERTS}), Qwen3-MoE, "
            "OLMoE and Qwen2-MoE (num_experts), DeepSeek-V2 and -V3 (n_routed_experts) mixtures with experts "
            "in every layer (DeepSeek's: after its first_k_dense_replace) and no shared expert but "
            "Qwen2-MoE's and DeepSeek's; simulate others with fxcost.simulate and ep=..."
        )
    found: dict[str, Any] = {}
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
    tied = raw.get("tie_word_embeddings")
    mixture: dict[str, Any] = {"experts": int(raw.get(_MIXTRAL_EXPERTS) or 1)}
    if other is not None and known is not None:  # the experts' own width where it is given
        dense_ffn, found["ffn"] = found["ffn"], int(raw.get(known.width_key) or found["ffn"])
        mixture = {"experts": int(raw[other]), "moe_family": family}
        if known.latent_defaults is not None:
            mixture.update(_latent(raw, name, found["layers"], dense_ffn, known.latent_defaults))
    moe = MOE_FAMILIES[mixture.get("moe_family", "mixtral")]
    if mixture["experts"] > 1:
        mixture["top_k"] = int(raw.get("num_experts_per_tok") or moe.top_k)
        if moe.shared_key:
            count = raw.get(moe.shared_key)
            count = moe.shared_default if count is None else int(count)
            mixture["shared_ffn"] = count * found["ffn"] if moe.counts_experts else count
    latent = "latent" in mixture
    head_dim = raw.get("head_dim") if gated and not latent else None
    head_dim = (
        None if head_dim is None or int(head_dim) * found["heads"] == found["hidden"] else int(head_dim)
    )
    kv = None if not gated or latent or kv is None else int(kv)
    return {"name": name, "gated": gated, "kv_heads": kv, "tied": None if tied is None else bool(tied),
            "head_dim": head_dim, **mixture, **found}  # fmt: skip


def _latent(
    raw: dict[str, Any], name: str, layers: int, dense_ffn: int, defaults: dict[str, int]
) -> dict[str, Any]:
    """A DeepSeek config's latent attention and leading dense layers; its multi-token prediction
    modules (DeepSeek-V3's ``num_nextn_predict_layers``), which Hugging Face's model does not run, are
    left out with a warning."""
    if raw.get("num_nextn_predict_layers"):
        warnings.warn(
            f"{name}: its {raw['num_nextn_predict_layers']} multi-token prediction layer(s) are not traced "
            "(Hugging Face's model runs none); a step that trains them takes longer",
            stacklevel=4,
        )
    given = {**defaults, **raw}  # a missing key: Hugging Face's default
    missing = [key for key in _LATENT if given.get(key) is None]
    if missing:
        raise ValueError(f"{name}: a DeepSeek config with {', '.join(missing)} null (its latent attention)")
    q_rank = given["q_lora_rank"]  # null: the queries projected without a bottleneck (V2-Lite)
    latent = Latent(None if q_rank is None else int(q_rank), *(int(given[key]) for key in _LATENT))
    dense = min(int(given["first_k_dense_replace"] or 0), layers)
    return {"latent": latent, "dense_layers": dense, "dense_ffn": dense_ffn if dense else 0}
