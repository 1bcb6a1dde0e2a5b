"""What the backend keeps of each graph it compiles, and what it reads from a graph's inputs.

:class:`CapturedGraph` holds a graph with its record, when it last ran (a step is the graphs run
since the model's first graph last started) and, for a graph compiled for dynamic shapes, the sizes
of its latest run, read through :func:`size_symbols`. :func:`placeholder_outputs` stands in for a
graph whose results nobody reads. :func:`step_facts` reads the batch, sequence length and model
name of a step compiled by a user from the model's own Dynamo graph.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx

from fxcost.capture.inputs import batch_of_leaves, seqlen_of
from fxcost.lowering import size_hint
from fxcost.records import GraphRecord

__all__ = [
    "CapturedGraph",
    "StepFacts",
    "code_being_compiled",
    "is_optimizer_graph",
    "placeholder_outputs",
    "size_symbols",
    "step_facts",
]


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
    # The first graph of a compile of the model's own frame starts a step when it runs; it keeps what
    # its compile saw of the step.
    facts: StepFacts | None = None


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
            symbol = _symbol(size)
            if symbol is not None:
                found.append((i, dim, symbol, size_hint(size)))
    return found


@dataclass(frozen=True)
class StepFacts:
    """What a printout says of a step: its batch, sequence length and model name, where known, and
    the size symbols that carry the batch and sequence length under dynamic shapes."""

    batch: int | None = None
    seqlen: int | None = None
    name: str = ""
    batch_symbol: sympy.Symbol | None = None
    seqlen_symbol: sympy.Symbol | None = None

    def at(self, sizes: dict[sympy.Symbol, int]) -> StepFacts:
        """The facts at the sizes of a run (a dynamic-shape graph's symbols bound)."""
        return dataclasses.replace(
            self,
            batch=sizes.get(self.batch_symbol, self.batch) if self.batch_symbol is not None else self.batch,
            seqlen=sizes.get(self.seqlen_symbol, self.seqlen)
            if self.seqlen_symbol is not None
            else self.seqlen,
        )


def step_facts(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> StepFacts:
    """The facts of the step whose first Dynamo graph is ``gm``: the batch and sequence length of the
    caller's tensors among its inputs (not the module's parameters and buffers, which Dynamo lifts
    to inputs too), and the compiled module's class name. Unknown where Dynamo does not say."""
    try:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        callers = [(node, value) for node, value in zip(placeholders, example_inputs, strict=False)
                   if _is_callers(node)]  # fmt: skip
        given = [value for _, value in callers]
        batch, seqlen = batch_of_leaves(given), seqlen_of(tuple(given), {})
        first = next(
            (node for node, value in callers if isinstance(value, torch.Tensor) and value.dim()), None
        )
        fake = first.meta.get("example_value") if first is not None else None
        symbols = [_symbol(s) for s in fake.shape[:2]] if isinstance(fake, torch.Tensor) else []
        from torch._dynamo.symbolic_convert import InstructionTranslator

        f_locals = InstructionTranslator.current_tx().f_locals
    except Exception:  # a private corner of Dynamo that moved: the facts stay unknown
        return StepFacts()
    module = f_locals.get("self", f_locals.get("fn"))
    name = type(module).__name__ if isinstance(module, torch.nn.Module) else ""
    batch_symbol = symbols[0] if symbols else None
    seqlen_symbol = symbols[1] if len(symbols) > 1 and seqlen is not None else None
    return StepFacts(batch, seqlen, name, batch_symbol, seqlen_symbol)


def _symbol(size: int | torch.SymInt) -> sympy.Symbol | None:
    """The plain size symbol of a dimension, None for a static one or an expression."""
    if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
        return size.node.expr
    return None


def _is_callers(placeholder: torch.fx.Node) -> bool:
    """Whether a Dynamo graph input is one the caller passed, not a module's parameter or buffer."""
    source = placeholder.meta.get("grapharg")
    name = source.source.name if source is not None and source.source is not None else ""
    return name.startswith("L[") and not name.startswith(("L['self']", "L['fn']")) and "._" not in name


def is_optimizer_graph(gm: torch.fx.GraphModule) -> bool:
    """Whether a Dynamo graph was traced from ``torch.optim`` code (an optimizer step)."""
    optim_dir = os.path.dirname(torch.optim.__file__)
    return any(optim_dir in (n.meta.get("stack_trace") or "") for n in gm.graph.nodes)


def code_being_compiled() -> types.CodeType | None:
    """The code object of the frame Dynamo is compiling, if this runs inside a Dynamo compile."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return InstructionTranslator.current_tx().f_code
    except (ImportError, AttributeError):
        return None
