"""Cost models run on one thread (``fxcost._threads``): counts restored, results unchanged."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from fxcost import _threads, zoo
from fxcost._threads import single_threaded
from fxcost.cost_models import NodeBatch, predict_batch
from fxcost.estimator import Estimator
from fxcost.gpus import Device, get_device
from fxcost.records import NodeCost


@pytest.fixture
def two_threads() -> Iterator[None]:
    """torch and numpy's BLAS on two threads for the test (one-core machines included)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        yield
    torch.set_num_threads(before)


def _blas_threads() -> set[int]:
    """numpy's BLAS threads (scipy's own OpenBLAS, loaded by other tests, prices nothing here)."""
    from threadpoolctl import threadpool_info

    return {lib["num_threads"] for lib in threadpool_info()
            if lib["user_api"] == "blas" and "numpy" in lib["filepath"]}  # fmt: skip


def test_inside_everything_runs_on_one_thread_and_the_counts_come_back(two_threads: None) -> None:
    with single_threaded():
        assert torch.get_num_threads() == 1
        assert _blas_threads() == {1}
        with single_threaded():  # nested: the inner exit restores nothing yet
            pass
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    assert _blas_threads() == {2}


def test_the_counts_come_back_after_an_error(two_threads: None) -> None:
    with pytest.raises(ValueError, match="boom"), single_threaded():
        raise ValueError("boom")
    assert torch.get_num_threads() == 2
    assert _blas_threads() == {2}


def test_the_last_thread_out_restores_the_blas_count_each_thread_its_torch_count(two_threads: None) -> None:
    inside, leave = threading.Event(), threading.Event()
    other_after: list[int] = []

    def hold() -> None:
        before = torch.get_num_threads()
        with single_threaded():
            inside.set()
            leave.wait(timeout=10)
        other_after.append(torch.get_num_threads() - before)

    other = threading.Thread(target=hold)
    other.start()
    inside.wait(timeout=10)
    with single_threaded():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    assert _blas_threads() == {1}  # the other thread is still inside
    leave.set()
    other.join()
    assert _blas_threads() == {2}
    assert other_after == [0]


def test_an_estimate_leaves_the_thread_counts_as_it_found_them(two_threads: None) -> None:
    model, inputs = zoo.build("transformer_block", 4, seq=16, dim=64, heads=4)
    est = Estimator(["T4"])
    est.cost(model, inputs, device="H100-SXM", batch_size=8)
    assert torch.get_num_threads() == 2
    assert _blas_threads() == {2}


class _Product:
    """A cost model whose work is a product that OpenBLAS rounds differently on two threads: a
    float32 matrix-vector product of the heads' width, whose rows at the threads' split go through
    another kernel."""

    name = "product"

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((4001, 256)).astype(np.float32)
        self.w = rng.standard_normal((256, 1)).astype(np.float32)
        self.out = np.empty(0)

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        self.out = self.x @ self.w
        return np.ones(len(batch))


def test_predictions_are_those_of_one_thread_whatever_the_callers_counts(two_threads: None) -> None:
    import threadpoolctl

    model = _Product()
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        one = model.x @ model.w
    batch = NodeBatch.of(_nodes())
    predict_batch(batch, [model], get_device("T4"))
    np.testing.assert_array_equal(model.out, one)


def _nodes() -> list[NodeCost]:
    est = Estimator(["T4"])
    model, inputs = zoo.build("mlp", 4)
    return list(est.capture(model, inputs).nodes)


def test_without_threadpoolctl_torch_alone_is_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_threads, "_controller", False)  # as when the import failed
    before = torch.get_num_threads()
    with single_threaded():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
