"""Activations saved for backward in a compiled training step: what the forward writes and the backward
reads.

AOTAutograd splits a training step's joint graph into a forward and a backward; the tensors the
backward needs are outputs of the forward. The records are captured with AOTAutograd's default
partition, which saves every intermediate result the backward reads. Inductor partitions with
``min_cut_rematerialization_partition`` (``torch/_functorch/partitioners.py``) instead: it saves the
fewest bytes from which the backward can recompute the rest, and recomputes pointwise ops inside the
backward's fused kernels. It never recomputes (``should_ban_recomputation``) a random op (dropout's
mask), an op whose output is at least 4 times smaller than its inputs (a reduction's statistics: a
layer norm's mean and rstd) or a compute-intensive op (GEMMs, convolutions, attention), and what
the forward writes to memory anyway costs nothing more to save. The compiled H100 GPT-2 steps show
it: the forward's GELU kernel reads the GEMM's bf16 output and writes only its bf16 result (none of
the fp32 intermediates eager saves), and the backward's GELU kernel reads the bf16 GEMM output and
the gradient (about 0.13 ms per kernel, what 3 bf16 tensors take to move).

The records keep no link from the backward's inputs to the forward's results (graph inputs are not
in ``inputs``). :func:`rematerialize` applies the partitioner's rules by what the records tell:

- forward: a generated kernel's result that no other kernel of its graph reads but a backward
  kernel does (saved for backward; in the records often through a ``detach`` of it) is written only
  if the partitioner would not recompute it (a random op's, or one at least 4 times smaller than
  its node's inputs). A result no backward read matches is returned (a loss, a buffer's new value)
  and written;
- backward: a generated kernel's read of a tensor from outside its graph is matched to the forward's
  results (and views of them) of the same shape and dtype in the reading node's module and the
  modules enclosing it. Where every match is a result of a forward generated kernel that the
  forward did not write (used only inside its kernel, or left unwritten by the rule above), the
  tensor is recomputed: walking back through that forward kernel, the backward kernel reads what
  it read from memory and the results it could not recompute, each tensor once (a source of the
  same shape and dtype as one the kernel reads already is taken for it). Where a match was written
  (a library call's result, a result another kernel reads) or none matches, the tensor is read as
  it is;
- a forward kernel left writing nothing is dead code and does not run.

Records are matched by shape, dtype and module, not by identity: in a model whose layers are not
modules of their own, a key matches results of many layers, any of them written keeps the read.
Not modelled: the cut itself (the partitioner may save a pointwise result where that is fewer bytes
than its sources, and it may fuse the recomputation into several backward kernels), a saved
result a backward library call reads (the partitioner then saves it: here read, but left
unwritten by the forward where its kernel used it alone), and the forward's writes of the small
results it saves instead (a layer norm's statistics).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from fxcost.lowering.kernels import resolve_op
from fxcost.precision import itemsize
from fxcost.records import NodeCost

if TYPE_CHECKING:
    from fxcost.lowering.fusion import FusedKernel

__all__ = ["SavedPlan", "rematerialize"]

_GENERATED = ("pointwise", "reduction")
_REDUCTION_BAN = 4  # should_ban_recomputation: outputs this many times smaller than the inputs are saved
_DRAM, _INSIDE = 0, 1  # FusedKernel.reads: a tensor read from memory, or from inside the kernel


@dataclass
class SavedPlan:
    """What the partitioner changes in a training step's kernels (positions index the node list and
    the kernel list given to :func:`rematerialize`).

    Attributes:
        unwritten: (node, output) results of forward kernels not written (recomputed in backward).
        recomputed: per backward kernel, its (node, input) reads that are recomputed, and the
            forward (node, input) tensors it reads instead.
        dead: forward kernels that write nothing and do not run.
    """

    unwritten: set[tuple[int, int]] = field(default_factory=set)
    recomputed: dict[int, tuple[set[tuple[int, int]], list[tuple[int, int]]]] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)


Key = tuple[tuple[int, ...], str]  # a tensor's shape and dtype


def rematerialize(
    nodes: Sequence[NodeCost],
    kernels: Sequence[FusedKernel],
    producers: dict[int, list[int | None]],
    users: Sequence[list[int]],
) -> SavedPlan:
    """The :class:`SavedPlan` of a training step fused into ``kernels``. ``producers[i]``: for a node
    of a generated kernel, the kernel node each of its inputs comes from (None: from outside its
    graph); ``users[i]``: the nodes reading node ``i``. See the module docstring for the rules."""
    plan = SavedPlan()
    kernel_of = {m: k for k, kernel in enumerate(kernels) for m in kernel.members}
    read = _backward_reads(nodes, kernels, producers)
    for kernel in _generated(nodes, kernels, "fw"):
        inside = set(kernel.members)
        for m, writes in zip(kernel.members, kernel.writes, strict=True):
            for o, written in enumerate(writes[: len(nodes[m].out_shapes)]):
                saved = any((module, _key(nodes[m], o)) in read for module in _enclosing(nodes[m].module))
                if written and saved and _only_saved(m, inside, nodes, users) and _recomputable(nodes[m], o):
                    plan.unwritten.add((m, o))
    results = _forward_results(nodes, kernels, kernel_of, plan.unwritten, users)
    for b, kernel in enumerate(kernels):
        if not _is_generated(nodes, kernel, "bw"):
            continue
        slots: set[tuple[int, int]] = set()
        recomputed: list[int] = []  # the forward nodes whose results the kernel recomputes
        kept: set[Key] = set()  # tensors it reads as they are
        for m, reads in zip(kernel.members, kernel.reads, strict=True):
            node = nodes[m]
            for k, producer in enumerate(producers.get(m, [])):
                if producer is not None or reads[k] != _DRAM:
                    continue
                key = (tuple(node.in_shapes[k]), node.in_dtypes[k])
                matches = [r for module in _enclosing(node.module) for r in results.get((module, key), [])]
                if matches and not any(written for _, written in matches):
                    slots.add((m, k))
                    recomputed.extend(i for i, _ in matches)
                else:
                    kept.add(key)
        if slots:
            plan.recomputed[b] = (slots, _sources(nodes, kernels, kernel_of, producers, recomputed, kept))
    for f, kernel in enumerate(kernels):
        outputs = [
            (m, o, w) for m, ws in zip(kernel.members, kernel.writes, strict=True) for o, w in enumerate(ws)
        ]
        if (_is_generated(nodes, kernel, "fw") and all(nodes[m].out_shapes for m in kernel.members)
                and all(not w or (m, o) in plan.unwritten for m, o, w in outputs)):  # fmt: skip
            plan.dead.add(f)
    return plan


def _is_generated(nodes: Sequence[NodeCost], kernel: FusedKernel, phase: str) -> bool:
    return kernel.kind in _GENERATED and nodes[kernel.members[0]].phase == phase


def _generated(nodes: Sequence[NodeCost], kernels: Sequence[FusedKernel], phase: str) -> list[FusedKernel]:
    return [k for k in kernels if _is_generated(nodes, k, phase)]


def _key(node: NodeCost, output: int) -> Key:
    return tuple(node.out_shapes[output]), node.out_dtypes[output]


def _enclosing(module: str) -> list[str]:
    """``module`` and the modules enclosing it, out to the root (``""``)."""
    parts = module.split(".") if module else []
    return [".".join(parts[:n]) for n in range(len(parts), -1, -1)]


def _backward_reads(
    nodes: Sequence[NodeCost], kernels: Sequence[FusedKernel], producers: dict[int, list[int | None]]
) -> set[tuple[str, Key]]:
    """(module, key) of every tensor a backward generated kernel reads from outside its graph, under
    the reading node's module and every module enclosing it."""
    read: set[tuple[str, Key]] = set()
    for kernel in _generated(nodes, kernels, "bw"):
        for m in kernel.members:
            node = nodes[m]
            for k, producer in enumerate(producers.get(m, [])):
                if producer is None:
                    key = (tuple(node.in_shapes[k]), node.in_dtypes[k])
                    read.update((module, key) for module in _enclosing(node.module))
    return read


