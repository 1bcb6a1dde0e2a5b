"""The papers' seed predictors: Lattuada et al.'s stepwise regression, Justus et al.'s layer network."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fxcost import cost_models
from fxcost.cost_models.justus import JustusPredictor, hardware_features
from fxcost.cost_models.lattuada import LattuadaRegression, augment
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import get_device
from fxcost.lowering.nodes import conv_node, gemm_node
from fxcost.train.justus import JustusConfig, examples, fit, train_justus

pytest.importorskip("scipy")


def _runs(n: int = 40, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 64, n).astype(float)
    p = rng.choice([5500.0, 9300.0, 14000.0], n)
    layers = rng.integers(6, 50, n).astype(float)
    time_s = 3 + 2e3 * b * layers / p + rng.normal(0, 0.05, n)
    return pd.DataFrame({"B": b, "P": p, "N": layers, "G": 1.0, "time_s": time_s})


def test_augmentation_follows_the_papers_rules() -> None:
    terms = augment(["B", "P", "N"])
    assert len(terms) == 3**3 - 1  # each variable absent, itself or its reciprocal; not all absent
    names = {t.name for t in terms}
    assert {"B", "1/P", "B*N/P", "1/(B*P)"} <= names
    assert all(len({v for v, _ in t.powers}) == len(t.powers) for t in terms)  # never x with 1/x


def test_stepwise_regression_recovers_the_generating_term() -> None:
    runs = _runs().assign(device=pd.array(["V100"] * 40, dtype="string"))  # text columns are not features
    model = LattuadaRegression().fit(runs, target="time_s")
    assert model.features == ["B", "P", "N"]  # G is constant: no information, left out
    assert model.terms[0].name == "B*N/P"
    assert model.coefficients[0] == pytest.approx(3, abs=0.1)
    test = _runs(seed=1)
    error = np.abs(model.predict(test) - test["time_s"]) / test["time_s"]
    assert error.max() < 0.02
    assert "B*N/P" in model.summary()


def test_regression_rejects_bad_tables() -> None:
    runs = _runs()
    with pytest.raises(ValueError, match="no target column 'seconds'"):
        LattuadaRegression().fit(runs, target="seconds")
    with pytest.raises(ValueError, match="must be finite and positive"):
        LattuadaRegression().fit(runs.assign(B=0.0), target="time_s")
    with pytest.raises(ValueError, match="at least 3 runs"):
        LattuadaRegression().fit(runs.head(2), target="time_s")
    with pytest.raises(ValueError, match="not fitted"):
        LattuadaRegression().predict(runs)


def test_fit_runs_command(tmp_path, capsys) -> None:
    from fxcost.cli import main

    path = tmp_path / "runs.csv"
    _runs().to_csv(path, index=False)
    assert main(["fit-runs", str(path), "--target", "time_s"]) == 0
    out = capsys.readouterr().out
    assert "B*N/P" in out and "in-sample MAPE" in out
    assert main(["fit-runs", str(path), "--target", "nope"]) == 2


def test_justus_hardware_features_from_the_spec_sheet() -> None:
    v100 = hardware_features(get_device("V100-PCIE-32GB"))
    arch, rest = v100[:8], v100[8:]
    assert arch[2] == 1.0 and sum(arch) == 1.0  # Volta
    count, memory, clock, bandwidth, cores, gflops = rest[:6]
    assert (count, memory, bandwidth) == (1.0, 32.0, 900.0)
    assert cores == pytest.approx(5120, rel=0.02)
    assert gflops == pytest.approx(2 * cores * clock / 1e3)


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


def test_compare_puts_every_predictor_on_the_same_rows(data_dir) -> None:
    from fxcost.train.compare import MODELS, compare_ops

    table = compare_ops(data_dir, heads=["ln"])
    assert list(table.columns) == [*MODELS, "rows"]
    row = table.loc["ln"]
    assert row["rows"] > 100
    assert np.isnan(row["justus"])  # Justus covers fully connected and convolution layers only
    for column in ("roofline", "habitat", "fxcost", "fxcost_runtime"):
        assert 0 < row[column] < 100


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


def test_compare_command_prints_one_table(data_dir, capsys) -> None:
    from fxcost.cli import main

    assert main(["compare", "--data", str(data_dir), "--ops", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "roofline" in out and "fxcost_runtime" in out and "softmax" in out
    assert main(["compare", "--data", str(data_dir), "--ops", "lstm"]) == 2
    assert "unknown op classes ['lstm']" in capsys.readouterr().err


def test_shipped_justus_predicts_both_layer_types() -> None:
    justus = cost_models.get_model("justus")
    nodes = [gemm_node("linear", 1, 1024, 1024, 1024), conv_node(8, 64, 64, 3, 56, 1, 1)]
    v100, t4 = (get_device(d) for d in ("V100-PCIE-32GB", "T4"))
    on_v100 = justus.predict(cost_models.NodeBatch.of(nodes), v100)
    on_t4 = justus.predict(cost_models.NodeBatch.of(nodes), t4)
    assert np.all(np.isfinite(on_v100)) and np.all(on_v100 > 0)
    assert np.all(on_t4 > on_v100)  # a T4 has a third of a V100's FLOPS and bandwidth
