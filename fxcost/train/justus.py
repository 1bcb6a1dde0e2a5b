"""Training Justus et al.'s per-layer networks (§V-VI) on the shared data's training rows.

The networks are :class:`~fxcost.cost_models.mlp.MLP` with a softplus output, fit by the one trainer
(:func:`fxcost.train.mlp.fit`) with the paper's recipe: RMSLE, L2 on every layer, one dropout layer
after the last hidden layer, Adam with a learning rate halved every 40 epochs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fxcost.cost_models.justus import LAYERS, JustusPredictor, hardware_features, layer_features
from fxcost.cost_models.mlp import MLP
from fxcost.data.datasets import row_node
from fxcost.gpus import HELD_OUT_DEVICES, get_device
from fxcost.train import mlp
from fxcost.train.heads import split

__all__ = ["JustusConfig", "examples", "fit", "train_justus"]


@dataclass(frozen=True)
class JustusConfig:
    """Network and schedule (§VI-E: 300 epochs, batch 128, L2 on every layer, one dropout layer).

    The paper's initial learning rate, 0.1, makes Adam diverge on these features; 1e-3 is used, with
    the paper's schedule shape (x0.5 every 40 epochs).
    """

    hidden: tuple[int, ...] = (128, 128, 64)
    dropout: float = 0.2
    l2: float = 1e-4
    epochs: int = 300
    batch: int = 128
    lr: float = 1e-3
    lr_halving_epochs: int = 40
    seed: int = 0

    def recipe(self) -> mlp.Recipe:
        """The network and schedule for :func:`fxcost.train.mlp.fit`."""
        return mlp.Recipe(self.hidden, self.epochs, self.batch, self.lr, self.seed, loss="rmsle",
                          output="softplus", dropout=self.dropout, l2=self.l2, schedule="halving",
                          halving_epochs=self.lr_halving_epochs, clip=False)  # fmt: skip


def train_justus(
    data: str | Path,
    exclude: Sequence[str] = (),
    config: JustusConfig = JustusConfig(),
    progress: Callable[[str, int, int], None] | None = None,
    out: str | Path | None = None,
) -> JustusPredictor:
    """Train both layer networks on ``data``'s training rows (``ops/linear``, ``ops/conv``), GPUs held
    out by DESIGN.md and ``exclude`` left out. With ``out`` (an ``.npz`` path) each finished network
    is saved at once, and a rerun keeps the networks already there."""
    done = JustusPredictor.load(out).networks if out is not None and Path(out).exists() else {}
    networks = dict(done)
    for layer in LAYERS:
        if layer in networks:
            continue
        rows, _ = split([data], layer, exclude=set(HELD_OUT_DEVICES) | set(exclude))
        x, y = examples(rows, layer)
        per_epoch = (
            None if progress is None else (lambda epoch, epochs, layer=layer: progress(layer, epoch, epochs))
        )
        networks[layer] = fit(x, y, config, per_epoch)
        if out is not None:
            JustusPredictor(networks).save(out)
    return JustusPredictor(networks)


def examples(rows: Any, layer: str) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows and measured ms of data-set ``rows`` (see :mod:`fxcost.data.datasets`)."""
    x, y = [], []
    for device_name, group in rows.groupby("device", sort=True):
        hardware = hardware_features(get_device(device_name))
        for row in group.itertuples(index=False):
            x.append([*layer_features(layer, row_node(row)), *hardware])
            y.append(float(row.Latency))
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)


def fit(
    x: np.ndarray, y: np.ndarray, config: JustusConfig, progress: Callable[[int, int], Any] | None = None
) -> MLP:
    """Train one layer network with RMSLE, L2 on every layer, dropout after the last hidden layer."""
    return mlp.fit(x, y, config.recipe(), progress=progress)