def _only_saved(
    i: int, inside: set[int], nodes: Sequence[NodeCost], users: Sequence[list[int]], depth: int = 0
) -> bool:
    """Whether no kernel outside ``inside`` reads node ``i``'s results (through views): what its
    kernel writes of it is a graph output (saved for backward: the records' ``detach`` of it)."""
    for u in users[i]:
        if nodes[u].has_kernel:
            if u not in inside:
                return False
        elif depth > 64 or not _only_saved(u, inside, nodes, users, depth + 1):
            return False
    return True


def _recomputable(node: NodeCost, output: int) -> bool:
    """Whether the partitioner may recompute output ``output`` of ``node`` (see the module docstring)."""
    if _random(node.op):
        return False
    produced = math.prod(node.out_shapes[output]) * itemsize(node.out_dtypes[output])
    consumed = sum(math.prod(s) * itemsize(d) for s, d in zip(node.in_shapes, node.in_dtypes, strict=True))
    return produced * _REDUCTION_BAN >= consumed


_RANDOM: dict[str, bool] = {}


def _random(op: str) -> bool:
    """Whether ``op`` draws random numbers (torch's ``nondeterministic_seeded`` tag, the partitioner's
    ``is_random``)."""
    if op not in _RANDOM:
        overload = resolve_op(op) if op.startswith("aten.") else None
        tags = overload.tags if isinstance(overload, torch._ops.OpOverload) else []
        _RANDOM[op] = torch.Tag.nondeterministic_seeded in tags
    return _RANDOM[op]


