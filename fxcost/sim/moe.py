"""Expert parallelism for mixture-of-experts layers (Megatron-LM, DeepSpeed-MoE; Rajbhandari et al. 2022).

With ``ep`` expert-parallel ranks, each MoE layer's experts are split over ``ep`` ranks of a
data-parallel group (``E / ep`` experts each). A rank routes its own tokens, sends each routed copy to
the rank holding its expert (the *dispatch* all-to-all), runs its experts on what it received, and
sends the results back (the *combine* all-to-all); the backward runs the two all-to-alls again on the
gradients. Each all-to-all moves the rank's routed rows, ``tokens * top_k`` of the model's width.

Which tokens go to which expert is data that meta tensors do not carry, so the routing is assumed:

- **balanced** (the default, what a load-balancing loss aims at): every rank receives as many routed
  rows as it sends, ``tokens * top_k``; its compute is the traced experts' (the lowering already
  spreads the rows evenly over the experts, :mod:`fxcost.lowering.experts`), its grouped GEMMs run
  ``E / ep`` experts on ``ep`` times the rows each.
- **a given load** (``Strategy.expert_load``, one fraction per expert): the rank whose experts get the
  largest share ``f`` receives ``f * ep`` times the balanced rows; it bounds the step (every rank waits
  for it in the combine), so its compute and all-to-all volume are priced.

``top_k`` is read from the graph: the rows entering the experts' first GEMMs over the tokens. Drop-less
routing (Megatron's default; Hugging Face's implementations) is assumed: no capacity padding.

Parameters under a module path with an ``experts`` component (``mlp.experts``,
``block_sparse_moe.experts.3``) are expert parameters: a rank holds ``1/ep`` of them, and their
gradients are reduced over the ``dp * cp / ep`` ranks holding the same experts (group ``"edp"``) while
the dense ones are reduced over all ``dp * cp`` (group ``"dp"``).

**With tensor parallelism** (Megatron-LM's expert tensor parallelism at the tensor-parallel degree,
its default before MoE parallel folding; sequence parallelism required, as Megatron-LM requires it),
every expert's MLP is split over the ``tp`` ranks like a dense one (:func:`fxcost.sim.shard.shard_node`),
so a rank holds ``1/(ep * tp)`` of the expert parameters. The MoE layer's input stays split along the
sequence: each rank routes its ``1/tp`` of the tokens, sends its routed rows to their experts' ranks
(an all-to-all over ``ep`` of ``1/tp`` of the rows), gathers the rows its ``tp`` group received (an
all-gather over ``tp``), runs its experts' shards on all of them, reduce-scatters the partial results
over ``tp`` and sends them back; the backward runs the same four on the gradients. The router (and a
shared expert's gate) and the layer's own routing nodes are no tensor-parallel block (priced on all
the micro-batch's tokens, where Megatron-LM routes each rank's part: a small overcount); a shared
expert beside the routed ones is a tensor-parallel block of its own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

from fxcost.lowering import recorded_bytes
from fxcost.lowering.experts import GROUPED_MM_OPS
from fxcost.lowering.nodes import MATMULS
from fxcost.records import NodeCost, Shape
from fxcost.sim.comm import Comm
from fxcost.sim.shard import shard_node
from fxcost.sim.strategy import Strategy

__all__ = ["ExpertPlan", "expert_plan", "expert_shards", "is_expert", "is_router"]

# A MoE layer's router (Mixtral, Qwen-MoE; GPT-OSS, DBRX), and Qwen2-MoE's gate of its shared expert.
_ROUTERS = frozenset({"gate", "router", "shared_expert_gate"})


def is_expert(module: str) -> bool:
    """Whether ``module`` is (inside) a mixture-of-experts layer's experts."""
    return "experts" in module.split(".")


def is_router(module: str) -> bool:
    """Whether ``module`` is (in) a mixture-of-experts layer's router (``mlp.gate``, DBRX's
    ``ffn.router.layer``) or a shared expert's gate."""
    return any(part in _ROUTERS for part in module.split("."))


def expert_shards(s: Strategy) -> int:
    """The ranks one expert parameter is split over with ``ep > 1``: the ``ep`` ranks, and the ``tp``
    ranks within each (expert tensor parallelism)."""
    return s.ep * s.tp


