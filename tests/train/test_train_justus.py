"""Training Justus et al.'s networks, and every op-level predictor compared on the same rows."""

from __future__ import annotations

import numpy as np
import pytest

from fxcost import cost_models
from fxcost.cost_models.justus import JustusPredictor
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import get_device
from fxcost.lowering.nodes import conv_node, gemm_node
from fxcost.train.justus import JustusConfig, examples, fit, train_justus

pytest.importorskip("scipy")


def test_justus_trains_deterministically_and_predicts_through_the_cost_model_interface(data_dir) -> None:
    from fxcost.train.heads import split

    rows, _ = split([data_dir], "linear")
    rows = rows.groupby("device").head(300)
    x, y = examples(rows, "linear")
    config = JustusConfig(epochs=3, hidden=(32, 32))
    first, second = fit(x, y, config), fit(x, y, config)
    np.testing.assert_array_equal(first(x), second(x))
    assert np.all(first(x) > 0)
    justus = JustusPredictor({"linear": first})
    nodes = [
        gemm_node("linear", 1, 512, 512, 512),
        kernel_alike_node("gelu", 64, 64),
        conv_node(2, 3, 8, 3, 32, 1, 1),
    ]
    predicted = justus.predict(cost_models.NodeBatch.of(nodes), get_device("T4"))
    assert predicted[0] > 0 and np.isnan(predicted[1]) and np.isnan(predicted[2])  # no conv network given
    cost_models.predict(nodes, ["T4"], [justus, "roofline"])
    assert [n.pred_source["T4"] for n in nodes] == ["justus", "roofline", "roofline"]
    assert justus.batch_ms(nodes, get_device("T4")) == pytest.approx(predicted[0])
    assert justus.epoch_ms(nodes, get_device("T4"), batches=10) == pytest.approx(10 * predicted[0])


def test_justus_training_keeps_finished_networks_across_runs(tmp_path, data_dir, monkeypatch) -> None:
    import fxcost.train.justus as justus_module
    from fxcost.train.heads import split

    calls: list[int] = []
    real_fit = justus_module.fit

    def counting_fit(x, y, config, progress=None):  # type: ignore[no-untyped-def]
        calls.append(len(y))
        return real_fit(x[:200], y[:200], config)

    def small_split(data, head, exclude=()):  # type: ignore[no-untyped-def]
        train_rows, test_rows = split(data, head, exclude)
        return train_rows.groupby("device").head(50), test_rows

    monkeypatch.setattr(justus_module, "fit", counting_fit)
    monkeypatch.setattr("fxcost.train.justus.split", small_split)
    out = tmp_path / "justus.npz"
    first = train_justus(data_dir, config=JustusConfig(epochs=1, hidden=(8,)), out=out)
    assert set(first.networks) == {"linear", "conv"} and len(calls) == 2
    again = train_justus(data_dir, config=JustusConfig(epochs=1, hidden=(8,)), out=out)
    assert len(calls) == 2  # both networks were on disk: nothing retrained
    np.testing.assert_array_equal(again.networks["conv"].weights[0], first.networks["conv"].weights[0])


def test_compare_puts_every_predictor_on_the_same_rows(data_dir) -> None:
    from fxcost.train.compare import MODELS, compare_ops

    table = compare_ops(data_dir, heads=["ln"])
    assert list(table.columns) == [*MODELS, "rows"]
    row = table.loc["ln"]
    assert row["rows"] > 100
    assert np.isnan(row["justus"])  # Justus covers fully connected and convolution layers only
    for column in ("roofline", "habitat", "fxcost", "fxcost_runtime"):
        assert 0 < row[column] < 100


def test_compare_command_prints_one_table(data_dir, capsys) -> None:
    from fxcost.cli import main

    assert main(["compare", "--data", str(data_dir), "--ops", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "roofline" in out and "fxcost_runtime" in out and "softmax" in out
    assert main(["compare", "--data", str(data_dir), "--ops", "lstm"]) == 2
    assert "unknown op classes ['lstm']" in capsys.readouterr().err
