"""Cost models: given nodes and a target GPU, milliseconds per node.

Every model implements :class:`CostModel` and is vectorized over nodes: it receives a
:class:`NodeBatch` (numpy columns built once from the records) and returns one array of ms, with NaN
where it has no prediction. Models are registered by name through :func:`register`, which refuses
duplicates; :func:`get_model` builds one by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from fxcost.devices import Device
from fxcost.lowering import is_matmul_class
from fxcost.records import NodeCost

__all__ = ["CostModel", "NodeBatch", "get_model", "model_names", "predict", "register"]


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
        itemsize: bytes per element of the node's widest floating output (4 for fp32), NaN if none.
    """

    nodes: Sequence[NodeCost]
    flops: np.ndarray
    bytes: np.ndarray
    has_kernel: np.ndarray
    matmul: np.ndarray
    origin_ms: np.ndarray
    itemsize: np.ndarray

    @classmethod
    def of(cls, nodes: Sequence[NodeCost]) -> NodeBatch:
        def column(values: list[float | None]) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

        return cls(
            nodes=nodes,
            flops=column([n.flops for n in nodes]),
            bytes=column([n.bytes for n in nodes]),
            has_kernel=np.array([n.has_kernel for n in nodes], dtype=bool),
            matmul=np.array([is_matmul_class(n.op) for n in nodes], dtype=bool),
            origin_ms=column([n.origin_ms for n in nodes]),
            itemsize=column([_itemsize(n.out_dtypes or n.in_dtypes) for n in nodes]),
        )

    def __len__(self) -> int:
        return len(self.nodes)


_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


def _itemsize(dtypes: Sequence[str]) -> float | None:
    sizes = [_ITEMSIZE[d] for d in dtypes if d in _ITEMSIZE]
    return max(sizes) if sizes else None


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


_REGISTRY: dict[str, Callable[[], CostModel]] = {}


def register(name: str) -> Callable[[Callable[[], CostModel]], Callable[[], CostModel]]:
    """Register a cost-model factory under ``name``; refuses a name already taken."""

    def decorator(factory: Callable[[], CostModel]) -> Callable[[], CostModel]:
        if not name or not name.isidentifier():
            raise ValueError(f"cost model name must be an identifier, got {name!r}")
        if name in _REGISTRY:
            raise ValueError(f"cost model {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return decorator


def model_names() -> list[str]:
    """Names of the registered cost models."""
    _load_builtin_models()
    return sorted(_REGISTRY)


def get_model(name: str | CostModel) -> CostModel:
    """A cost model by registered name (or the model itself)."""
    if not isinstance(name, str):
        return name
    _load_builtin_models()
    if name not in _REGISTRY:
        raise ValueError(f"unknown cost model {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]()


def _load_builtin_models() -> None:
    from fxcost.cost_models import roofline  # noqa: F401  (registers itself)


def predict(
    nodes: Sequence[NodeCost], devices: Sequence[str | Device], model: str | CostModel = "roofline"
) -> None:
    """Fill ``pred_ms`` and ``pred_source`` of every record for every device, one vectorized call per device.

    A node the model cannot predict gets ``None`` (unknown, counted in coverage), never zero.
    """
    from fxcost.devices import get_device

    cost_model = get_model(model)
    batch = NodeBatch.of(nodes)
    for spec in devices:
        device = get_device(spec)
        ms = np.asarray(cost_model.predict(batch, device), dtype=np.float64)
        if ms.shape != (len(nodes),):
            raise ValueError(
                f"cost model {cost_model.name!r} returned shape {ms.shape} for {len(nodes)} nodes"
            )
        for node, value in zip(nodes, ms.tolist(), strict=True):
            known = np.isfinite(value)
            node.pred_ms[device.name] = float(value) if known else None
            node.pred_source[device.name] = cost_model.name if known else "unsupported"