class ExpertPlan:
    """What one expert-parallel rank runs of a step's expert nodes, and its all-to-alls.

    Attributes:
        load: the busiest rank's routed rows over the balanced rows (1 when balanced).
        ms: kernel ms of distinct expert nodes re-priced for the rank (only those that change).
        nodes: those nodes as the rank runs them.
        a2a_bytes: the bytes one all-to-all moves for the busiest rank (its routed rows of the width).
        tp: the tensor-parallel ranks each expert is split over (1: none; ``tp`` with ``ep > 1``).
        blocks: the MoE layers' paths (the experts' parents) where ``tp > 1``.
    """

    def __init__(
        self,
        load: float,
        nodes: dict[int, NodeCost],
        a2a_bytes: float,
        tp: int = 1,
        blocks: frozenset[str] = frozenset(),
    ) -> None:
        self.load = load
        self.nodes = nodes
        self.ms: dict[int, float] = {}
        self.a2a_bytes = a2a_bytes
        self.tp = tp  # the tensor-parallel ranks splitting every expert (1: none)
        self.blocks = blocks  # the MoE layers' paths (the experts' parents), with tp > 1
        self._inside = False  # whether the last node seen was an expert's

    def price(self, kernel_ms: Callable[[list[NodeCost]], Sequence[float]]) -> None:
        """Price the rank's expert nodes with ``kernel_ms`` (kernel ms of a list of nodes)."""
        if self.nodes:
            self.ms = dict(zip(self.nodes, kernel_ms(list(self.nodes.values())), strict=True))

    def ms_of(self, d: int, module: str, kernel: Sequence[float]) -> float:
        """The kernel ms of distinct node ``d`` run by ``module``: the rank's, if it is an expert's."""
        return self.ms[d] if d in self.ms and is_expert(module) else kernel[d]

    def node_of(self, d: int, module: str, nodes: Sequence[NodeCost]) -> NodeCost:
        """Distinct node ``d`` as the rank runs it for ``module``."""
        return self.nodes[d] if d in self.nodes and is_expert(module) else nodes[d]

    def region(self, module: str, child: str | None) -> str | None:
        """The tensor-parallel block a node of ``module`` runs in, ``child`` of its layer as for a dense
        layer, but with experts split over ``tp``: none for the experts (their all-to-alls and ``tp``
        collectives are :meth:`crossing`'s) and the MoE layer's routing, its own block for any other
        child of the MoE layer (a shared expert)."""
        block = next((b for b in self.blocks if module == b or module.startswith(b + ".")), None)
        if block is None:
            return child
        rest = module[len(block) + 1 :].split(".", 1)[0]
        return None if not rest or rest in _ROUTERS or rest == "experts" else f"{block}.{rest}"

    def crossing(self, module: str) -> list[Comm]:
        """The all-to-all issued before a node of ``module`` runs (none, or one where the run enters or
        leaves the experts: the dispatch and the combine, or their gradients); "" ends a run."""
        inside = is_expert(module)
        if inside == self._inside:
            return []
        self._inside = inside
        if self.tp == 1:
            return [Comm("all_to_all", self.a2a_bytes, "ep", "feature")]
        a2a = Comm("all_to_all", self.a2a_bytes / self.tp, "ep", "feature")  # the rank's part of the sequence
        if inside:  # the rows its tp group received, gathered; leaving, the partial results scattered
            return [a2a, Comm("all_gather", self.a2a_bytes, "tp", "feature")]
        return [Comm("reduce_scatter", self.a2a_bytes, "tp", "feature"), a2a]