def _forward_results(
    nodes: Sequence[NodeCost], kernels: Sequence[FusedKernel], kernel_of: dict[int, int],
    unwritten: set[tuple[int, int]], users: Sequence[list[int]],
) -> dict[tuple[str, Key], list[tuple[int, bool]]]:  # fmt: skip
    """The forward's results (and views of them) by module and key: the kernel node computing each
    and whether the forward writes it."""
    found: dict[tuple[str, Key], list[tuple[int, bool]]] = defaultdict(list)
    status: dict[int, tuple[int, bool]] = {}  # node -> (the kernel node behind it, whether written)
    for i, node in enumerate(nodes):
        if node.phase != "fw":
            continue
        if node.has_kernel:
            kernel = kernels[kernel_of[i]] if i in kernel_of else None
            if kernel is None:
                continue
            writes = kernel.writes[kernel.members.index(i)] if kernel.kind in _GENERATED else ()
            for o, (shape, dtype) in enumerate(zip(node.out_shapes, node.out_dtypes, strict=False)):
                # Written: a library call's result, one another kernel reads, or one the partitioner
                # saves rather than recomputes.
                written = (kernel.kind not in _GENERATED or not _recomputable(node, o)
                           or (o < len(writes) and writes[o] and (i, o) not in unwritten))  # fmt: skip
                found[(node.module, (tuple(shape), dtype))].append((i, written))
                status.setdefault(i, (i, written))
        elif i in status:  # a view: as written as what it looks at
            for shape, dtype in zip(node.out_shapes, node.out_dtypes, strict=False):
                found[(node.module, (tuple(shape), dtype))].append(status[i])
        for u in users[i]:  # views pass on what they look at
            if not nodes[u].has_kernel and i in status:
                status.setdefault(u, status[i])
    return found


def _sources(
    nodes: Sequence[NodeCost], kernels: Sequence[FusedKernel], kernel_of: dict[int, int],
    producers: dict[int, list[int | None]], recomputed: Sequence[int], kept: set[Key],
) -> list[tuple[int, int]]:  # fmt: skip
    """The (node, input) tensors a backward kernel reads to recompute the forward results of
    ``recomputed``: walking back through their forward kernel from each, the inputs that kernel read
    from memory and the results it could not recompute (saved); each key once, none in ``kept``."""
    seen, out = set(kept), []
    stack, visited = list(recomputed), set()
    while stack:
        u = stack.pop()
        if u in visited or u not in kernel_of:
            continue
        visited.add(u)
        kernel = kernels[kernel_of[u]]
        if kernel.kind not in _GENERATED:
            continue
        reads = kernel.reads[kernel.members.index(u)]
        node = nodes[u]
        for k, producer in enumerate(producers.get(u, [])):
            if (producer is not None and kernel_of.get(producer) == kernel_of[u] and reads[k] != _DRAM
                    and _recomputable(nodes[producer], 0)):  # fmt: skip
                stack.append(producer)  # recomputed in turn, from what it reads
                continue
            key = (tuple(node.in_shapes[k]), node.in_dtypes[k])
            if reads[k] in (_DRAM, _INSIDE) and key not in seen:
                seen.add(key)
                out.append((u, k))
    return out
