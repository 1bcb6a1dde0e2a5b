"""The mixture-of-experts families a decoder is traced as (:data:`MOE_FAMILIES`), and multi-head latent
attention's dimensions (:class:`Latent`)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["MOE_FAMILIES", "Latent", "MoeFamily"]


class MoeFamily(NamedTuple):
    """A Hugging Face family a mixture of experts is traced as."""

    architecture: str
    experts_key: str  # the config's key for the experts per layer
    width_key: str  # and for each expert's width
    top_k: int  # experts per token where the config does not say (the family's default)
    shared_key: str  # the config's key for its shared expert ("": it runs none)
    shared_default: int  # that key's value where the config does not say
    shared_gate: bool  # a one-column sigmoid gate scales the shared expert's output (Qwen2-MoE's)
    settings: dict[str, Any]  # what else makes every layer's MLP a mixture
    # Multi-head latent attention and dense layers before the sparse ones (DeepSeek's): the config's
    # defaults for their keys (Hugging Face's, where a config omits one); None: the family runs neither.
    latent_defaults: dict[str, int] | None = None

    @property
    def counts_experts(self) -> bool:
        """Whether ``shared_key`` counts experts ``ffn`` wide, run as one MLP (DeepSeek's
        ``n_shared_experts``), rather than giving the shared expert's width."""
        return self.shared_key == "n_shared_experts"


_EVERY_LAYER = {"decoder_sparse_step": 1, "mlp_only_layers": []}
_DEEPSEEK = {"moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True}
_LATENT = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128}  # fmt: skip
# fmt: off
MOE_FAMILIES: dict[str, MoeFamily] = {
    "mixtral": MoeFamily("MixtralForCausalLM", "num_local_experts", "intermediate_size", 2, "", 0, False, {}),
    "qwen3_moe": MoeFamily("Qwen3MoeForCausalLM", "num_experts", "moe_intermediate_size", 8, "", 0, False,
                           {**_EVERY_LAYER, "norm_topk_prob": True}),
    "olmoe": MoeFamily("OlmoeForCausalLM", "num_experts", "intermediate_size", 8, "", 0, False, {}),
    "qwen2_moe": MoeFamily("Qwen2MoeForCausalLM", "num_experts", "moe_intermediate_size", 4,
                           "shared_expert_intermediate_size", 5632, True,
                           {**_EVERY_LAYER, "norm_topk_prob": False}),
    "deepseek_v2": MoeFamily("DeepseekV2ForCausalLM", "n_routed_experts", "moe_intermediate_size", 6,
                             "n_shared_experts", 2, False,
                             {**_DEEPSEEK, "topk_method": "greedy", "norm_topk_prob": False},
                             {**_LATENT, "first_k_dense_replace": 0}),
    "deepseek_v3": MoeFamily("DeepseekV3ForCausalLM", "n_routed_experts", "moe_intermediate_size", 8,
                             "n_shared_experts", 1, False, _DEEPSEEK,
                             {**_LATENT, "first_k_dense_replace": 3}),
}
# fmt: on
"""The families a mixture of experts is traced as, by ``model_type``, with Hugging Face's defaults
(DeepSeek-V2's experts per token where its config, whose default is none, says none: 6, V2's own).
DeepSeek's are traced with one group of experts (``n_group = topk_group = 1``): group-limited routing
picks among fewer experts, which changes which experts a token runs, not how many, so the FLOPs hold;
but DeepSeek-V3 also limits a token to 4 nodes and sends it once per node, so an expert-parallel
all-to-all that crosses nodes moves fewer bytes than the ``top_k`` copies per token priced."""


class Latent(NamedTuple):
    """Multi-head latent attention (DeepSeek-V2, §2.1 of its report; DeepSeek-V3): the queries through a
    ``q_rank``-wide bottleneck (None: one projection), the keys and values up-projected from one
    ``kv_rank``-wide latent; each head's queries and keys ``nope + rope`` wide (the ``rope`` columns of
    the keys one rotary key every head shares, projected beside the latent), its values ``v`` wide."""

    q_rank: int | None
    kv_rank: int
    nope: int
    rope: int
    v: int

    def params(self, hidden: int, heads: int) -> int:
        """The attention's matmul parameters: down- and up-projections and the output projection."""
        qk = self.nope + self.rope
        queries = hidden * heads * qk if self.q_rank is None else self.q_rank * (hidden + heads * qk)
        keys_values = hidden * (self.kv_rank + self.rope) + self.kv_rank * heads * (self.nope + self.v)
        return queries + keys_values + heads * self.v * hidden
