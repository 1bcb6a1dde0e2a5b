"""Which model predicts a node: the prediction policy (Habitat's hybrid, §3.2), and predicting with it.

The default, ``"auto"``, is:

- runtime-based, when the nodes were measured on a GPU (the origin): wave scaling for kernel-alike
  ops, which run the same kernels on every GPU, and for kernel-varying ones (matmul, convolution),
  whose libraries pick other kernels on other GPUs, the origin-free model (``mlp``: tiled GEMMs and
  the MLP heads): its ratio between target and origin scales the measured time (``mlp_ratio``), or
  it predicts alone where a node has no measurement;
- origin-free, when there is no GPU measurement (a CPU laptop, an AutoML loop): that model for every
  op it covers;
- the roofline for whatever the others leave, a fallback counted in each node's ``pred_source``.

Any name, comma-separated fallback chain or model replaces the policy, and ``overrides`` gives single
ops their own chain (``{"aten.mm.default": "roofline"}``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fxcost._threads import single_threaded
from fxcost.cost_models.interface import CostModel, NodeBatch, get_model
from fxcost.gpus import Device, UnknownDeviceError, get_device
from fxcost.records import NodeCost

__all__ = ["AUTO", "ORIGIN_FREE", "RUNTIME_BASED", "ModelSpec", "chain_name", "model_chain", "predict",
           "predict_batch", "spec_name"]  # fmt: skip


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


def spec_name(spec: ModelSpec) -> str:
    """What a report records as its cost model: a name or chain as given (``"auto"`` stays the
    policy), a model or sequence of models by their names."""
    return spec if isinstance(spec, str) else chain_name(model_chain(spec))


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
    the name of the model that predicted each node (``"unsupported"`` where none did).

    Runs on one thread (:func:`fxcost._threads.single_threaded`): the models' arrays are small, and
    a search loop's estimators share the cores with each other."""
    ms = np.full(len(batch), np.nan)
    source = np.full(len(batch), "unsupported", dtype=object)
    with single_threaded():
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
