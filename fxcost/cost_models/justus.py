"""Justus et al.: a feed-forward network per layer type predicting a layer's time from its features.

Following §IV-VI of the paper, one network per layer type (fully connected = ``linear`` in the data,
convolution = ``conv``) maps three groups of features to the layer's execution time:

- layer features (§IV-A/B): the batch size and the layer's dims (fully connected: inputs and
  neurons; convolution: matrix size, kernel size, input and output depth, stride, padding, bias),
  plus the activation and optimiser one-hots. The shared measurements time the bare forward op, so
  the activation is always "none" and no optimiser runs: those one-hots are constant in our training
  data and the optimiser's cost comes from the graph's own optimizer nodes (other models predict
  them in a chain such as ``"justus,roofline"``);
- hardware features (§IV-C): architecture one-hot, GPU count, memory, clock, memory bandwidth, CUDA
  core count, peak GFLOPS, interconnect one-hot — spec-sheet values from fxcost's device database.

The network (§V-B, §VI-E): ReLU hidden layers, one dropout layer after the last hidden layer, L2
regularisation on every layer, root mean square logarithmic error as the loss, Adam with a learning
rate halved every 40 epochs. Inputs are standardized; the output goes through a softplus so that
times stay positive (RMSLE needs ``pred > -1``; the paper does not say how it ensured it). Per-layer
predictions add up to a batch's time and times the number of batches to an epoch (§V-C):
:meth:`JustusPredictor.batch_ms`, :meth:`JustusPredictor.epoch_ms`.

The paper's initial learning rate, 0.1, makes Adam diverge on these features; 1e-3 is used, with the
paper's schedule shape (x0.5 every 40 epochs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fxcost.cost_models import NodeBatch, register
from fxcost.devices import Device
from fxcost.records import NodeCost

__all__ = ["ARCHITECTURES", "JustusConfig", "JustusPredictor", "hardware_features", "layer_features"]

LAYERS = ("linear", "conv")
ARCHITECTURES = ("Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper", "Blackwell")
ACTIVATIONS = ("none", "relu", "sigmoid", "tanh")
OPTIMISERS = ("sgd", "adadelta", "adagrad", "momentum", "adam", "rmsprop")
INTERCONNECTS = ("pcie3", "pcie4", "pcie5", "nvlink")


def hardware_features(device: Device) -> list[float]:
    """§IV-C: architecture one-hot, GPU count, memory GB, clock MHz, bandwidth GB/s, CUDA cores, peak
    GFLOPS, interconnect one-hot."""
    values = (device.memory_gb, device.boost_clock_mhz, device.mem_bandwidth_gbps, device.fp32_tflops)
    if any(v is None for v in values):
        raise ValueError(f"{device.name} lacks a spec value Justus's features need")
    memory, clock, bandwidth, tflops = (float(v) for v in values)  # type: ignore[arg-type]
    cores = tflops * 1e12 / (2 * clock * 1e6)  # two FLOPs per core per clock (FMA)
    arch = [float(a.lower() in str(device.architecture).lower()) for a in ARCHITECTURES]
    link = "nvlink" if device.nvlink_bandwidth_gbps else f"pcie{device.pcie_gen or 3}"
    interconnect = [float(link == i) for i in INTERCONNECTS]
    return [*arch, 1.0, memory, clock, bandwidth, cores, tflops * 1e3, *interconnect]


def layer_features(layer: str, node: NodeCost) -> list[float]:
    """§IV-A/B for a fully connected (GEMM) or convolution node, as measured in the data: a forward
    op with no activation and no optimiser step."""
    implementation = [float(a == "none") for a in ACTIVATIONS] + [0.0] * len(OPTIMISERS)
    if layer == "linear":
        from fxcost.cost_models.heads import _gemm_dims

        b, m, n, k = _gemm_dims(node)
        return [float(b * m), float(k), float(n), *implementation]
    if layer == "conv":
        from fxcost.cost_models.heads import _conv_dims

        batch, c_in, c_out, kernel, size, stride = _conv_dims(node)
        padding = float((node.args.get("padding") or [0])[0])
        bias = float(len(node.in_shapes) > 2 and bool(node.in_shapes[2]))
        return [float(batch), float(size), float(kernel), float(c_in), float(c_out), float(stride), padding,
                bias, *implementation]  # fmt: skip
    raise ValueError(f"unknown layer type {layer!r}; Justus layers: {', '.join(LAYERS)}")


def layer_of(node: NodeCost) -> str | None:
    """The Justus layer type that predicts ``node`` (GEMMs as fully connected layers), if any."""
    from fxcost.cost_models.heads import head_of

    head = head_of(node)
    return head if head in LAYERS else None


@dataclass(frozen=True)
class JustusConfig:
    """Network and schedule (§VI-E: 300 epochs, batch 128, L2 on every layer, one dropout layer)."""

    hidden: tuple[int, ...] = (128, 128, 64)
    dropout: float = 0.2
    l2: float = 1e-4
    epochs: int = 300
    batch: int = 128
    lr: float = 1e-3
    lr_halving_epochs: int = 40
    seed: int = 0


@dataclass
class _Network:
    mean: np.ndarray
    std: np.ndarray
    weights: list[np.ndarray]
    biases: list[np.ndarray]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = (x - self.mean) / self.std
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return np.logaddexp(0.0, h[:, 0])  # softplus: positive ms


class JustusPredictor:
    """Per-layer time predictor of Justus et al.; usable as a cost model (``"justus"``).

    Example:
        >>> justus = JustusPredictor.train_on("../shared/data", epochs=30)  # doctest: +SKIP
        >>> justus.predict(batch, get_device("V100-PCIE-32GB"))  # doctest: +SKIP
    """

    name = "justus"

    def __init__(self, networks: dict[str, _Network] | None = None) -> None:
        self.networks = networks or {}

    # -- training --------------------------------------------------------------------------------

    @classmethod
    def train_on(
        cls,
        data: str | Path,
        exclude: Sequence[str] = (),
        config: JustusConfig = JustusConfig(),
        progress: Callable[[str, int, int], None] | None = None,
        out: str | Path | None = None,
    ) -> JustusPredictor:
        """Train both layer networks on ``data``'s training rows (``ops/linear``, ``ops/conv``), GPUs
        held out by DESIGN.md and ``exclude`` left out. With ``out`` (an ``.npz`` path) each finished
        network is saved at once, and a rerun keeps the networks already there."""
        from fxcost.training import HELD_OUT_DEVICES, split

        done = cls.load(out).networks if out is not None and Path(out).exists() else {}
        networks = dict(done)
        for layer in LAYERS:
            if layer in networks:
                continue
            rows, _ = split([data], layer, exclude=set(HELD_OUT_DEVICES) | set(exclude))
            x, y = examples(rows, layer)
            networks[layer] = fit(x, y, config, _labelled(progress, layer))
            if out is not None:
                cls(networks).save(out)
        return cls(networks)

    # -- the cost-model interface ----------------------------------------------------------------

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        out = np.where(batch.has_kernel, np.nan, 0.0)
        try:
            hardware = hardware_features(device)
        except ValueError:
            return out
        groups = batch.derived("justus.layers", lambda: _layer_groups(batch.nodes))
        for layer, (index, problem, repeats) in groups.items():
            if layer in self.networks:
                x = np.asarray([[*p, *hardware] for p in problem], dtype=np.float64)
                out[index] = self.networks[layer](x) * np.asarray(repeats)
        return out

    def batch_ms(self, nodes: Sequence[NodeCost], device: Device) -> float:
        """§V-C: a batch's time, the sum of its layers' predictions (layers Justus covers)."""
        return float(np.nansum(self.predict(NodeBatch.of(nodes), device)))

    def epoch_ms(self, nodes: Sequence[NodeCost], device: Device, batches: int) -> float:
        """§V-C: an epoch of ``batches`` batches."""
        return self.batch_ms(nodes, device) * batches

    # -- persistence -----------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the networks to ``path`` (``.npz``), atomically."""
        from fxcost._io import atomic_write

        arrays: dict[str, np.ndarray] = {}
        for layer, net in self.networks.items():
            arrays[f"{layer}/mean"], arrays[f"{layer}/std"] = net.mean, net.std
            for i, (w, b) in enumerate(zip(net.weights, net.biases, strict=True)):
                arrays[f"{layer}/w{i}"], arrays[f"{layer}/b{i}"] = w, b
        atomic_write(path, lambda f: np.savez_compressed(f, **arrays))  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: str | Path) -> JustusPredictor:
        with np.load(path) as arrays:
            networks = {}
            for layer in sorted({k.split("/")[0] for k in arrays.files}):
                depth = sum(1 for k in arrays.files if k.startswith(f"{layer}/w"))
                weights = [arrays[f"{layer}/w{i}"] for i in range(depth)]
                biases = [arrays[f"{layer}/b{i}"] for i in range(depth)]
                networks[layer] = _Network(arrays[f"{layer}/mean"], arrays[f"{layer}/std"], weights, biases)
        return cls(networks)


