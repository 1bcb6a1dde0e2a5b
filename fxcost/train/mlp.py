"""The one MLP trainer: the heads and Justus et al.'s networks are fit here, deterministic and resumable.

:func:`fit` standardizes the features, builds ReLU hidden layers (one dropout layer after the last,
if asked), and trains with Adam on mini-batches in a seeded order, on one thread: with two, MKL's
matmuls now and then split their sums differently (about one run in twelve on a 2-core machine), and
many epochs amplify the last bit into different networks, so a resumed run would not equal an
uninterrupted one. The networks are small; one thread costs about 10%. With a checkpoint path, every
epoch is saved and a rerun with the same recipe and rows resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fxcost._io import atomic_write
from fxcost.cost_models.mlp import MLP, Output

__all__ = ["Loss", "Recipe", "Schedule", "fit"]

log = logging.getLogger(__name__)

Loss = Literal["log_l1", "mape", "rmsle"]
Schedule = Literal["cosine", "halving"]


@dataclass(frozen=True)
class Recipe:
    """How to train a network.

    Attributes:
        hidden: widths of the hidden layers.
        epochs, batch, lr, seed: Adam's schedule and the shuffling order.
        loss: ``"log_l1"``, the absolute error of targets that are log time ratios (a relative
            error); ``"mape"``, the relative error of raw times; ``"rmsle"``, the root mean squared
            error of ``log(1 + t)`` (Justus et al.).
        output: the network's output activation (``"softplus"`` keeps times positive).
        dropout: the dropout rate of a layer after the last hidden layer (0: none).
        l2: the weight of the squared weights of every layer added to the loss.
        schedule: ``"cosine"`` annealing over the epochs, or ``"halving"`` the learning rate every
            ``halving_epochs``.
        clip: record the features' range, to which the network clips its inputs.
    """

    hidden: tuple[int, ...]
    epochs: int
    batch: int
    lr: float
    seed: int = 0
    loss: Loss = "log_l1"
    output: Output = "linear"
    dropout: float = 0.0
    l2: float = 0.0
    schedule: Schedule = "cosine"
    halving_epochs: int = 40
    clip: bool = True


def fit(
    x: np.ndarray,
    y: np.ndarray,
    recipe: Recipe,
    *,
    checkpoint: Path | None = None,
    fingerprint: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MLP:
    """Fit a network to features ``x`` and targets ``y`` by ``recipe``.

    Args:
        checkpoint: saved after every epoch; a run finding one of the same recipe, rows, features
            and ``fingerprint`` resumes from it.
        fingerprint: what else the checkpoint must match (a feature version).
        progress: called as ``progress(epochs_done, epochs)``.
    """
    import torch

    torch.manual_seed(recipe.seed)
    generator = torch.Generator().manual_seed(recipe.seed)
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-9
    xs = torch.tensor((x - mean) / std, dtype=torch.float32)
    ys = torch.tensor(y, dtype=torch.float32)
    net = _network(xs.shape[1], recipe)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    optimizer = torch.optim.Adam(net.parameters(), lr=recipe.lr)
    schedule: Any
    if recipe.schedule == "cosine":
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=recipe.epochs)
    else:
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=recipe.halving_epochs, gamma=0.5)
    identity = {"recipe": asdict(recipe), "rows": len(ys), "features": xs.shape[1], **(fingerprint or {})}
    start = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        if state.get("identity") == identity:
            net.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            schedule.load_state_dict(state["schedule"])
            generator.set_state(state["generator"])
            torch.set_rng_state(state["rng"])
            start = state["epoch"]
        else:
            log.warning(
                "%s is of another recipe, data or fxcost version: training from the start", checkpoint
            )
    with _one_thread():
        for epoch in range(start, recipe.epochs):
            net.train()
            order = torch.randperm(len(ys), generator=generator)
            for i in range(0, len(ys), recipe.batch):
                index = order[i : i + recipe.batch]
                optimizer.zero_grad()
                objective = _loss(recipe, net(xs[index])[:, 0], ys[index])
                if recipe.l2:
                    objective = objective + recipe.l2 * sum(m.weight.pow(2).sum() for m in linears)
                objective.backward()
                optimizer.step()
            schedule.step()
            if checkpoint is not None:
                state = {"identity": identity, "epoch": epoch + 1, "model": net.state_dict(),
                         "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                         "generator": generator.get_state(), "rng": torch.get_rng_state()}  # fmt: skip
                atomic_write(checkpoint, functools.partial(torch.save, state))
            if progress is not None:
                progress(epoch + 1, recipe.epochs)
    return MLP(
        mean=mean,
        std=std,
        weights=tuple(m.weight.detach().double().numpy().T.copy() for m in linears),
        biases=tuple(m.bias.detach().double().numpy().copy() for m in linears),
        low=x.min(axis=0) if recipe.clip else None,
        high=x.max(axis=0) if recipe.clip else None,
        output=recipe.output,
    )


def _network(features: int, recipe: Recipe) -> Any:
    """ReLU hidden layers, a dropout layer after the last if asked, one linear output."""
    import torch

    layers: list[torch.nn.Module] = []
    width = features
    for i, hidden in enumerate(recipe.hidden):
        layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        if recipe.dropout and i == len(recipe.hidden) - 1:
            layers.append(torch.nn.Dropout(recipe.dropout))
        width = hidden
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def _loss(recipe: Recipe, out: Any, target: Any) -> Any:
    import torch

    predicted = torch.nn.functional.softplus(out) if recipe.output == "softplus" else out
    if recipe.loss == "rmsle":
        return torch.sqrt(torch.mean((torch.log1p(predicted) - torch.log1p(target)) ** 2) + 1e-12)
    error = (predicted - target).abs()
    return (error / target).mean() if recipe.loss == "mape" else error.mean()


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
