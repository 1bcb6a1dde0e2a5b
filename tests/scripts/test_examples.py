"""The examples run, at small size, and their answers obey their own constraints."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_optuna_search_finds_a_model_within_the_budget(
    capsys: pytest.CaptureFixture[str], load_script
) -> None:
    pytest.importorskip("optuna")
    example = load_script("examples/automl_optuna.py")
    budget = 3.0  # a 1-2 layer candidate costs 2.7-4.6 ms on H100: the fixed costs of its ops dominate
    best = example.main(["--device", "H100-SXM", "--budget-ms", str(budget), "--trials", "8",
                         "--seq", "16", "--vocab", "256", "--max-layers", "2"])  # fmt: skip
    assert 0 < best.step_ms <= budget and best.trials == 8
    assert "best on H100-SXM" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="no candidate fits"):
        example.main(
            ["--budget-ms", "0.001", "--trials", "2", "--seq", "16", "--vocab", "256", "--max-layers", "1"]
        )
