"""Capturing a step: the torch.compile backend (``backend``), the options it runs with (``options``),
tracing and restoring a step (``step``: ``fxcost.profile``), and the step's inputs (``inputs``)."""

from fxcost.capture.backend import FxcostBackend, estimate, fxcost_backend, last_report, register
from fxcost.capture.inputs import as_call, batch_of, batch_of_leaves, map_batched
from fxcost.capture.options import CaptureOptions
from fxcost.capture.step import (
    LossFn,
    captured_report,
    default_loss,
    profile,
    trace_step,
    trace_without_running,
)

__all__ = [
    "CaptureOptions",
    "FxcostBackend",
    "LossFn",
    "as_call",
    "batch_of",
    "batch_of_leaves",
    "captured_report",
    "default_loss",
    "estimate",
    "fxcost_backend",
    "last_report",
    "map_batched",
    "profile",
    "register",
    "trace_step",
    "trace_without_running",
]
