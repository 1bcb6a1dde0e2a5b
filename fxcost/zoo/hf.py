"""Hugging Face models from config files, built on the meta device so that any size fits in memory.

``hf_step(config, batch, seqlen)`` builds the model a ``config.json`` describes (its ``architectures``
entry names the class) with random weights, eager attention (or the config's ``attn_implementation``,
``"sdpa"`` for one fused kernel) and no KV cache, and returns the step to
capture: ``input_ids`` of ones, and for training the cross-entropy of the logits against those ids.
Parameters and activations are meta tensors: shapes and dtypes without storage, so capturing a
13-billion-parameter model costs the time of tracing it, not its memory. Nothing runs, so nodes can
be predicted (``measure=False``) but not measured.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["HFStep", "hf_step"]


@dataclass(frozen=True)
class HFStep:
    """A model on the meta device, its keyword inputs and the loss of a training step."""

    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    train: bool

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


def hf_step(config: str | Path | dict[str, Any], batch: int, seqlen: int, train: bool = True) -> HFStep:
    """The model of ``config`` (a path to a Hugging Face ``config.json`` or its dict) and a step on
    ``batch`` sequences of ``seqlen`` tokens, on the meta device.

    Equal configs share one model object (built once; 0.1-3 s each), so a search over batch sizes or
    parallel plans does not rebuild it and the Estimator finds its trace at once. Treat it as read-only.
    """
    raw = json.loads(Path(config).read_text()) if isinstance(config, (str, Path)) else dict(config)
    if batch < 1 or seqlen < 1:
        raise ValueError(f"batch and seqlen must be positive, got batch={batch}, seqlen={seqlen}")
    model, encoder_decoder = _meta_model(json.dumps(raw, sort_keys=True), train)
    ids = torch.ones(batch, seqlen, dtype=torch.long, device="meta")
    inputs = {"input_ids": ids}
    if encoder_decoder:
        inputs["decoder_input_ids"] = ids
    return HFStep(model, inputs, train)


_ATTENTION = "attn_implementation"  # a config key naming the attention kernel: "eager" or "sdpa"


@functools.lru_cache(maxsize=8)
def _meta_model(config_json: str, train: bool) -> tuple[torch.nn.Module, bool]:
    """(the model of a config given as canonical JSON, whether it is an encoder-decoder)."""
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
    hf_config._attn_implementation = attention
    with torch.device("meta"):
        model = cls(hf_config)
    model.train(train)
    return model, bool(hf_config.is_encoder_decoder)
