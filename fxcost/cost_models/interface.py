"""The one interface every cost model implements, and the registry of models by name.

A cost model receives a :class:`NodeBatch` (numpy columns built once from the node records) and a
target GPU, and returns one array of milliseconds, NaN where it has no prediction. Models register
a factory under a name with :func:`register`, which refuses duplicates; :func:`get_model` builds one.
The built-in models register when ``fxcost.cost_models`` is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fxcost._registry import Registry
from fxcost.gpus import Device
from fxcost.lowering import is_matmul_class
from fxcost.precision import float_itemsize
from fxcost.records import NodeCost

__all__ = ["CostModel", "NodeBatch", "get_model", "model_names", "register"]


@dataclass(frozen=True)
class NodeBatch:
    """Columns of a list of node records, as numpy arrays (NaN where a value is unknown).

    Attributes:
        nodes: the records, in order.
        flops: floating point operations.
        bytes: bytes read plus written.
        has_kernel: whether the node launches a GPU kernel.
        matmul: whether the node is matmul-class (GEMM, convolution, attention: tensor-core work).
        origin_ms: measured time on the origin device.
        kernel_ms: the GPU time of the node's kernels on the origin (``NodeCost.kernel_ms``).
        itemsize: bytes per element of the node's widest floating output (4 for fp32), NaN if none.
        tf32: fp32 matmul-class nodes allowed to run on TF32 tensor cores.
        origin: the GPU the ``origin_ms`` were measured on, None if not a known GPU (e.g. a CPU).
    """

    nodes: Sequence[NodeCost]
    flops: np.ndarray
    bytes: np.ndarray
    has_kernel: np.ndarray
    matmul: np.ndarray
    origin_ms: np.ndarray
    kernel_ms: np.ndarray
    itemsize: np.ndarray
    tf32: np.ndarray
    origin: Device | None = None
    _derived: dict[Hashable, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, nodes: Sequence[NodeCost], origin: Device | None = None) -> NodeBatch:
        def column(values: list[float | None]) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

        return cls(
            nodes=nodes,
            flops=column([n.flops for n in nodes]),
            bytes=column([n.bytes for n in nodes]),
            has_kernel=np.array([n.has_kernel for n in nodes], dtype=bool),
            matmul=np.array([is_matmul_class(n.op) for n in nodes], dtype=bool),
            origin_ms=column([n.origin_ms for n in nodes]),
            kernel_ms=column([n.kernel_ms for n in nodes]),
            itemsize=column([float_itemsize(n.out_dtypes or n.in_dtypes) for n in nodes]),
            tf32=np.array([n.tf32 for n in nodes], dtype=bool),
            origin=origin,
        )

    def __len__(self) -> int:
        return len(self.nodes)

    def derived(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """Data derived from the nodes, computed once per batch under ``key`` and reused: what a model
        derives for every device the batch is predicted on (``predict`` calls models once per device),
        or what a caller prices on one device, with the device in ``key``."""
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]


@runtime_checkable
class CostModel(Protocol):
    """The one interface every cost model implements."""

    @property
    def name(self) -> str:
        """The name predictions are attributed to (``NodeCost.pred_source``)."""
        ...

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        """Milliseconds per node of ``batch`` on ``device``; NaN where the model has no prediction."""
        ...


_REGISTRY: Registry[Callable[[], CostModel]] = Registry("cost model")


def register(name: str) -> Callable[[Callable[[], CostModel]], Callable[[], CostModel]]:
    """Register a cost-model factory under ``name``; refuses a name already taken."""
    if not name or not name.isidentifier():
        raise ValueError(f"cost model name must be an identifier, got {name!r}")
    return _REGISTRY.register(name)


def model_names() -> list[str]:
    """Names of the registered cost models."""
    return _REGISTRY.names()


def get_model(name: str | CostModel) -> CostModel:
    """A cost model by registered name (or the model itself)."""
    if not isinstance(name, str):
        return name
    return _REGISTRY.get(name)()
