"""A captured graph's sizes as polynomials in its batch size, to price it at other batches untraced.

Captured with the batch dimension of its inputs marked dynamic, a graph's sizes are ``SymInt``
expressions in that dimension's symbols (``512*s0``). :class:`BatchSymbols` turns each into a
polynomial in one variable, the batch ``B``, and :func:`node_sizes` does so for a call node's shapes,
FLOPs and bytes, so the node can be priced at any batch without tracing the model again
(:mod:`fxcost.estimator`). A graph holds only where the guards Dynamo recorded while tracing it hold:
:meth:`BatchSymbols.valid_at` checks them for a batch.

A static graph gives constant polynomials, valid at its own batch only: a graph traced without
symbols, or one whose sizes are no polynomials in the batch (``B // 2``) or that Dynamo split into
frames with symbols of their own (graph breaks), priced at the sizes it was traced with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from fxcost.lowering import count_flops, size_hint, tensor_bytes
from fxcost.passes.annotate import operands

__all__ = ["BatchSymbols", "NodeSizes", "NotPolynomial", "Poly", "node_sizes"]

Poly = tuple[int, ...]
"""Integer coefficients, lowest power first: ``(c0, c1)`` is ``c0 + c1 * B``."""


class NotPolynomial(ValueError):
    """A size that is no polynomial in the batch with integer coefficients (e.g. ``B // 2``)."""


class BatchSymbols:
    """The batch symbols of a traced graph, and its sizes as polynomials in the batch.

    Args:
        shape_env: the ``ShapeEnv`` Dynamo traced the graph in (``None`` for a static graph).

    Symbols whose source is a size (``L['a'][0].size()[0]``) are the batch: only the inputs' batch
    dimensions are marked dynamic. Any other symbol (a stride Dynamo made symbolic along with them)
    takes its traced value.
    """

    def __init__(self, shape_env: Any | None) -> None:
        self.variable = sympy.Symbol("B", integer=True, positive=True)
        # The traced value of each symbol (``backed_var_to_val`` is ``var_to_val``'s newer name).
        name = "backed_var_to_val" if hasattr(shape_env, "backed_var_to_val") else "var_to_val"
        values = dict(getattr(shape_env, name, {}))
        sources = dict(shape_env.var_to_sources) if shape_env is not None else {}
        self.symbols = {s for s, srcs in sources.items() if any(".size()" in src.name for src in srcs)}
        self._subs = {
            s: self.variable if s in self.symbols else sympy.Integer(int(v)) for s, v in values.items()
        }
        kept = [] if shape_env is None else [g for g in shape_env.guards if not _memory_format_guard(g)]
        guards = [g.expr.xreplace(self._subs) for g in kept]
        self.guards = [g for g in guards if self.variable in g.free_symbols]
        self._polys: dict[sympy.Expr, Poly] = {}
        self._valid: dict[int, bool] = {}

    def poly(self, x: int | torch.SymInt) -> Poly:
        """``x`` as a polynomial in the batch.

        Raises:
            NotPolynomial: ``x`` is no polynomial with integer coefficients.
        """
        if not isinstance(x, torch.SymInt) or not self.symbols:
            return (size_hint(x),)  # static: every size at its traced value
        expr = x.node.expr
        if expr not in self._polys:  # a graph has few distinct sizes: 512*s0, s0, ...
            self._polys[expr] = self._poly(expr)
        return self._polys[expr]

    def _poly(self, expr: sympy.Expr) -> Poly:
        value = sympy.expand(expr.xreplace(self._subs))
        if not value.free_symbols:
            return (int(value),)
        try:
            coefficients = sympy.Poly(value, self.variable).all_coeffs()[::-1]
        except sympy.PolynomialError as e:
            raise NotPolynomial(f"size {expr} is not a polynomial in the batch") from e
        if not all(c.is_Integer for c in coefficients):
            raise NotPolynomial(f"size {expr} has non-integer coefficients in the batch")
        return tuple(int(c) for c in coefficients)

    def valid_at(self, batch: int) -> bool:
        """Whether the traced graph is the graph at ``batch``: every guard holds there. Dynamo traces
        a symbolic size assuming it is at least 2 (sizes 0 and 1 get graphs of their own)."""
        if not self.symbols or batch < 2:
            return False
        if batch not in self._valid:
            try:
                self._valid[batch] = all(bool(g.subs(self.variable, batch)) for g in self.guards)
            except TypeError:  # a guard that does not evaluate to a truth value
                self._valid[batch] = False
        return self._valid[batch]


def _memory_format_guard(guard: Any) -> bool:
    """A guard the fake convolution adds while asking the CPU convolution backend which memory format
    its output takes (e.g. ``B >= 16`` on ResNet-50): it decides the output's strides on this CPU,
    not which ops run, so it does not bound where the graph holds on a GPU."""
    where = str(getattr(guard, "sloc", ""))
    return "fake_impls.py" in where and " in conv)" in where


@dataclass(frozen=True)
class NodeSizes:
    """A call node's sizes as polynomials in the batch (see :class:`~fxcost.records.NodeCost`).

    ``bytes_read`` and ``bytes_written`` are split into float32 tensors and the rest, so a precision
    change rescales the first part only.
    """

    in_shapes: tuple[tuple[Poly, ...], ...]
    out_shapes: tuple[tuple[Poly, ...], ...]
    flops: Poly | None
    bytes_read: tuple[Poly, Poly]
    bytes_written: tuple[Poly, Poly]


def node_sizes(node: torch.fx.Node, symbols: BatchSymbols, flops_known: bool) -> NodeSizes:
    """The sizes of an annotated call node that launches a kernel, as polynomials; ``flops_known``:
    its record has a count.

    Raises:
        NotPolynomial: a size of the node is no polynomial in the batch.
    """
    v = operands(node)

    def shapes(tensors: Iterable[torch.Tensor]) -> tuple[tuple[Poly, ...], ...]:
        return tuple(tuple(symbols.poly(s) for s in t.shape) for t in tensors)

    def traffic(tensors: list[torch.Tensor]) -> tuple[Poly, Poly]:
        fp32 = [symbols.poly(tensor_bytes(t)) for t in tensors if t.dtype == torch.float32]
        other = [symbols.poly(tensor_bytes(t)) for t in tensors if t.dtype != torch.float32]
        return _sum(fp32), _sum(other)

    flops = count_flops(node.target, v.args, v.kwargs, v.out) if flops_known else None
    return NodeSizes(
        in_shapes=shapes(v.ins),
        out_shapes=shapes(v.outs),
        flops=None if flops is None else symbols.poly(flops),
        bytes_read=traffic(v.ins),
        bytes_written=traffic(v.written),
    )


def _sum(polys: Iterable[Poly]) -> Poly:
    total: list[int] = [0]  # (0,): no tensors, no traffic
    for p in polys:
        total += [0] * (len(p) - len(total))
        for i, c in enumerate(p):
            total[i] += c
    return tuple(total)
