"""What no printout may show, checked over the zoo's whole training steps: a GPU predicted slower
than one it beats on every spec, or a larger batch predicted faster.

Found by a user before the origin-free model was bounded: the L4 was predicted fastest in 41 of 44
zoo reports, and a convolution with 97x the FLOPs came out 7x faster. Node-level guarantees
(``heads/axis.py``, ``heads/envelope.py``) hold per op; these tests check that what a user reads,
the eager step, keeps them.
"""

from __future__ import annotations

import pytest

from fxcost import zoo
from fxcost.estimator import Estimator
from fxcost.gpus import get_device
from fxcost.gpus.order import comparable, weaker_than

SMALL_ZOO = {
    "mlp": dict(batch=4, features=32, hidden=64, layers=3, classes=10),
    "lstm": dict(batch=2, seq=6, vocab=50, embed=16, hidden=16),
    "transformer_block": dict(batch=2, seq=8, dim=32, heads=4),
    "gpt2": dict(batch=2, seq=8, vocab=64, dim=32, heads=4, layers=2),
    "resnet50": dict(batch=2, image=32, width=8),
}
BATCHES = (2, 4, 8, 16)
GPUS = [d.name for d in comparable()]


@pytest.fixture(scope="module")
def steps() -> dict[str, dict[int, dict[str, float]]]:
    """Each model's predicted eager step (ms) by batch and GPU."""
    estimator = Estimator(GPUS)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for name, config in SMALL_ZOO.items():
        model, inputs = zoo.build(name, **config)
        out[name] = {b: {g: estimator.cost(model, inputs, device=g, batch_size=b).ms for g in GPUS}
                     for b in BATCHES}  # fmt: skip
    return out


@pytest.mark.slow
def test_no_gpu_is_predicted_slower_than_one_it_beats(steps) -> None:
    slower = [
        (name, batch, gpu, weaker.name)
        for name, by_batch in steps.items()
        for batch, ms in by_batch.items()
        for gpu in GPUS
        for weaker in weaker_than(get_device(gpu))
        if weaker.name in ms and ms[gpu] > ms[weaker.name] * (1 + 1e-12)
    ]
    assert not slower, f"{len(slower)} steps predicted slower on the stronger GPU, e.g. {slower[:3]}"


def _dips(steps, tolerance: float) -> list[tuple[str, int, str, float]]:
    """(model, batch, GPU, drop) where doubling the batch to ``batch`` made the step faster."""
    return [
        (name, batch, gpu, 1 - by_batch[batch][gpu] / by_batch[batch // 2][gpu])
        for name, by_batch in steps.items()
        for batch in BATCHES[1:]
        for gpu in GPUS
        if by_batch[batch][gpu] < by_batch[batch // 2][gpu] * (1 - tolerance)
    ]


@pytest.mark.slow
def test_a_larger_batch_is_never_predicted_much_faster(steps) -> None:
    """The gross errors users found (7x faster for 97x the work) fail here."""
    dips = _dips(steps, tolerance=0.02)
    assert not dips, f"{len(dips)} batch doublings predicted over 2% faster, e.g. {dips[:3]}"


@pytest.mark.slow
def test_a_larger_batch_is_never_predicted_faster(steps) -> None:
    """Not by the smallest margin: a weight gradient's GEMM carries the batch in its inner dimension,
    which the tiled GEMMs are monotone in (the MLP heads' batch tables were not: steps of small
    models got up to 1.2% faster as the batch doubled)."""
    dips = _dips(steps, tolerance=1e-12)
    assert not dips, f"{len(dips)} batch doublings predicted faster, e.g. {dips[:3]}"
