"""The one MLP the heads and Justus et al.'s networks run: inference, clipping, files."""

from __future__ import annotations

import numpy as np
import pytest

from fxcost.cost_models.heads import load_heads
from fxcost.cost_models.justus import JustusPredictor
from fxcost.cost_models.mlp import MLP, read_mlps, save_mlps


def _mlp(output: str = "linear", clip: bool = True) -> MLP:
    rng = np.random.default_rng(0)
    w0, w1 = rng.normal(size=(3, 8)), rng.normal(size=(8, 1))
    low, high = (np.full(3, -1.0), np.full(3, 1.0)) if clip else (None, None)
    return MLP(np.zeros(3), np.ones(3), (w0, w1), (np.zeros(8), np.zeros(1)), low, high, output)  # type: ignore[arg-type]


def test_a_clipped_network_saturates_beyond_its_training_range() -> None:
    x = np.array([[0.5, -0.5, 0.2], [50.0, -50.0, 20.0]])
    clipped, free = _mlp()(x), _mlp(clip=False)(x)
    assert clipped[1] == pytest.approx(_mlp()(np.array([[1.0, -1.0, 1.0]]))[0])
    assert clipped[0] == pytest.approx(free[0]) and clipped[1] != pytest.approx(free[1])


def test_softplus_outputs_are_positive_and_single_precision_agrees() -> None:
    x = np.random.default_rng(1).normal(size=(64, 3)) * 5
    assert (_mlp("softplus")(x) > 0).all()
    np.testing.assert_allclose(_mlp().single(x), _mlp()(x), rtol=1e-5, atol=1e-5)


def test_networks_read_back_as_they_were_saved(tmp_path) -> None:
    nets = {"a": _mlp(), "b": _mlp(clip=False)}
    path = save_mlps(tmp_path / "nets.npz", nets, extra={"version": np.array(3)})
    with np.load(path) as arrays:
        back = read_mlps(arrays)
    assert set(back) == {"a", "b"} and back["b"].low is None
    x = np.random.default_rng(2).normal(size=(8, 3)) * 3
    for name, net in nets.items():
        np.testing.assert_array_equal(back[name](x), net(x))


def test_the_heads_and_justus_run_the_same_network_class() -> None:
    heads = load_heads()
    justus = JustusPredictor.load(
        __import__("importlib.resources").resources.files("fxcost.cost_models") / "weights" / "justus.npz"
    )
    assert all(isinstance(m, MLP) and m.output == "softplus" and m.low is not None for m in heads.values())
    assert all(
        isinstance(m, MLP) and m.output == "softplus" and m.low is None for m in justus.networks.values()
    )
