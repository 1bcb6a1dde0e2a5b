"""fxcost: predict how long a PyTorch training iteration takes on GPUs you may not have.

Importing fxcost is cheap and has no side effects; the public names below load on first use.

Example:
    >>> import torch, fxcost
    >>> compiled = torch.compile(model, backend=fxcost.estimate(devices=["H100-SXM", "L4"]))  # doctest: +SKIP
    >>> compiled(x).sum().backward()  # doctest: +SKIP
    >>> fxcost.last_report().print(top=20)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Cost",
    "Estimator",
    "NodeCost",
    "Report",
    "Trace",
    "at_batch",
    "cost",
    "devices",
    "estimate",
    "get_device",
    "last_report",
    "profile",
    "simulate",
    "sweep",
]

_EXPORTS = {
    "Cost": "fxcost.capture",
    "profile": "fxcost.capture",
    "cost": "fxcost.capture",
    "Estimator": "fxcost.estimator",
    "sweep": "fxcost.sweeps",
    "simulate": "fxcost.sim",
    "estimate": "fxcost.backend",
    "last_report": "fxcost.backend",
    "Report": "fxcost.report",
    "at_batch": "fxcost.report.batch",
    "NodeCost": "fxcost.records",
    "get_device": "fxcost.devices",
}

if TYPE_CHECKING:
    from fxcost.backend import estimate, last_report
    from fxcost.capture import Cost, cost, profile
    from fxcost.devices import device_names as devices
    from fxcost.devices import get_device
    from fxcost.estimator import Estimator
    from fxcost.records import NodeCost
    from fxcost.report import Report
    from fxcost.report.batch import at_batch
    from fxcost.sim import simulate
    from fxcost.sweeps import sweep

    Trace = Report


def __getattr__(name: str) -> Any:
    if name == "Trace":  # DESIGN.md's name for the serialized form: the same class as Report
        name = "Report"
    if name == "devices":  # the callable fxcost.devices package: fxcost.devices() lists GPU names
        return importlib.import_module("fxcost.devices")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fxcost' has no attribute {name!r}")
