"""Training the MLP heads: deterministic, resumable, held-out GPUs left out (``fxcost train``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import fxcost
from fxcost.cost_models.heads import Heads, load_heads
from fxcost.cost_models.heads.weights import clocked_watts
from fxcost.train.heads import Examples, TrainConfig, fit, train

WEIGHTS = Path(fxcost.__file__).parent / "cost_models" / "weights"


def test_numpy_inference_matches_the_trained_network() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 5))
    y = x @ rng.normal(size=5) * 0.3
    ex = Examples(x, y, np.ones(256), np.exp(y), np.array(["T4"] * 256, dtype=object))
    model = fit(ex, TrainConfig(layers=2, width=16, epochs=3, batch=64))
    torch.manual_seed(0)
    assert model(x).shape == (256,)
    inside = model(x[:3])
    clipped = model(np.clip(x[:3] * 100, model.low, model.high))
    np.testing.assert_allclose(model(x[:3] * 100), clipped)  # beyond the training range: saturates
    assert np.isfinite(inside).all()


def _tiny_examples(n: int = 300) -> Examples:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 4))
    y = np.tanh(x[:, 0]) + 0.1 * x[:, 1]
    return Examples(x, y, np.ones(n), np.exp(y), np.array(["T4"] * n, dtype=object))


def test_training_is_deterministic_and_resumes_after_an_interruption(tmp_path) -> None:
    ex, config = _tiny_examples(), TrainConfig(layers=2, width=16, epochs=4, batch=64, seed=3)
    once = fit(ex, config)
    again = fit(ex, config)
    for a, b in zip(once.weights, again.weights, strict=True):
        np.testing.assert_array_equal(a, b)

    class Interrupted(Exception):
        pass

    def stop_after_two(head: str, epoch: int, epochs: int) -> None:
        if epoch == 2:
            raise Interrupted

    checkpoint = tmp_path / "head.pt"
    with pytest.raises(Interrupted):
        fit(ex, config, checkpoint, progress=stop_after_two)
    assert torch.load(checkpoint, weights_only=False)["epoch"] == 2
    resumed = fit(ex, config, checkpoint)
    for a, b in zip(once.weights, resumed.weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def _tiny_data(root: Path, data_dir: Path, op: str = "ln") -> Path:
    """A data directory of the shared layout holding a few rows of ``op`` (``ln``: and its test rows)
    of two GPUs."""
    for sub in (f"ops/{op}", "ops_test"):
        (root / "neusight" / sub).mkdir(parents=True)
    for name in ("Tesla_T4.csv", "Tesla_P4.csv"):
        rows = pd.read_csv(data_dir / "neusight" / "ops" / op / name).head(120)
        rows.to_csv(root / "neusight" / "ops" / op / name, index=False)
    if op == "ln":
        test = pd.read_csv(data_dir / "neusight" / "ops_test" / "ln.csv")
        test = test[test["Device"].isin(["Tesla T4", "Tesla P4"])].head(20)
        test.to_csv(root / "neusight" / "ops_test" / "ln.csv", index=False)
    return root


def test_train_command_writes_heads_and_manifest(tmp_path, data_dir, capsys, monkeypatch) -> None:
    from fxcost.cli import main

    data = _tiny_data(tmp_path / "data", data_dir)
    out = tmp_path / "heads"
    argv = ["train", "--data", str(data), "--out", str(out), "--ops", "ln", "--epochs", "2", "--seed", "1"]
    assert main(argv) == 0
    assert "ln" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["heads"]["ln"]["devices"] == ["P4", "T4"]
    assert manifest["heads"]["ln"]["test_rows"] == 20
    assert set(load_heads(out)) == {"ln"}
    before = load_heads(out)["ln"]

    def no_training(*args, **kwargs):
        raise AssertionError("a finished head was trained again")

    monkeypatch.setattr("fxcost.train.heads.fit", no_training)
    assert main(argv) == 0  # finished heads are kept, only re-evaluated
    np.testing.assert_array_equal(load_heads(out)["ln"].weights[0], before.weights[0])


def test_train_leaves_held_out_gpus_out_unless_asked(tmp_path, data_dir, capsys) -> None:
    """Rows a user collected on an H100 are held out of training by default, and said to be."""
    from fxcost.cli import main

    data = _tiny_data(tmp_path / "data", data_dir)
    mine = tmp_path / "mine" / "ops" / "ln"
    mine.mkdir(parents=True)
    rows = pd.read_csv(data / "neusight" / "ops" / "ln" / "Tesla_T4.csv").assign(
        Device="NVIDIA H100 80GB HBM3"
    )
    rows.to_csv(mine / "NVIDIA_H100_80GB_HBM3.csv", index=False)
    argv = ["train", "--data", str(data), "--data", str(tmp_path / "mine"), "--ops", "ln", "--epochs", "1"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert "ln: leaving out H100-SXM (120 rows): held out" in capsys.readouterr().out
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["heads"]["ln"]["devices"] == [
        "P4",
        "T4",
    ]
    assert main([*argv, "--out", str(tmp_path / "b"), "--include-held-out"]) == 0
    assert "leaving out" not in capsys.readouterr().out
    devices = json.loads((tmp_path / "b" / "manifest.json").read_text())["heads"]["ln"]["devices"]
    assert devices == ["H100-SXM", "P4", "T4"]


def test_train_rejects_bad_input(tmp_path, data_dir) -> None:
    with pytest.raises(ValueError, match="unknown heads"):
        train([data_dir], tmp_path, heads=["lstm"])
    with pytest.raises(FileNotFoundError, match="no ops/ or ops_test/"):
        train([tmp_path / "nothing"], tmp_path / "out", heads=["ln"])
    bad = tmp_path / "bad" / "neusight" / "ops" / "ln"
    bad.mkdir(parents=True)
    (bad / "Tesla_T4.csv").write_text("OPName,Device\nln,Tesla T4\n")
    with pytest.raises(ValueError, match="missing columns"):
        train([tmp_path / "bad"], tmp_path / "out2", heads=["ln"])
    (bad / "Tesla_T4.csv").write_text("OPName,Latency,Device,B,H\nln,0.5,Tesla T4,8,8\nln,-1,Tesla T4,8,16\n")
    with pytest.raises(ValueError, match=r"non-positive latencies in rows \[1\]"):
        train([tmp_path / "bad"], tmp_path / "out3", heads=["ln"])


@pytest.mark.slow
def test_train_killed_mid_run_resumes_to_the_same_heads(tmp_path, data_dir) -> None:
    import signal
    import subprocess
    import sys
    import time

    import torch

    command = [sys.executable, "-m", "fxcost.cli", "train", "--data", str(data_dir), "--ops", "ln",
               "--epochs", "120", "--out"]  # fmt: skip
    killed = tmp_path / "killed"
    process = subprocess.Popen([*command, str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = killed / "checkpoints" / "ln.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if checkpoint.exists() and torch.load(checkpoint, weights_only=False)["epoch"] >= 3:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    epoch = torch.load(checkpoint, weights_only=False)["epoch"]
    assert 3 <= epoch < 120, "the run was not interrupted mid-training"
    assert subprocess.run([*command, str(killed)], capture_output=True).returncode == 0
    straight = tmp_path / "straight"
    assert subprocess.run([*command, str(straight)], capture_output=True).returncode == 0
    resumed, reference = load_heads(killed)["ln"], load_heads(straight)["ln"]
    for a, b in zip(resumed.weights, reference.weights, strict=True):
        np.testing.assert_array_equal(a, b)  # nothing lost, nothing trained twice


def test_an_older_gemm_fit_is_fit_again_when_training_resumes(tmp_path, data_dir, monkeypatch) -> None:
    """A ``gemm.json`` of the base-clock model (``kappa``, no ``watts``) cannot be read: resuming into
    its folder fits the GEMM model again instead of keeping it, and a current one is kept."""
    from fxcost.cost_models.heads.sustained import load_gemm_fit

    current = json.loads((WEIGHTS / "gemm.json").read_text())
    old = {**{k: v for k, v in current.items() if k != "watts"}, "kappa": 1.55}
    fits: list[int] = []

    def fit_tiled(data, out, exclude, manifest, progress) -> None:
        fits.append(1)
        (out / "gemm.json").write_text(json.dumps(current))
        manifest["heads"].update({"linear": {}, "bmm": {}})

    monkeypatch.setattr("fxcost.train.heads._fit_tiled", fit_tiled)
    data, out = _tiny_data(tmp_path / "data", data_dir), tmp_path / "heads"
    train([data], out, heads=["linear", "bmm"])
    (out / "gemm.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"gemm\.json: a GEMM fit of an older fxcost.*fxcost train"):
        load_gemm_fit(out)
    train([data], out, heads=["linear", "bmm"])
    assert len(fits) == 2 and load_gemm_fit(out).watts == current["watts"]
    train([data], out, heads=["linear", "bmm"])
    assert len(fits) == 2  # a current fit on the same data is kept


def test_the_convolution_head_is_trained_against_the_gemm_fits_clock_and_again_when_it_changes(
    tmp_path, data_dir, monkeypatch
) -> None:
    """The conv head's targets are read against the power-capped clock of the GEMM fit's ``watts``:
    it is trained after that fit, says which watts it was trained for, is kept while they hold and is
    trained again from the start when they change, even by a run that asked only for the GEMMs."""
    import fxcost.train.heads as heads_module

    current = json.loads((WEIGHTS / "gemm.json").read_text())

    def fit_tiled(data, out, exclude, manifest, progress) -> None:
        (out / "gemm.json").write_text(json.dumps(current))
        manifest["heads"].update({"linear": {}, "bmm": {}})

    monkeypatch.setattr("fxcost.train.heads._fit_tiled", fit_tiled)
    data, out, config = (
        _tiny_data(tmp_path / "data", data_dir, "conv"),
        tmp_path / "heads",
        TrainConfig(epochs=1),
    )
    fits: list[str] = []
    real_fit = heads_module.fit
    monkeypatch.setattr(
        "fxcost.train.heads.fit", lambda ex, *a, **k: fits.append("conv") or real_fit(ex, *a, **k)
    )

    def watts() -> float:
        return json.loads((out / "manifest.json").read_text())["heads"]["conv"]["watts"]

    train([data], out, heads=["conv"], config=config)
    assert fits == ["conv"] and watts() == current["watts"] == clocked_watts(out)
    before = load_heads(out)["conv"].weights[0].copy()
    train([data], out, heads=["conv"], config=config)
    assert fits == ["conv"]  # the same fit: the head is kept
    trained_for = (out / "heads.npz").read_bytes()
    (out / "gemm.json").write_text(json.dumps({**current, "watts": current["watts"] * 0.8}))
    # heads.npz says the watts its conv head was trained for: a GEMM fit of others is not paired with it.
    trained, now = current["watts"], current["watts"] * 0.8
    with pytest.raises(
        ValueError, match=f"conv head was trained against a GEMM fit of {trained:g} .* holds {now:g}"
    ):
        Heads.load(out)
    train([data], out, heads=["linear", "bmm"], config=config)
    assert fits == ["conv", "conv"] and watts() == pytest.approx(current["watts"] * 0.8)
    assert Heads.load(out).gemm.watts == pytest.approx(clocked_watts(out))
    # Not resumed from the finished checkpoint of the other bound: trained anew on the new targets.
    assert not np.array_equal(load_heads(out)["conv"].weights[0], before)
    (out / "heads.npz").write_bytes(trained_for)  # copied over from the other training
    with pytest.raises(ValueError, match="two trainings; run `fxcost train --out"):
        Heads.load(out)