def examples(rows: Any, layer: str) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows and measured ms of data-set ``rows`` (see :mod:`fxcost.datasets`)."""
    from fxcost.datasets import row_node
    from fxcost.devices import get_device

    x, y = [], []
    for device_name, group in rows.groupby("device", sort=True):
        hardware = hardware_features(get_device(device_name))
        for row in group.itertuples(index=False):
            x.append([*layer_features(layer, row_node(row)), *hardware])
            y.append(float(row.Latency))
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)


def fit(
    x: np.ndarray, y: np.ndarray, config: JustusConfig, progress: Callable[[int, int], Any] | None = None
) -> _Network:
    """Train one layer network with RMSLE, L2 on every layer, dropout after the last hidden layer."""
    import torch

    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-9
    xs = torch.tensor((x - mean) / std, dtype=torch.float32)
    ys = torch.tensor(y, dtype=torch.float32)
    layers: list[torch.nn.Module] = []
    width = xs.shape[1]
    for i, hidden in enumerate(config.hidden):
        layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        if i == len(config.hidden) - 1:
            layers.append(torch.nn.Dropout(config.dropout))
        width = hidden
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=config.lr_halving_epochs, gamma=0.5)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    for epoch in range(config.epochs):
        net.train()
        order = torch.randperm(len(ys), generator=generator)
        for start in range(0, len(ys), config.batch):
            index = order[start : start + config.batch]
            predicted = torch.nn.functional.softplus(net(xs[index])[:, 0])
            rmsle = torch.sqrt(torch.mean((torch.log1p(predicted) - torch.log1p(ys[index])) ** 2) + 1e-12)
            l2 = sum(m.weight.pow(2).sum() for m in linears)
            optimizer.zero_grad()
            (rmsle + config.l2 * l2).backward()
            optimizer.step()
        schedule.step()
        if progress is not None:
            progress(epoch + 1, config.epochs)
    return _Network(mean, std, [m.weight.detach().double().numpy().T.copy() for m in linears],
                    [m.bias.detach().double().numpy().copy() for m in linears])  # fmt: skip


def _labelled(
    progress: Callable[[str, int, int], None] | None, label: str
) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(label, done, total)


def _layer_groups(nodes: Sequence[NodeCost]) -> dict[str, tuple[list[int], list[list[float]], list[int]]]:
    """Nodes by layer type with their layer features; a backward convolution is its forward
    convolution once per gradient it computes (the training data times forward layers only)."""
    from fxcost.cost_models.heads import _conv_gradients, _forward_conv, _is_backward

    groups: dict[str, tuple[list[int], list[list[float]], list[int]]] = {}
    for i, node in enumerate(nodes):
        layer = layer_of(node) if node.has_kernel else None
        if layer is None:
            continue
        backward = _is_backward(node)
        try:
            features = layer_features(layer, _forward_conv(node) if backward else node)
        except (IndexError, KeyError, TypeError, ValueError):
            continue  # shapes the layer type does not expect: left to the next model in the chain
        index, problem, repeats = groups.setdefault(layer, ([], [], []))
        index.append(i)
        problem.append(features)
        repeats.append(_conv_gradients(node) if backward else 1)
    return groups


@register("justus")
def _justus() -> JustusPredictor:
    return JustusPredictor(_shipped_networks())


@functools.cache
def _shipped_networks() -> dict[str, _Network]:
    """The shipped networks, read from the package once per process."""
    from importlib import resources

    weights = resources.files("fxcost.cost_models").joinpath("weights", "justus.npz")
    if not weights.is_file():
        return {}
    with resources.as_file(weights) as path:
        return JustusPredictor.load(path).networks
