"""Execution modes: how a predicted step runs on the GPU (``execution=`` across the API).

- ``"eager"``: every ATen op a kernel, issued by the host one by one (the default).
- ``"compiled"``: ``torch.compile`` with Inductor: fused kernels (:mod:`fxcost.lowering.fusion`,
  priced in :mod:`fxcost.propagate.compiled`), one host launch per kernel.
- ``"cudagraphs"``: the eager kernels replayed from a CUDA graph, with no host time between them.

Imports nothing heavy: the command line reads the choices from here.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["EXECUTIONS", "Execution", "check_execution"]

Execution = Literal["eager", "compiled", "cudagraphs"]
EXECUTIONS: tuple[Execution, ...] = get_args(Execution)


def check_execution(execution: object) -> Execution:
    """``execution`` if it names an execution mode, else a ValueError naming the accepted ones.

    Example:
        >>> check_execution("compiled")
        'compiled'
    """
    if execution not in EXECUTIONS:
        raise ValueError(f"unknown execution {execution!r}; accepted: {', '.join(EXECUTIONS)}")
    return execution
