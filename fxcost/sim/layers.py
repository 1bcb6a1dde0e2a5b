"""Which layer and which of its children a module belongs to, read from module paths.

The repeated layers of a model are the modules ``<prefix>.<int>`` under the most common prefix
(:func:`layers_of`); a node belongs to the layer its module is in (:func:`layer_of`), and inside it to
one child (``attn``, ``mlp``: :func:`region_of`), tensor-parallel unless it is a norm
(:func:`in_tp_region`).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Collection, Sequence

__all__ = ["any_layer", "in_tp_region", "layer_of", "layers_of", "region_of"]

_LAYER = re.compile(r"^(.*?\.?\d+)(?:\.|$)")  # the first path prefix that ends in an index
_NORM = re.compile(r"(^|\.)(ln(_\w+)?|\w*norm\w*)$", re.IGNORECASE)  # ln_1, layernorm, norm


def layers_of(modules: Sequence[str]) -> list[str]:
    """The model's repeated layers, in order: module paths ``<prefix>.<int>`` under the most common
    prefix (``transformer.h.0``, ``blocks.11``, ``model.layers.3``)."""
    prefixes: Counter[str] = Counter()
    found: dict[str, set[int]] = {}
    for module in modules:
        m = _LAYER.match(module)
        if m is None:
            continue
        layer = m.group(1)
        prefix, _, index = layer.rpartition(".")
        if index.isdigit():
            found.setdefault(prefix, set()).add(int(index))
            prefixes[prefix] += 1
    if not found:
        return []
    prefix = max(found, key=lambda p: (len(found[p]), prefixes[p]))
    return [f"{prefix}.{i}" if prefix else str(i) for i in sorted(found[prefix])]


def layer_of(module: str, layers: Collection[str]) -> str:
    """The layer ``module`` is or belongs to (the shortest of its path prefixes in ``layers``), or ""."""
    end = module.find(".")
    while end != -1:
        if module[:end] in layers:
            return module[:end]
        end = module.find(".", end + 1)
    return module if module in layers else ""


def region_of(module: str, layer: str) -> str:
    """The child of ``layer`` a module belongs to (``attn``, ``mlp``)."""
    rest = module[len(layer) + 1 :]
    return rest.split(".", 1)[0]


@functools.lru_cache(maxsize=65536)
def in_tp_region(module: str, layer: str) -> bool:
    """Whether a node of ``layer`` runs in a tensor-parallel child (attention, MLP): not the layer's
    own residual nodes, not its norms. A norm inside a child (Qwen3's and OLMoE's on the queries and
    keys) is the child's: split with the heads where its tensors are (:func:`~fxcost.sim.shard.shard_node`
    keeps a tensor as wide as the model whole)."""
    if module == layer:
        return False
    return not _NORM.search(region_of(module, layer))


def any_layer(module: str) -> str:
    """``module``'s path with its indices wildcarded (``model.layers.#.self_attn``): a distinct node of a
    step names one of the layers that ran it, so what holds for a layer's module holds for its twins'."""
    return ".".join("#" if part.isdigit() else part for part in module.split("."))
