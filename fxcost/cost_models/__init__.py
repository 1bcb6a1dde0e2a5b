"""Cost models: given nodes and a target GPU, milliseconds per node.

Every model implements :class:`CostModel` and is vectorized over nodes: it receives a
:class:`NodeBatch` (numpy columns built once from the records) and returns one array of ms, with NaN
where it has no prediction. Models are registered by name through :func:`register`, which refuses
duplicates; :func:`get_model` builds one by name.

Which model predicts a node is a policy (Habitat's hybrid, §3.2). The default, ``"auto"``, is:

- runtime-based, when the nodes were measured on a GPU (the origin): wave scaling for kernel-alike
  ops, which run the same kernels on every GPU, and for kernel-varying ones (matmul, convolution),
  whose libraries pick other kernels on other GPUs, the MLP heads: their ratio between target and
  origin scales the measured time (``mlp_ratio``), or they predict alone where a node has no
  measurement;
- origin-free, when there is no GPU measurement (a CPU laptop, an AutoML loop): the heads for every
  op they cover;
- the roofline for whatever the others leave, a fallback counted in each node's ``pred_source``.

Any name, comma-separated fallback chain or model replaces the policy, and ``overrides`` gives single
ops their own chain (``{"aten.mm.default": "roofline"}``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fxcost.devices import Device
from fxcost.lowering import is_matmul_class
from fxcost.records import NodeCost

__all__ = [
    "AUTO",
    "ORIGIN_FREE",
    "RUNTIME_BASED",
    "CostModel",
    "NodeBatch",
    "chain_name",
    "get_model",
    "model_chain",
    "model_names",
    "predict",
    "predict_batch",
    "register",
]


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
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

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
            itemsize=column([_itemsize(n.out_dtypes or n.in_dtypes) for n in nodes]),
            tf32=np.array([n.tf32 for n in nodes], dtype=bool),
            origin=origin,
        )

    def __len__(self) -> int:
        return len(self.nodes)

    def derived(self, key: str, compute: Callable[[], Any]) -> Any:
        """Device-independent data a model derives from the nodes, computed once per batch and reused
        for every device the batch is predicted on (``predict`` calls models once per device)."""
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]


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
    from fxcost.cost_models import heads, justus, roofline, wave_scaling  # noqa: F401  (they register themselves)


AUTO = "auto"
RUNTIME_BASED = "wave_scaling,mlp_ratio,mlp,roofline"
ORIGIN_FREE = "mlp,roofline"

ModelSpec = str | CostModel | Sequence[str | CostModel]


def model_chain(model: ModelSpec, origin: Device | None = None) -> list[CostModel]:
    """Cost models from a name, a comma-separated fallback chain (``"wave_scaling,roofline"``), a
    model, or a sequence of those. ``"auto"`` is the default policy: :data:`RUNTIME_BASED` when the
    nodes have an ``origin`` GPU, else :data:`ORIGIN_FREE`."""
    if isinstance(model, str):
        if model.strip() == AUTO:
            return model_chain(RUNTIME_BASED if origin is not None else ORIGIN_FREE)
        return [get_model(name.strip()) for name in model.split(",")]
    if isinstance(model, CostModel):
        return [model]
    return [m for item in model for m in model_chain(item, origin)]


def chain_name(chain: Sequence[CostModel]) -> str:
    """The comma-separated name of a fallback chain, as reports store it."""
    return ",".join(m.name for m in chain)


def predict(
    nodes: Sequence[NodeCost],
    devices: Sequence[str | Device],
    model: ModelSpec = AUTO,
    origin: str | Device | None = None,
    overrides: Mapping[str, ModelSpec] | None = None,
) -> None:
    """Fill ``pred_ms`` and ``pred_source`` of every record for every device, one vectorized call each.

    ``model`` may be a sequence: each node takes the first model that predicts it (a fallback chain),
    and its ``pred_source`` names that model. A node no model predicts gets ``None`` (unknown, counted
    in coverage), never zero. ``origin`` is the GPU the nodes were measured on, for runtime-based
    models; anything that is not a known GPU (``"cpu"``) means there is none. ``overrides`` maps ATen
    op names (``"aten.mm.default"``) to the chain their nodes use instead of ``model``.
    """
    from fxcost.devices import UnknownDeviceError, get_device

    try:
        origin_device = get_device(origin) if origin is not None else None
    except UnknownDeviceError:
        origin_device = None
    chains = {op: model_chain(spec, origin_device) for op, spec in (overrides or {}).items()}
    default = model_chain(model, origin_device)
    if not default or not all(chains.values()):
        raise ValueError("predict needs at least one cost model per chain")
    groups: dict[str, list[NodeCost]] = {}  # op (or "" for the default chain) -> its nodes
    for node in nodes:
        groups.setdefault(node.op if node.op in chains else "", []).append(node)
    targets = [get_device(spec) for spec in devices]
    for op, group in groups.items():
        batch = NodeBatch.of(group, origin_device)
        for device in targets:
            ms, source = predict_batch(batch, chains.get(op, default), device)
            for node, value, name in zip(group, ms.tolist(), source.tolist(), strict=True):
                node.pred_ms[device.name] = value if np.isfinite(value) else None
                node.pred_source[device.name] = name


def predict_batch(
    batch: NodeBatch, chain: Sequence[CostModel], device: Device
) -> tuple[np.ndarray, np.ndarray]:
    """Per-node ms of ``batch`` on ``device`` from a fallback chain (NaN where no model predicts), and
    the name of the model that predicted each node (``"unsupported"`` where none did)."""
    ms = np.full(len(batch), np.nan)
    source = np.full(len(batch), "unsupported", dtype=object)
    for cost_model in chain:
        todo = ~np.isfinite(ms)
        if not todo.any():
            break
        predicted = np.asarray(cost_model.predict(batch, device), dtype=np.float64)
        if predicted.shape != (len(batch),):
            raise ValueError(
                f"cost model {cost_model.name!r} returned shape {predicted.shape} for {len(batch)} nodes"
            )
        fill = todo & np.isfinite(predicted)
        ms[fill], source[fill] = predicted[fill], cost_model.name
    return ms, source
