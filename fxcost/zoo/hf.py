"""Hugging Face models from config files, built on the meta device so that any size fits in memory.

``hf_step(config, batch, seqlen)`` builds the model a ``config.json`` describes (its ``architectures``
entry names the class) with random weights, eager attention (or the config's ``attn_implementation``,
``"sdpa"`` for one fused kernel) and no KV cache, and returns the step to
capture: ``input_ids`` of ones, and for training the cross-entropy of the logits against those ids.
Parameters and activations are meta tensors: shapes and dtypes without storage, so capturing a
13-billion-parameter model costs the time of tracing it, not its memory. Nothing runs, so nodes can
be predicted (``measure=False``) but not measured.

Which expert a token goes to is data meta tensors do not carry, so a mixture-of-experts model runs
under a stated routing (``expert_load``: balanced by default; see :mod:`fxcost.zoo.routing`), which
``HFStep.routing`` says in words for printouts.

Requires ``transformers`` (``pip install fxcost[hf]``).

Example:
    >>> step = hf_step("gpt2_large.json", batch=4, seqlen=1024)  # doctest: +SKIP
    >>> report = fxcost.profile(  # doctest: +SKIP
    ...     step.model, step.inputs, train=step.train, loss_fn=step.loss_fn, measure=False
    ... )
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fxcost.zoo.routing import ROUTED_LAYERS, Routing, route

__all__ = ["HFStep", "hf_step"]


@dataclass(frozen=True)
class HFStep:
    """A model on the meta device, its keyword inputs and the loss of a training step; ``routing``:
    the routing its mixture-of-experts layers assume, in words ("" for a model without experts)."""

    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    train: bool
    routing: str = ""

    @staticmethod
    def loss_fn(output: Any) -> torch.Tensor:
        """Cross-entropy of the logits against token ids (zeros: the cost does not depend on which
        ids; taken from the logits' shape, so the step can be traced again at another batch). A
        static method: it reads nothing of the step, and the Estimator keys a bound method by its
        object, which is new for each ``hf_step`` call.

        Written as log-softmax and gather, the kernels ``F.cross_entropy`` runs (log-softmax, then a
        gather-like ``nll_loss``): on the meta device ``nll_loss`` has no autograd formula, and the
        backward graph would come out empty.
        """
        logits = output.logits
        targets = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
        logp = F.log_softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
        return -logp.gather(1, targets.reshape(-1, 1)).mean()


def hf_step(
    config: str | Path | dict[str, Any], batch: int, seqlen: int, train: bool = True,
    expert_load: Sequence[float] | None = None,
) -> HFStep:  # fmt: skip
    """The model of ``config`` (a path to a Hugging Face ``config.json`` or its dict) and a step on
    ``batch`` sequences of ``seqlen`` tokens, on the meta device.

    ``expert_load``: the share of routed tokens each expert of a mixture-of-experts layer gets, one
    fraction per expert (None: balanced). Only layers that route through data-dependent shapes
    (:data:`fxcost.zoo.routing.ROUTED_LAYERS`) take it; grouped-GEMM experts (Mixtral...) are priced
    balanced, and an uneven load over expert-parallel ranks is ``Strategy.expert_load``.

    Equal configs share one model object (built once; 0.1-3 s each), so a search over batch sizes or
    parallel plans does not rebuild it and the Estimator finds its trace at once. Treat it as read-only.
    """
    raw = json.loads(Path(config).read_text()) if isinstance(config, (str, Path)) else dict(config)
    if batch < 1 or seqlen < 1:
        raise ValueError(f"batch and seqlen must be positive, got batch={batch}, seqlen={seqlen}")
    load = None if expert_load is None else tuple(float(f) for f in expert_load)
    model, encoder_decoder, routing = _meta_model(json.dumps(raw, sort_keys=True), train, load)
    ids = torch.ones(batch, seqlen, dtype=torch.long, device="meta")
    inputs = {"input_ids": ids}
    if encoder_decoder:
        inputs["decoder_input_ids"] = ids
    if raw.get("model_type") in _MASK_GIVEN:
        inputs["attention_mask"] = torch.ones_like(ids)
    return HFStep(model, inputs, train, routing)


# Models whose encoder makes its all-ones attention mask only outside torch.compile (and indexes None
# inside it, so Dynamo would give up on the encoder): the same mask is given.
_MASK_GIVEN = frozenset({"switch_transformers"})


_ATTENTION = "attn_implementation"  # a config key naming the attention kernel: "eager" or "sdpa"


@functools.lru_cache(maxsize=8)
def _meta_model(
    config_json: str, train: bool, expert_load: tuple[float, ...] | None
) -> tuple[torch.nn.Module, bool, str]:
    """(the model of a config given as canonical JSON, whether it is an encoder-decoder, the routing
    its MoE layers assume in words)."""
    import transformers

    raw = json.loads(config_json)
    try:
        model_type, architecture = raw["model_type"], raw["architectures"][0]
    except (KeyError, IndexError) as e:
        raise ValueError(f"a Hugging Face config needs 'model_type' and 'architectures'; missing {e}") from e
    cls = getattr(transformers, architecture, None)
    if cls is None:
        raise ValueError(f"transformers {transformers.__version__} has no model class {architecture!r}")
    settings = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", _ATTENTION)}
    hf_config = transformers.AutoConfig.for_model(model_type, **settings)
    hf_config.use_cache = False  # a training or single-pass step: no KV cache to build
    # "eager" by default, as the shared data measured it: the attention as separate matmuls and softmax
    attention = raw.get(_ATTENTION, "eager")
    if attention not in ("eager", "sdpa"):
        raise ValueError(f"unknown {_ATTENTION} {attention!r}; accepted: eager, sdpa")
    hf_config._attn_implementation = _fused_attention_name() if attention == "sdpa" else attention
    with torch.device("meta"):
        model = cls(hf_config)
    model.train(train)
    return model, bool(hf_config.is_encoder_decoder), _routed(model, architecture, Routing(expert_load))


def _routed(model: torch.nn.Module, architecture: str, routing: Routing) -> str:
    """Run ``model``'s MoE layers under ``routing``; what that assumes, in words ("" without experts)."""
    replaced = route(model, routing)
    if replaced:
        return f"{routing.describe()}; " + "; ".join(replaced)
    if routing.load is not None:
        raise ValueError(
            f"expert_load applies to the MoE layers {', '.join(ROUTED_LAYERS)}; {architecture} has none "
            "(grouped-GEMM experts are priced balanced: give an uneven load to Strategy(expert_load=...))"
        )
    if any("experts" in name.split(".") for name, _ in model.named_modules()):
        return "balanced (grouped GEMMs' rows spread evenly over the experts)"
    return ""


_FUSED = "fxcost_fused"


def _fused_attention_name() -> str:
    """The name of :func:`_fused_attention` among Hugging Face's attention functions, registered once.

    PyTorch's ``scaled_dot_product_attention`` chooses its math path (matmuls, softmax, dropout, each
    a node) for meta tensors, whatever a GPU would run, so a model built here with ``"sdpa"`` calls the
    fused kernel's op itself."""
    from transformers import AttentionInterface

    AttentionInterface.register(_FUSED, _fused_attention)
    return _FUSED


def _fused_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention as one fused kernel (FlashAttention's op, forward and backward), in Hugging Face's
    attention-function form: ``[batch, heads, tokens, head dim]`` in, ``[batch, tokens, heads, head
    dim]`` out. A decoder's mask is the causal one (``is_causal``; an encoder's none), as a training step
    on unpadded sequences runs it: the ``attention_mask`` of all-ones inputs adds nothing. Grouped-query
    keys and values are repeated to the queries' heads. Values narrower than the queries (DeepSeek's
    multi-head latent attention: 192-wide queries and keys, 128-wide values) call the op PyTorch leaves
    to a device's own kernel, which takes them, the target's choice priced as for the CPU kernel's."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
    if value.shape[-1] == query.shape[-1]:
        fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    elif hasattr(torch.ops.aten, "_scaled_dot_product_fused_attention_overrideable"):
        fused = torch.ops.aten._scaled_dot_product_fused_attention_overrideable  # values of their own width
    else:
        raise ValueError(
            f"attention with values {value.shape[-1]} wide and queries {query.shape[-1]} (latent attention) "
            f"is traced through aten._scaled_dot_product_fused_attention_overrideable, which torch "
            f"{torch.__version__} lacks; accepted: a torch that has it"
        )
    out = fused(query, key, value, dropout_p=dropout, is_causal=causal, scale=scaling)[0]
    return out.transpose(1, 2).contiguous(), None
