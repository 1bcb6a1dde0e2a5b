"""What a capture measures and predicts: one options object for ``fxcost.estimate``, ``FxcostBackend``
and ``fxcost.profile``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from fxcost.cost_models import ModelSpec, model_chain
from fxcost.gpus import DEFAULT_DEVICES, Device, get_device
from fxcost.propagate import Execution, check_execution
from fxcost.records import Phase

__all__ = ["CaptureOptions", "Progress"]

Progress = Callable[[Phase, int, int], None]
"""``progress(phase, nodes_done, nodes_total)``, called while a graph is measured."""


@dataclass(frozen=True)
class CaptureOptions:
    """How a captured step is measured and predicted.

    Attributes:
        devices: GPUs to predict for: canonical names (``fxcost.devices()``), aliases, or
            ``torch.cuda.get_device_name()`` strings; stored as canonical names.
        measure: time every node on the device the model runs on, at the first call of each graph.
        cost_model: ``"auto"``, the prediction policy: wave scaling of measured kernel-alike nodes and
            MLP heads for matmuls and convolutions when the model runs on a GPU, the heads for
            everything they cover when it does not, the roofline for the rest (see
            :mod:`fxcost.cost_models.policy`). Or a cost model (``fxcost.cost_models.model_names()``),
            or a comma-separated fallback chain such as ``"wave_scaling,roofline"``.
        overrides: op name -> model or chain for those ops, e.g. ``{"aten.mm.default": "roofline"}``.
        budget_ms: measurement time budget per node.
        profile_kernels: on CUDA, record each node's kernels with torch.profiler while measuring.
        progress: called as ``progress(phase, nodes_done, nodes_total)`` while a graph is measured.
        execution: how the step is to run, for the report's step time and printouts: ``"eager"``
            (op by op), ``"compiled"`` (``torch.compile`` with Inductor: fused kernels) or
            ``"cudagraphs"`` (eager kernels without host gaps); see :mod:`fxcost.propagate.compiled`.

    Raises:
        UnknownDeviceError: a device name is unknown (before anything is compiled or run).
        ValueError: an unknown cost model or execution mode.
    """

    devices: Sequence[str | Device] = DEFAULT_DEVICES
    measure: bool = True
    cost_model: ModelSpec = "auto"
    overrides: Mapping[str, ModelSpec] = field(default_factory=dict)
    budget_ms: float = 10.0
    profile_kernels: bool = True
    progress: Progress | None = None
    execution: Execution = "eager"

    def __post_init__(self) -> None:
        devices = [self.devices] if isinstance(self.devices, (str, Device)) else self.devices
        object.__setattr__(self, "devices", tuple(get_device(d).name for d in devices))
        object.__setattr__(self, "overrides", dict(self.overrides or {}))
        check_execution(self.execution)
        for spec in [self.cost_model, *self.overrides.values()]:
            model_chain(spec)  # unknown model names fail here, before anything compiles

    @property
    def device_names(self) -> list[str]:
        """The devices' canonical names (what ``devices`` holds once the options are made)."""
        return list(cast("tuple[str, ...]", self.devices))

    @classmethod
    def of(cls, **options: Any) -> CaptureOptions:
        """Options from keyword arguments, an unknown one named with the accepted ones."""
        accepted = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise TypeError(f"unknown capture options {unknown}; accepted: {', '.join(accepted)}")
        return cls(**options)
