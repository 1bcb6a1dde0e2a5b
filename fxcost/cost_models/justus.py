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
paper's schedule shape (x0.5 every 40 epochs). Training is :func:`fxcost.train.justus.train_justus`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fxcost.cost_models.heads import head_of
from fxcost.cost_models.interface import NodeBatch, register
from fxcost.cost_models.mlp import MLP, read_mlps, save_mlps
from fxcost.gpus import Device
from fxcost.lowering.nodes import conv_dims, conv_gradients, forward_conv, gemm_dims, is_conv_backward
from fxcost.records import NodeCost

__all__ = ["ARCHITECTURES", "LAYERS", "JustusPredictor", "hardware_features", "layer_features", "layer_of"]

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
        b, m, n, k = gemm_dims(node)
        return [float(b * m), float(k), float(n), *implementation]
    if layer == "conv":
        batch, c_in, c_out, kernel, size, stride = conv_dims(node)
        padding = float((node.args.get("padding") or [0])[0])
        bias = float(len(node.in_shapes) > 2 and bool(node.in_shapes[2]))
        return [float(batch), float(size), float(kernel), float(c_in), float(c_out), float(stride), padding,
                bias, *implementation]  # fmt: skip
    raise ValueError(f"unknown layer type {layer!r}; Justus layers: {', '.join(LAYERS)}")


def layer_of(node: NodeCost) -> str | None:
    """The Justus layer type that predicts ``node`` (GEMMs as fully connected layers), if any."""
    head = head_of(node)
    return head if head in LAYERS else None


class JustusPredictor:
    """Per-layer time predictor of Justus et al.; usable as a cost model (``"justus"``).

    Example:
        >>> from fxcost.train.justus import JustusConfig, train_justus
        >>> justus = train_justus("../shared/data", config=JustusConfig(epochs=30))  # doctest: +SKIP
        >>> justus.predict(batch, get_device("V100-PCIE-32GB"))  # doctest: +SKIP
    """

    name = "justus"

    def __init__(self, networks: dict[str, MLP] | None = None) -> None:
        self.networks = networks or {}

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
        save_mlps(path, self.networks)

    @classmethod
    def load(cls, path: str | Path) -> JustusPredictor:
        with np.load(path) as arrays:
            return cls(read_mlps(arrays, output="softplus"))


def _layer_groups(nodes: Sequence[NodeCost]) -> dict[str, tuple[list[int], list[list[float]], list[int]]]:
    """Nodes by layer type with their layer features; a backward convolution is its forward
    convolution once per gradient it computes (the training data times forward layers only)."""
    groups: dict[str, tuple[list[int], list[list[float]], list[int]]] = {}
    for i, node in enumerate(nodes):
        layer = layer_of(node) if node.has_kernel else None
        if layer is None:
            continue
        backward = is_conv_backward(node)
        try:
            features = layer_features(layer, forward_conv(node) if backward else node)
        except (IndexError, KeyError, TypeError, ValueError):
            continue  # shapes the layer type does not expect: left to the next model in the chain
        index, problem, repeats = groups.setdefault(layer, ([], [], []))
        index.append(i)
        problem.append(features)
        repeats.append(conv_gradients(node) if backward else 1)
    return groups


@register("justus")
def _justus() -> JustusPredictor:
    return JustusPredictor(_shipped_networks())


@functools.cache
def _shipped_networks() -> dict[str, MLP]:
    """The shipped networks, read from the package once per process."""
    from importlib import resources

    weights = resources.files("fxcost.cost_models").joinpath("weights", "justus.npz")
    if not weights.is_file():
        return {}
    with resources.as_file(weights) as path:
        return JustusPredictor.load(path).networks