def expert_plan(
    nodes: Sequence[NodeCost],
    occurrences: Sequence[tuple[NodeCost, int]],
    s: Strategy,
    hidden: int,
    tokens: int,
    itemsize: int,
) -> ExpertPlan | None:
    """The rank's expert nodes and all-to-all volume for ``s`` (None without ``ep > 1``).

    ``nodes``: the distinct nodes; ``occurrences``: the forward's (node, distinct position) in order.

    Raises:
        ValueError: ``ep > 1`` but the step has no expert nodes, ``ep`` does not divide the experts,
            or ``expert_load`` does not give one fraction per expert.
    """
    if s.ep == 1 and s.expert_load is None:
        return None
    experts = _experts(nodes)
    if experts is None:
        raise ValueError(f"ep={s.ep} / expert_load given but the model has no mixture-of-experts layers "
                         "(modules named '...experts...')")  # fmt: skip
    if experts % s.ep:
        raise ValueError(f"ep={s.ep} does not divide the {experts} experts; accepted: a divisor of {experts}")
    load = 1.0
    if s.expert_load is not None:
        if len(s.expert_load) != experts:
            raise ValueError(
                f"expert_load has {len(s.expert_load)} fractions; the model has {experts} experts"
            )
        per_rank = experts // s.ep
        shares = [sum(s.expert_load[r * per_rank : (r + 1) * per_rank]) for r in range(s.ep)]
        load = max(shares) * s.ep
    rows = _routed_rows([(node.module, nodes[d]) for node, d in occurrences], hidden)
    tp = s.tp if s.ep > 1 else 1  # ep with tp: every expert split over tp too
    changed = {}
    for d, node in enumerate(nodes):
        if not is_expert(node.module):
            continue
        mine = _on_rank(node, s.ep, experts, load) if node.op in GROUPED_MM_OPS or load != 1.0 else node
        mine = (shard_node(mine, tp, hidden, tokens) or mine) if tp > 1 else mine
        if mine is not node:
            changed[d] = mine
    # The blocks are read off the forward's occurrences: a distinct node names one of the layers that
    # ran it, so the distinct nodes miss the middle MoE layers of a model traced whole.
    blocks = {_block_of(n.module) for n, _ in occurrences if is_expert(n.module)} if tp > 1 else set()
    a2a = rows * hidden * itemsize * load if rows else tokens * hidden * itemsize
    return ExpertPlan(load, changed, a2a, tp, frozenset(blocks))


def _block_of(module: str) -> str:
    """The MoE layer an expert's ``module`` belongs to: its path up to ``experts``."""
    parts = module.split(".")
    return ".".join(parts[: parts.index("experts")])


def _experts(nodes: Sequence[NodeCost]) -> int | None:
    """The experts of a layer: the leading dimension of the grouped GEMMs' weights, else the number of
    distinct ``experts.<name>`` children; None if no node is an expert's."""
    grouped = [n.in_shapes[1][0] for n in nodes if n.op in GROUPED_MM_OPS and len(n.in_shapes) > 1
               and len(n.in_shapes[1]) == 3]  # fmt: skip
    if grouped:
        return max(grouped)
    children = set()
    for n in nodes:
        parts = n.module.split(".")
        if "experts" in parts and parts.index("experts") + 1 < len(parts):
            children.add(parts[parts.index("experts") + 1])
    return len(children) or None


def _routed_rows(occurrences: Sequence[tuple[str, NodeCost]], hidden: int) -> int:
    """Rows entering the first MoE layer's experts: the rows of its forward GEMMs that contract the
    model's width (tokens times top-k)."""
    by_layer: dict[str, int] = defaultdict(int)
    for module, node in occurrences:  # the module that ran it, the node at the micro-batch's sizes
        if not is_expert(module) or node.op not in (*MATMULS, *GROUPED_MM_OPS) or "backward" in node.op:
            continue
        x = node.in_shapes[0] if node.op in GROUPED_MM_OPS else node.in_shapes[-2]
        if len(x) == 2 and x[-1] == hidden:
            layer = _block_of(module)
            by_layer[layer] += x[0]
    return next((rows for rows in by_layer.values() if rows), 0)


def _on_rank(node: NodeCost, ep: int, experts: int, load: float) -> NodeCost:
    """An expert node as the busiest rank runs it: grouped weights of ``experts / ep`` experts, and the
    routed rows (the leading dimension of the node's result) ``load`` times as many."""
    outs = node.out_shapes or node.in_shapes
    rows = node.in_shapes[0][0] if node.op in GROUPED_MM_OPS else (outs[0][0] if outs and outs[0] else -1)

    def shard(shape: Shape) -> Shape:
        if node.op in GROUPED_MM_OPS and len(shape) == 3 and shape[0] == experts:
            return (experts // ep, *shape[1:])
        if shape and shape[0] == rows and load != 1.0:
            return (math.ceil(shape[0] * load), *shape[1:])
        return shape

    in_shapes, out_shapes = [shard(x) for x in node.in_shapes], [shard(x) for x in node.out_shapes]
    return node.replace(in_shapes=in_shapes, out_shapes=out_shapes,
                        flops=None if node.flops is None else round(node.flops * load),
                        bytes_read=recorded_bytes(in_shapes, node.in_dtypes),
                        bytes_written=recorded_bytes(out_shapes, node.out_dtypes))  # fmt: skip
