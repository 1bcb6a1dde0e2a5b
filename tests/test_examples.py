"""The examples run, at small size, and their answers obey their own constraints."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_optuna_search_finds_a_model_within_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("optuna")
    example = _load("automl_optuna")
    budget = 3.0  # a 1-2 layer candidate costs 2.7-4.6 ms on H100: the fixed costs of its ops dominate
    best = example.main(["--device", "H100-SXM", "--budget-ms", str(budget), "--trials", "8",
                         "--seq", "16", "--vocab", "256", "--max-layers", "2"])  # fmt: skip
    assert 0 < best.step_ms <= budget and best.trials == 8
    assert "best on H100-SXM" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="no candidate fits"):
        example.main(
            ["--budget-ms", "0.001", "--trials", "2", "--seq", "16", "--vocab", "256", "--max-layers", "1"]
        )
