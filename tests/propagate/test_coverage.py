"""Coverage counts only nodes a model of their op priced: the roofline fallback is no such model."""

from __future__ import annotations

import torch

import fxcost
from fxcost.propagate import coverage
from fxcost.records import NodeCost


def _node(name: str, source: str | None, has_kernel: bool = True) -> NodeCost:
    node = NodeCost(name=name, op="aten.relu.default", phase="fw", has_kernel=has_kernel)
    if source is not None:
        node.pred_ms["T4"] = None if source == "unsupported" else 0.01
        node.pred_source["T4"] = source
    return node


def test_roofline_and_unpredicted_nodes_count_as_fallbacks() -> None:
    nodes = [_node("a", "mlp"), _node("b", "roofline"), _node("c", "unsupported"), _node("d", "wave_scaling"),
             _node("view", "mlp", has_kernel=False), _node("e", None)]  # fmt: skip
    assert coverage(nodes, "T4") == 2 / 5  # mlp and wave_scaling of the five kernel nodes
    assert coverage([_node("view", None, has_kernel=False)], "T4") == 1.0


def test_a_report_priced_by_the_roofline_alone_is_not_covered() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU())
    inputs = (torch.randn(4, 16),)
    learned = fxcost.profile(model, inputs, devices=["T4"], measure=False)
    assert learned.coverage("T4") == 1.0
    bound = fxcost.profile(model, inputs, devices=["T4"], measure=False, cost_model="roofline")
    assert all(n.pred_ms["T4"] is not None for n in bound.nodes)
    assert bound.coverage("T4") == 0.0
