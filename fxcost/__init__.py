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

from fxcost._version import __version__

# The public names by the module each comes from (``public=name`` where the module names it otherwise).
# The TYPE_CHECKING imports below say the same for type checkers; tests/test_layout.py keeps them equal.
_SOURCES = {
    "fxcost.capture": "estimate last_report profile",
    "fxcost.estimator": "Cost Estimator cost",
    "fxcost.gpus": "get_device devices=device_names",
    "fxcost.records": "NodeCost",
    "fxcost.report": "Report",
    "fxcost.report.batch": "at_batch",
    "fxcost.sim": "simulate",
    "fxcost.sim.search": "plan",
    "fxcost.sweeps": "sweep",
}
_EXPORTS: dict[str, tuple[str, str]] = {
    public: (module, name or public)
    for module, names in _SOURCES.items()
    for public, _, name in (entry.partition("=") for entry in names.split())
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # the same names for type checkers (``X as X``: re-exported)
    from fxcost.capture import estimate as estimate
    from fxcost.capture import last_report as last_report
    from fxcost.capture import profile as profile
    from fxcost.estimator import Cost as Cost
    from fxcost.estimator import Estimator as Estimator
    from fxcost.estimator import cost as cost
    from fxcost.gpus import device_names as devices  # noqa: F401 (re-exported as fxcost.devices)
    from fxcost.gpus import get_device as get_device
    from fxcost.records import NodeCost as NodeCost
    from fxcost.report import Report as Report
    from fxcost.report.batch import at_batch as at_batch
    from fxcost.sim import simulate as simulate
    from fxcost.sim.search import plan as plan
    from fxcost.sweeps import sweep as sweep


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attribute = _EXPORTS[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'fxcost' has no attribute {name!r}")
