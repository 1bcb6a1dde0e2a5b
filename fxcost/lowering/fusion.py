"""Inductor's fusion applied to captured ATen graphs: which nodes one compiled kernel runs.

``torch.compile``'s default backend, Inductor, turns a graph's pointwise ops and reductions into
generated Triton kernels that each do the work of several ATen ops in one pass over memory, and calls
libraries (cuBLAS, cuDNN, FlashAttention) for the rest. :func:`fuse` groups the node records of a
step the way its scheduler does, a pure function of the records, so it works on saved traces too:

- views, reshapes, permutes, expands and tuple access launch nothing (as in eager);
- attention written out op by op (``bmm``, scale, mask, ``softmax``, ``bmm``) becomes one fused
  attention kernel in a forward-only step, as Inductor's attention rewrite makes it
  (:mod:`fxcost.lowering.fusion_attention`);
- GEMMs, convolutions, attention, RNNs and other library calls are *extern* kernels, never fused
  (under ``mode="max-autotune"`` Inductor may fuse a pointwise epilogue into a Triton GEMM
  template: not modelled, the epilogue stays a kernel of its own);
- a pointwise op fuses with its pointwise producers and consumers over the same number of elements,
  and with siblings that read the same tensor;
- a reduction fuses with a pointwise prologue over its input and a pointwise epilogue over its
  input or its output (softmax, a residual add with the layer norm after it, bias-gradient sums
  with the pointwise backward they read); two reductions share a kernel only over the same ranges;
- a batch norm over many elements per channel is a split reduction (:meth:`FusedKernel.splits`):
  partial and final reductions, then the normalizing pointwise pass, which reads their inputs again;
- random ops (dropout) are pointwise: Inductor draws the numbers inside the fused kernel;
  in-place ops (``add_``, ``copy_``) are pointwise ops writing their input;
- a kernel reads each tensor it takes from outside once (a tensor two members read from one
  producer once) and writes each result used outside it (or by nothing in the graph: an output)
  once; an embedding or gather reads the rows it gathers, not the whole table;
- no kernel holds more than :data:`MAX_FUSION_SIZE` nodes (Inductor's ``max_fusion_size``); a merge
  that would make a kernel depend on itself through an outside kernel is refused (views between
  members are no such kernel: the loops read through them).

Other kernel-launching ops (scans, sorts, scatters, losses, foreach optimizer ops) run as one kernel
each, at their eager cost. Whether Inductor runs a conv net's activations channels-last is decided
apart (:mod:`fxcost.lowering.fusion_layout`): it changes kernel times, not the grouping.

Not modelled: Inductor's own decompositions (a ``native_layer_norm_backward``'s weight gradient is
a second, column-wise reduction in Inductor, here part of the row reduction's kernel), split
reductions other than batch norms' (a column sum to few outputs is split over two kernels too;
a row reduction to fewer rows than twice the SMs), loop reordering and tiling choices,
combo kernels of foreach ops and CUDA-graph trees. In a training step, which activations the
forward writes for the backward and which the backward recomputes follow Inductor's partitioner
as far as the records tell (:mod:`fxcost.lowering.fusion_saved`); a GEMM with an unaligned
dimension runs padded where Inductor pads it (:mod:`fxcost.lowering.fusion_padding`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from fxcost.lowering.fusion_attention import attention_chains, attention_node
from fxcost.lowering.fusion_rules import GATHERS, launches_of, merged_ranges, node_ranges, split_reduction
from fxcost.lowering.fusion_saved import rematerialize
from fxcost.lowering.traffic import recorded_bytes
from fxcost.precision import itemsize
from fxcost.records import NodeCost

__all__ = ["MAX_FUSION_SIZE", "FusedKernel", "KernelKind", "fuse", "reduces"]

MAX_FUSION_SIZE = 64  # torch._inductor.config.max_fusion_size

KernelKind = Literal["pointwise", "reduction", "attention", "extern"]

# How a member reads one of its input tensors: from DRAM, from inside the kernel (free), gathered
# (an embedding table or indexed source: as many bytes as the rows it writes), or recomputed (a
# saved activation the forward did not write: the kernel reads what it is recomputed from instead).
_DRAM, _INSIDE, _GATHERED, _RECOMPUTED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class FusedKernel:
    """One kernel of a compiled step: the nodes it runs and what it moves through memory.

    Attributes:
        kind: ``"pointwise"`` or ``"reduction"`` (a generated kernel), ``"attention"`` (attention
            written out op by op, run as one fused attention kernel: :meth:`stands_for`), ``"extern"``
            (a library call or an op run alone, priced as in eager).
        members: positions of its nodes in the node list given to :func:`fuse`, in program order.
        reads: per member, per input tensor: 0 read from DRAM, 1 produced inside the kernel, 2
            gathered (as many bytes as the member writes), 3 recomputed (see ``recomputes``).
        writes: per member, per output: whether it is written to DRAM (used outside the kernel).
        recomputes: in a training step's backward, the forward inputs (node position, input index)
            the kernel reads to recompute saved activations the forward did not write
            (:mod:`fxcost.lowering.fusion_saved`).

    A reduction kernel whose members Inductor splits (:meth:`splits`) launches a partial and a final
    reduction for each and one pointwise pass, which reads again what the members up to them read.
    """

    kind: KernelKind
    members: tuple[int, ...]
    reads: tuple[tuple[int, ...], ...]
    writes: tuple[tuple[bool, ...], ...]
    recomputes: tuple[tuple[int, int], ...] = ()

    def splits(self, nodes: Sequence[NodeCost]) -> list[int]:
        """The members (their indices in ``members``) whose reductions Inductor splits at the sizes of
        ``nodes`` (:func:`~fxcost.lowering.fusion_rules.split_reduction`)."""
        if self.kind != "reduction":
            return []
        return [k for k, m in enumerate(self.members) if split_reduction(nodes[m])]

    def launches(self, nodes: Sequence[NodeCost]) -> int:
        """The kernels it launches at the sizes of ``nodes`` (:func:`launches_of` its splits)."""
        return launches_of(len(self.splits(nodes)))

    def nodes(self, nodes: Sequence[NodeCost]) -> list[NodeCost]:
        """Its member records among ``nodes`` (the list it was fused from, or that list re-sized)."""
        return [nodes[i] for i in self.members]

    def bytes_read(self, nodes: Sequence[NodeCost]) -> int:
        """DRAM bytes the kernel reads, from ``nodes`` at their sizes (an extern kernel: its node's)."""
        if self.kind == "attention":
            return self.stands_for(nodes).bytes_read or 0
        if self.kind == "extern":
            return sum(nodes[i].bytes_read or 0 for i in self.members)
        total = self._member_reads(nodes, len(self.members))
        for i, k in self.recomputes:
            total += _bytes(nodes[i].in_shapes[k], nodes[i].in_dtypes[k])
        splits = self.splits(nodes)
        if splits:  # the pointwise pass after the split reductions reads again what they read
            total += self._member_reads(nodes, splits[-1] + 1)
        return total

    def _member_reads(self, nodes: Sequence[NodeCost], first: int) -> int:
        """DRAM bytes the ``first`` members read (in program order)."""
        total = 0
        for i, reads in zip(self.members[:first], self.reads[:first], strict=True):
            node = nodes[i]
            written = recorded_bytes(node.out_shapes, node.out_dtypes)
            for shape, dtype, how in zip(node.in_shapes, node.in_dtypes, reads, strict=True):
                total += _bytes(shape, dtype) if how == _DRAM else written if how == _GATHERED else 0
        return total

    def bytes_written(self, nodes: Sequence[NodeCost]) -> int:
        """DRAM bytes the kernel writes."""
        if self.kind == "attention":
            return self.stands_for(nodes).bytes_written or 0
        if self.kind == "extern":
            return sum(nodes[i].bytes_written or 0 for i in self.members)
        total = 0
        for i, writes in zip(self.members, self.writes, strict=True):
            node = nodes[i]
            if not node.out_shapes and writes:  # an in-place op: it writes what it read first
                total += _bytes(node.in_shapes[0], node.in_dtypes[0]) if node.in_shapes else 0
            for shape, dtype, out in zip(node.out_shapes, node.out_dtypes, writes, strict=False):
                total += _bytes(shape, dtype) if out else 0
        return total

    def stands_for(self, nodes: Sequence[NodeCost]) -> NodeCost:
        """The fused attention node an ``"attention"`` kernel runs, at the sizes of ``nodes``."""
        if self.kind != "attention":
            raise ValueError(f"a {self.kind} kernel stands for no attention node")
        return attention_node(nodes[self.members[0]], nodes[self.members[-1]])

    def flops(self, nodes: Sequence[NodeCost]) -> int:
        """The members' FLOPs added up (unknown counts as none)."""
        return sum(nodes[i].flops or 0 for i in self.members)


def fuse(nodes: Sequence[NodeCost]) -> list[FusedKernel]:
    """The kernels a compiled step runs for ``nodes`` (records of one or more graphs, in program
    order), in the order they run. Nodes that launch no kernel belong to none. See the module
    docstring for the rules."""
    return _Fuser(nodes).run()


def reduces(node: NodeCost) -> bool:
    """Whether Inductor runs ``node`` as a reduction (a sum, a norm, a softmax)."""
    return node_ranges(node)[1]


# -- grouping ---------------------------------------------------------------------------------------


_EXTERN, _ATTENTION = (0, 0), (0, 1)  # the ranges that mark kernels no other node joins
_ALONE = (_EXTERN, _ATTENTION)


@dataclass
class _Group:
    members: list[int]
    ranges: tuple[int, int]  # (elements, reduced elements per element): (N, 1) for pointwise
    reduction: bool


class _Fuser:
    def __init__(self, nodes: Sequence[NodeCost]) -> None:
        self.nodes = nodes
        self.position: dict[tuple[int, str], int] = {(n.graph, n.name): i for i, n in enumerate(nodes)}
        self.users: list[list[int]] = [[] for _ in nodes]
        for i in range(len(nodes)):
            for j in self._inputs(i):
                self.users[j].append(i)
        self.group_of: dict[int, _Group] = {}
        self.order: list[_Group] = []
        # A generated kernel's member -> the kernel node each of its inputs comes from (None: from
        # outside the graph, a saved activation in a backward).
        self.producers: dict[int, list[int | None]] = {}

    def _inputs(self, i: int) -> list[int]:
        node = self.nodes[i]
        found = (self.position.get((node.graph, name)) for name in node.inputs)
        return [j for j in found if j is not None and j < i]

    def root(self, i: int) -> int | None:
        """The kernel node whose result node ``i`` is or looks at (through views and tuple access)."""
        seen = 0
        while not self.nodes[i].has_kernel:
            inputs = self._inputs(i)
            if len(inputs) != 1 or seen > len(self.nodes):
                return None
            i, seen = inputs[0], seen + 1
        return i

    def run(self) -> list[FusedKernel]:
        kernels: list[_Group] = []
        attention: dict[int, _Group] = {}  # chain members -> the chain's kernel
        for chain in attention_chains(self.nodes, self.users):
            group = _Group(chain, _ATTENTION, False)
            attention.update((m, group) for m in chain)
        for i, node in enumerate(self.nodes):
            if not node.has_kernel:
                continue
            if i in attention:  # a chain is one kernel, where its values' bmm sits
                self.group_of[i] = attention[i]
                if i == attention[i].members[-1]:
                    kernels.append(attention[i])
                continue
            ranges, reduction = node_ranges(node)
            if ranges is None:
                group = _Group([i], _EXTERN, False)
                kernels.append(group)
                self.group_of[i] = group
                continue
            joined = self._join(i, ranges, reduction)
            if joined is None:
                joined = _Group([i], ranges, reduction)
                kernels.append(joined)
            self.group_of[i] = joined
        # A group merged into another is emptied. A kernel runs once the inputs of all its members
        # from outside are ready: after the last of them, and no earlier than its first member.
        live = [g for g in kernels if g.members]
        live.sort(key=self._runs_after)
        fused = [self._kernel(g) for g in live]
        if any(n.phase == "bw" for n in self.nodes):
            fused = self._rematerialized(fused)
        return fused

    def _rematerialized(self, kernels: list[FusedKernel]) -> list[FusedKernel]:
        """A training step's kernels with Inductor's choice of saved activations
        (:mod:`fxcost.lowering.fusion_saved`)."""
        plan = rematerialize(self.nodes, kernels, self.producers, self.users)
        out = []
        for k, kernel in enumerate(kernels):
            if k in plan.dead:
                continue
            if kernel.kind in ("pointwise", "reduction"):
                slots, sources = plan.recomputed.get(k, (set(), []))
                reads = tuple(tuple(_RECOMPUTED if (m, s) in slots else how for s, how in enumerate(r))
                              for m, r in zip(kernel.members, kernel.reads, strict=True))  # fmt: skip
                writes = tuple(tuple(w and (m, o) not in plan.unwritten for o, w in enumerate(ws))
                               for m, ws in zip(kernel.members, kernel.writes, strict=True))  # fmt: skip
                kernel = replace(kernel, reads=reads, writes=writes, recomputes=tuple(sources))
            out.append(kernel)
        return out

    def _runs_after(self, group: _Group) -> tuple[int, int]:
        inside = set(group.members)
        outside = [j for m in group.members for j in self._inputs(m) if j not in inside]
        return max([group.members[0], *outside]), group.members[0]

    def _join(self, i: int, ranges: tuple[int, int], reduction: bool) -> _Group | None:
        """The group node ``i`` joins (merging its producers' groups where it links them), or None."""
        roots = [r for r in (self.root(j) for j in self._inputs(i)) if r is not None]
        candidates: list[_Group] = []
        # Producers first, then siblings reading the same tensor.
        for j in [*roots, *(user for r in roots for user in self.users[r])]:
            group = self.group_of.get(j)
            if group is not None and group.ranges not in _ALONE and group not in candidates:
                candidates.append(group)
        target: _Group | None = None
        for group in candidates:
            merged = merged_ranges(group.ranges, group.reduction, ranges, reduction)
            if target is None:
                if merged is None or len(group.members) >= MAX_FUSION_SIZE or self._cycle(group, [i]):
                    continue
                group.members.append(i)
                group.ranges, group.reduction = merged, group.reduction or reduction
                target = group
                continue
            both = merged_ranges(target.ranges, target.reduction, group.ranges, group.reduction)
            if both is None or len(target.members) + len(group.members) > MAX_FUSION_SIZE:
                continue
            if self._cycle(target, group.members) or self._cycle(group, target.members):
                continue
            target.members = sorted(target.members + group.members)
            target.ranges, target.reduction = both, target.reduction or group.reduction
            for m in group.members:
                self.group_of[m] = target
            group.members = []
        return target

    def _cycle(self, group: _Group, joining: list[int]) -> bool:
        """Whether a node of ``joining`` depends on ``group`` through a kernel outside both. A path
        through views alone is none: a view launches nothing, the kernel reads through it."""
        inside = set(group.members) | set(joining)
        first = min(group.members)
        # (node, whether the path from it to ``joining`` passes a kernel outside both)
        stack = [(j, self.nodes[j].has_kernel) for m in joining for j in self._inputs(m)
                 if j not in inside and j > first]  # fmt: skip
        seen: set[tuple[int, bool]] = set()
        while stack:
            j, through_kernel = stack.pop()
            if (j, through_kernel) in seen:
                continue
            seen.add((j, through_kernel))
            for k in self._inputs(j):
                if k in group.members:
                    if through_kernel:
                        return True
                elif k > first and k not in inside:
                    stack.append((k, through_kernel or self.nodes[k].has_kernel))
        return False

    def _kernel(self, group: _Group) -> FusedKernel:
        if group.ranges == _ATTENTION:  # reads and writes are its attention node's
            return FusedKernel("attention", tuple(group.members), (), ())
        if group.ranges == _EXTERN:
            node = self.nodes[group.members[0]]
            return FusedKernel("extern", (group.members[0],), ((_DRAM,) * len(node.in_shapes),),
                               ((True,) * len(node.out_shapes),))  # fmt: skip
        inside = set(group.members)
        loaded: set[int] = set()  # outside producers already read by the kernel
        reads, writes = [], []
        for m in group.members:
            node = self.nodes[m]
            how = [_DRAM] * len(node.in_shapes)
            matched = [False] * len(node.in_shapes)
            producers: list[int | None] = [None] * len(node.in_shapes)
            for j in self._inputs(m):
                root = self.root(j)
                if root is None:
                    continue
                slot = _slot(node, self.nodes[j], how, matched)
                if slot is None:
                    continue
                matched[slot], producers[slot] = True, root
                if root in inside or root in loaded:
                    how[slot] = _INSIDE
                loaded.add(root)
            self.producers[m] = producers
            table = GATHERS.get(node.op)
            if table is not None and table < len(how) and how[table] == _DRAM:
                how[table] = _GATHERED
            reads.append(tuple(how))
            writes.append(tuple(self._escapes(m, k, inside) for k in range(max(len(node.out_shapes), 1))))
        kind: KernelKind = "reduction" if group.reduction else "pointwise"
        return FusedKernel(kind, tuple(group.members), tuple(reads), tuple(writes))

    def _escapes(self, m: int, output: int, inside: set[int]) -> bool:
        """Whether output ``output`` of node ``m`` is used outside the kernel (or by nothing: an output
        of the graph)."""
        node = self.nodes[m]
        users = self.users[m]
        if len(node.out_shapes) > 1:  # tuple access picks one result: follow those that pick this one
            shape = node.out_shapes[output]
            users = [u for u in users if self.nodes[u].out_shapes[:1] == [shape]] or users
        return self._used_outside(users, inside, depth=0)

    def _used_outside(self, users: list[int], inside: set[int], depth: int) -> bool:
        if not users:
            return True
        for u in users:
            if self.nodes[u].has_kernel:
                if u not in inside:
                    return True
            elif depth > 64 or self._used_outside(self.users[u], inside, depth + 1):
                return True
        return False


def _slot(node: NodeCost, producer: NodeCost, taken: list[int], matched: list[bool]) -> int | None:
    """The position among ``node``'s inputs of the tensor ``producer`` gives it (matched by shape and
    dtype, a position not yet matched), or None."""
    for shape, dtype in zip(producer.out_shapes, producer.out_dtypes, strict=False):
        for k, (s, d) in enumerate(zip(node.in_shapes, node.in_dtypes, strict=True)):
            if taken[k] == _DRAM and not matched[k] and s == shape and d == dtype:
                return k
    return None


def _bytes(shape: Sequence[int], dtype: str) -> int:
    return math.prod(shape) * itemsize(dtype)
