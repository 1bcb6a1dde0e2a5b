"""Propagation: per-node predictions made into a step's figures.

``totals``: sums by phase and module, coverage; ``eager``: the step as eager PyTorch runs it, the host
issuing kernels and the GPU running them back to back, and its critical path on unlimited streams;
``compiled``: the step as ``torch.compile`` runs it (Inductor's fused kernels) and the execution modes.
"""

from fxcost.propagate.compiled import (
    EXECUTIONS,
    Execution,
    KernelSpan,
    check_execution,
    compiled_timeline,
    fused_kernel_ms,
    node_kernel_ms,
)
from fxcost.propagate.eager import (
    Pipeline,
    Span,
    critical_path_ms,
    issue_bound_ms,
    origin_pipeline,
    replay_ends,
    replay_ms,
    timeline,
)
from fxcost.propagate.totals import by_module, coverage, phase_totals, total_ms

__all__ = [
    "EXECUTIONS",
    "Execution",
    "KernelSpan",
    "Pipeline",
    "Span",
    "by_module",
    "check_execution",
    "compiled_timeline",
    "coverage",
    "critical_path_ms",
    "fused_kernel_ms",
    "issue_bound_ms",
    "node_kernel_ms",
    "origin_pipeline",
    "phase_totals",
    "replay_ends",
    "replay_ms",
    "timeline",
    "total_ms",
]
