"""The papers' seed predictors: Lattuada et al.'s stepwise regression, Justus et al.'s layer network."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fxcost import cost_models
from fxcost.cost_models.justus import hardware_features
from fxcost.cost_models.lattuada import LattuadaRegression, augment
from fxcost.gpus import get_device
from fxcost.lowering.nodes import conv_node, gemm_node

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


def test_shipped_justus_predicts_both_layer_types() -> None:
    justus = cost_models.get_model("justus")
    nodes = [gemm_node("linear", 1, 1024, 1024, 1024), conv_node(8, 64, 64, 3, 56, 1, 1)]
    v100, t4 = (get_device(d) for d in ("V100-PCIE-32GB", "T4"))
    on_v100 = justus.predict(cost_models.NodeBatch.of(nodes), v100)
    on_t4 = justus.predict(cost_models.NodeBatch.of(nodes), t4)
    assert np.all(np.isfinite(on_v100)) and np.all(on_v100 > 0)
    assert np.all(on_t4 > on_v100)  # a T4 has a third of a V100's FLOPS and bandwidth
