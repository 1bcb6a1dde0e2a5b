"""Mixture-of-experts layers of Hugging Face models run under a stated routing, for meta tensors.

Some Hugging Face MoE layers (Switch Transformers, NLLB-MoE) loop over the experts a batch hits,
found with ``nonzero()`` of the router's mask: the graph's shapes are the token values' doing, and meta
tensors carry none, so such a model cannot be traced on them. :func:`route` gives each such layer of a
model built by fxcost a forward without data-dependent shapes: the router runs as before (its GEMM,
softmax, top-k and capacity mask stay in the graph), then each expert runs on a fixed set of rows,
gathered, weighted by the router's probabilities and added back as Hugging Face's loop does.

How many rows each expert gets is the :class:`Routing` assumption:

- **balanced** (the default, what a load-balancing loss aims at): ``tokens * top_k / E`` each;
- **a given load**: fraction ``f_e`` of the ``tokens * top_k`` routed rows to expert ``e``;

rounded to whole rows (largest remainders) and cut at the layer's expert capacity where it has one
(Switch: ``expert_capacity`` tokens per expert per sequence; NLLB-MoE: per expert over the batch, or
``moe_eval_capacity_token_fraction`` of it in inference), as the router's mask drops the rest.

Layers that already run routing-free on meta tensors (Mixtral, Qwen-MoE, DeepSeek, OLMoE...: their
experts are grouped GEMMs, priced as balanced by :mod:`fxcost.lowering.experts`) are left as they are.
Only models fxcost builds on the meta device are changed (:func:`fxcost.zoo.hf.hf_step`); a user's own
model is never touched.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ROUTED_LAYERS", "Routing", "route"]


@dataclass(frozen=True)
class Routing:
    """The share of routed rows each expert gets: ``load`` one fraction per expert, or None (balanced).

    Example:
        >>> Routing().rows(tokens=10, experts=4, top_k=1)
        [3, 3, 2, 2]
        >>> Routing((0.5, 0.25, 0.25, 0.0)).rows(tokens=16, experts=4, top_k=1, capacity=6)
        [6, 4, 4, 0]
    """

    load: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.load is None:
            return
        if not self.load or any(not math.isfinite(f) or f < 0 for f in self.load):
            raise ValueError(f"expert_load takes non-negative fractions, one per expert; got {self.load}")
        if abs(sum(self.load) - 1) > 1e-6:
            raise ValueError(
                f"expert_load takes fractions summing to 1; got {self.load} (sum {sum(self.load):g})"
            )

    def rows(self, tokens: int, experts: int, top_k: int, capacity: int | None = None) -> list[int]:
        """Rows each of ``experts`` experts runs when ``tokens`` tokens pick ``top_k`` each, at most
        ``capacity`` per expert (None: no limit).

        Raises:
            ValueError: the load gives another number of fractions than ``experts``.
        """
        if self.load is not None and len(self.load) != experts:
            raise ValueError(f"expert_load has {len(self.load)} fractions; the layer has {experts} experts")
        shares = self.load or (1 / experts,) * experts
        exact = [tokens * top_k * f for f in shares]
        rows = [math.floor(x) for x in exact]
        # Whole rows summing to the routed ones: the largest remainders (ties: the first) get one more.
        by_remainder = sorted(range(experts), key=lambda e: (rows[e] - exact[e], e))
        for e in by_remainder[: tokens * top_k - sum(rows)]:
            rows[e] += 1
        return rows if capacity is None else [min(r, capacity) for r in rows]

    def describe(self) -> str:
        """The assumption in words, for printouts."""
        if self.load is None:
            return "balanced (each expert gets tokens x top-k / experts rows)"
        return "expert load " + "/".join(f"{f:g}" for f in self.load)


def route(model: torch.nn.Module, routing: Routing) -> list[str]:
    """Give every MoE layer of ``model`` that routes through ``nonzero()`` (:data:`ROUTED_LAYERS`) a
    routing-free forward under ``routing``; returns what each kind of layer replaced assumes, in words.

    Raises:
        ValueError: ``routing.load`` does not give one fraction per expert of a layer.
    """
    notes: dict[str, str] = {}
    for module in model.modules():
        layer = ROUTED_LAYERS.get(type(module).__name__)
        if layer is None or type(module).__module__ == __name__:  # not one, or routed already
            continue
        experts = len(_experts(module))
        routing.rows(1, experts, 1)  # a wrong number of fractions fails here, not inside a trace
        cls: Any = type(module)  # (mypy takes a module class for unhashable)
        module.__class__ = _routed_class(cls, routing)
        name = type(module).__mro__[1].__name__
        notes[name] = f"{name}: {experts} experts, {layer[1](module)}"
    return list(notes.values())


@functools.cache
def _routed_class(cls: type, routing: Routing) -> type:
    """``cls`` with the routing-free forward under ``routing``: a subclass, so that the traced module
    paths stay those of Hugging Face's model (an instance's own ``forward`` would show in them)."""
    forward = ROUTED_LAYERS[cls.__name__][0]

    def routed(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return forward(self, routing, *args, **kwargs)

    return type(cls.__name__, (cls,), {"forward": routed, "__module__": __name__})


def _experts(layer: Any) -> list[torch.nn.Module]:
    """The experts of a layer, ``experts.expert_<i>`` (its ``experts`` may hold other modules too)."""
    return [layer.experts[f"expert_{e}"] for e in range(layer.experts.num_experts)]


def _run_experts(
    experts: Sequence[torch.nn.Module], x: torch.Tensor, rows: list[int], groups: int,
    combine: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:  # fmt: skip
    """Each expert on its ``rows[e]`` rows of each of ``groups`` equal groups of ``x``'s rows (its
    sequences, or the whole batch as one), its output ``y`` of rows ``index`` weighted by
    ``combine(e, index, y)`` and summed back in place."""
    size = x.shape[0] // groups
    out = torch.zeros_like(x)
    first = 0
    for e, (expert, n) in enumerate(zip(experts, rows, strict=True)):
        if n:  # an expert no token reaches does not run (Hugging Face loops over the experts hit)
            within = torch.arange(first, first + n, device=x.device) % size
            index = (torch.arange(groups, device=x.device)[:, None] * size + within).reshape(-1)
            y = combine(e, index, expert(x.index_select(0, index)))
            out = out.index_add(0, index, y.to(x.dtype))
        first += n
    return out


def _switch(self: Any, routing: Routing, hidden_states: torch.Tensor) -> torch.Tensor:
    """``SwitchTransformersSparseMLP`` (top-1, capacity per sequence) under ``routing``."""
    batch, seqlen, width = hidden_states.shape
    _, probs, _ = self.router(hidden_states)
    experts = _experts(self)
    rows = routing.rows(seqlen, len(experts), 1, self.router.expert_capacity)
    weights = probs.reshape(-1, 1)
    out = _run_experts(experts, hidden_states.reshape(-1, width), rows, batch,
                       lambda _, index, y: y * weights.index_select(0, index))  # fmt: skip
    return out.reshape(batch, seqlen, width)


def _nllb(self: Any, routing: Routing, hidden_states: torch.Tensor, padding_mask: Any = None) -> torch.Tensor:
    """``NllbMoeSparseMLP`` (top-2, capacity over all tokens) under ``routing``."""
    batch, seqlen, width = hidden_states.shape
    x = hidden_states.reshape(-1, width)
    _, probs, _ = self.router(x, padding_mask)  # sets the router's capacity for this many tokens
    experts = _experts(self)
    rows = routing.rows(x.shape[0], len(experts), 2, self.router.expert_capacity)
    dropout = self.experts.moe_token_dropout

    def combine(e: int, index: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y = y * probs[:, e : e + 1].index_select(0, index)
        if dropout > 0:  # Hugging Face drops expert outputs in training, scales them in inference
            return self.experts.token_dropout(y) if self.training else y * (1 - dropout)
        return y

    return _run_experts(experts, x, rows, 1, combine).reshape(batch, seqlen, width)


ROUTED_LAYERS: dict[str, tuple[Callable[..., torch.Tensor], Callable[[Any], str]]] = {
    "SwitchTransformersSparseMLP": (
        _switch,
        lambda m: f"top-1, capacity {m.router.expert_capacity} per sequence",
    ),
    "NllbMoeSparseMLP": (_nllb, lambda m: "top-2, capacity per expert over the batch as its router sets it"),
}
"""Hugging Face MoE layers (by class name: their classes exist only once ``transformers`` is imported)
whose routing needs token values, with their routing-free forward and what it assumes beyond the load."""
