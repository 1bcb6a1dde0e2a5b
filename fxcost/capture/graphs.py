"""What the backend keeps of each graph it compiles, and what it reads from a graph's inputs.

:class:`CapturedGraph` holds a graph with its record, when it last ran (a step is the graphs run
since the model's first graph last started) and, for a graph compiled for dynamic shapes, the sizes
of its latest run, read through :func:`size_symbols`. :func:`placeholder_outputs` stands in for a
graph whose results nobody reads. :func:`step_facts` reads the batch, sequence length and model
name of a step compiled by a user from the model's own Dynamo graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx

from fxcost.capture.inputs import batch_of_leaves, seqlen_of
from fxcost.lowering import size_hint
from fxcost.records import GraphRecord

__all__ = ["CapturedGraph", "StepFacts", "placeholder_outputs", "size_symbols", "step_facts"]


@dataclass
class CapturedGraph:
    """A compiled graph as the backend keeps it: its annotated module, record, and runs."""

    gm: torch.fx.GraphModule
    record: GraphRecord
    measure_pending: bool = True
    last_run: int = -1  # the backend's run count at the graph's latest call; -1: never ran
    # Where each size symbol of a dynamic-shape graph's inputs is read from its arguments (argument,
    # dimension or None for a SymInt argument), the sizes of its latest call, and those its records
    # were annotated at.
    symbols: list[tuple[int, int | None, sympy.Symbol, int]] = field(default_factory=list)
    sizes: dict[sympy.Symbol, int] = field(default_factory=dict)
    annotated_sizes: dict[sympy.Symbol, int] = field(default_factory=dict)


def placeholder_outputs(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """A stand-in for ``gm`` that computes nothing: inputs it returns come back as they are, every
    other output as an uninitialized tensor of the traced size, stride, dtype and device (sizes at
    the traced values under dynamic shapes)."""
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    (outputs,) = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args

    def placeholder(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            size = [size_hint(s) for s in value.shape]
            stride = [size_hint(s) for s in value.stride()]
            return torch.empty_strided(size, stride, dtype=value.dtype, device=value.device)
        if isinstance(value, torch.SymInt):
            return size_hint(value)
        return value

    def run(*args: Any) -> Any:
        given = dict(zip(inputs, args, strict=True))

        def value(a: Any) -> Any:
            if not isinstance(a, torch.fx.Node):
                return a
            return given[a] if a in given else placeholder(a.meta["val"])

        result = torch.fx.node.map_aggregate(outputs, value)
        return list(result) if isinstance(result, list) else result  # not FX's immutable_list

    return run


def size_symbols(gm: torch.fx.GraphModule) -> list[tuple[int, int | None, sympy.Symbol, int]]:
    """The plain size symbols of ``gm``'s inputs: the argument each is read from, its dimension (None
    for a SymInt argument), the symbol and its value at the traced sizes. Empty for static shapes."""
    found = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt):
            sizes: list[tuple[int | None, Any]] = [(None, value)]
        elif isinstance(value, torch.Tensor):
            sizes = list(enumerate(value.shape))
        else:
            continue
        for dim, size in sizes:
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                found.append((i, dim, size.node.expr, size_hint(size)))
    return found


@dataclass(frozen=True)
class StepFacts:
    """What a printout says of a step: its batch, sequence length and model name, where known."""

    batch: int | None = None
    seqlen: int | None = None
    name: str = ""


def step_facts(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> StepFacts:
    """The facts of the step whose first Dynamo graph is ``gm``: the batch and sequence length of the
    caller's tensors among its inputs (not the module's parameters and buffers, which Dynamo lifts
    to inputs too), and the compiled module's class name. Unknown where Dynamo does not say."""
    try:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        given = [value for node, value in zip(placeholders, example_inputs, strict=False)
                 if _is_callers(node)]  # fmt: skip
        from torch._dynamo.symbolic_convert import InstructionTranslator

        f_locals = InstructionTranslator.current_tx().f_locals
    except Exception:  # a private corner of Dynamo that moved: the facts stay unknown
        return StepFacts()
    module = f_locals.get("self", f_locals.get("fn"))
    name = type(module).__name__ if isinstance(module, torch.nn.Module) else ""
    return StepFacts(batch_of_leaves(given), seqlen_of(tuple(given), {}), name)


def _is_callers(placeholder: torch.fx.Node) -> bool:
    """Whether a Dynamo graph input is one the caller passed, not a module's parameter or buffer."""
    source = placeholder.meta.get("grapharg")
    name = source.source.name if source is not None and source.source is not None else ""
    return name.startswith("L[") and not name.startswith(("L['self']", "L['fn']")) and "._" not in name
