"""A captured step's model dimensions, read from its nodes: the width, the tokens of a micro-batch and
the vocabulary."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from fxcost.records import NodeCost

__all__ = ["vocabulary", "width_and_tokens"]


def width_and_tokens(nodes: Sequence[NodeCost]) -> tuple[int, int]:
    """The model width (the last dimension layer norms normalize most often) and the tokens of a
    micro-batch (their rows)."""
    widths: Counter[tuple[int, int]] = Counter()
    for n in nodes:
        if n.op == "aten.native_layer_norm.default" and n.in_shapes:
            x = n.in_shapes[0]
            if x:
                widths[(x[-1], math.prod(x) // max(x[-1], 1))] += 1
    if not widths:  # no layer norm (RMSNorm models): the embeddings' output, tokens of the width
        widths.update((x[-1], math.prod(x[:-1])) for n in nodes if n.op == "aten.embedding.default"
                      for x in n.out_shapes[:1] if len(x) >= 2)  # fmt: skip
    if not widths:
        return 1, 1
    (hidden, tokens), _ = widths.most_common(1)[0]
    return hidden, tokens


def vocabulary(nodes: Sequence[NodeCost]) -> int | None:
    """The vocabulary: rows of the widest embedding table looked up."""
    tables = [
        n.in_shapes[0][0]
        for n in nodes
        if n.op == "aten.embedding.default" and n.in_shapes and n.in_shapes[0]
    ]
    return max(tables, default=None)
