"""Prediction pass: predicted ms per target GPU for every annotated node, by the prediction policy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch.fx

from fxcost.cost_models import ModelSpec
from fxcost.cost_models import predict as predict_nodes
from fxcost.gpus import Device
from fxcost.records import META_KEY

__all__ = ["run"]


def run(
    gm: torch.fx.GraphModule,
    devices: Sequence[str | Device],
    model: ModelSpec = "auto",
    origin: str | None = None,
    overrides: Mapping[str, ModelSpec] | None = None,
) -> torch.fx.GraphModule:
    """Fill ``pred_ms`` and ``pred_source`` of each node's record for every device in ``devices``.

    ``model`` is ``"auto"`` (the policy: runtime-based when the graph was measured on a GPU, else
    origin-free; see :mod:`fxcost.cost_models`), a model, or a comma-separated fallback chain;
    ``overrides`` gives single ops their own. ``origin`` names the GPU the graph was measured on
    (runtime-based models scale from it), ``"cpu"`` or None when there is none.
    """
    nodes = [n.meta[META_KEY] for n in gm.graph.nodes if META_KEY in n.meta]
    predict_nodes(nodes, devices, model, origin=origin, overrides=overrides)
    return gm
