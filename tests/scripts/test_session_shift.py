"""``benchmarks/session_shift.py``: held-out rows matched to training rows of the same shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

COLUMNS = ["OPName", "Latency", "Device", "B", "M", "N", "K"]


def _frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def test_a_held_out_row_is_compared_per_unit_of_work_with_its_nearest_training_row(load_script: Any) -> None:
    script = load_script("benchmarks/session_shift.py")
    train = _frame([("linear", 2.0, "T4", 1, 1000, 1000, 1000), ("linear", 8.0, "T4", 1, 4000, 1000, 1000)])
    test = _frame([
        ("linear", 1.6, "T4", 1, 1000, 1000, 1000),  # the same shape, 20% faster
        ("linear", 4.2, "T4", 1, 4200, 1000, 1000),  # 5% more rows than the second: 4.2 over 8.4
        ("linear", 1.0, "T4", 1, 2000, 1000, 1000),  # nothing within 10%: not compared
    ])  # fmt: skip
    ratios = script.matched_ratios(train, test, ["B", "M", "N", "K"])
    assert sorted(ratios.round(6)) == [0.5, 0.8]


def test_one_class_of_data_prints_its_shift(load_script: Any, tmp_path: Path, capsys: Any) -> None:
    script = load_script("benchmarks/session_shift.py")
    (tmp_path / "ops" / "linear").mkdir(parents=True)
    (tmp_path / "ops_test").mkdir()
    shapes = [(1, 512 * i, 1024, 768) for i in range(1, 5)]
    _frame([("linear", 1.0 * i, "Tesla T4", *s) for i, s in enumerate(shapes, 1)]).to_csv(
        tmp_path / "ops" / "linear" / "T4.csv", index=False
    )
    _frame([("linear", 0.75 * i, "Tesla T4", *s) for i, s in enumerate(shapes, 1)]).to_csv(
        tmp_path / "ops_test" / "linear.csv", index=False
    )
    assert script.main(["--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "+33" in out  # a model reproducing the training rows is a third slow on the held-out ones
    assert out.strip().splitlines()[-1] == "shift_fc=0.75 pairs=4"


@pytest.mark.parametrize("missing", ["ops", "ops_test"])
def test_nothing_to_compare_says_so(load_script: Any, tmp_path: Path, capsys: Any, missing: str) -> None:
    script = load_script("benchmarks/session_shift.py")
    for kind in {"ops", "ops_test"} - {missing}:
        (tmp_path / kind).mkdir()
    assert script.main(["--data", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "pairs=0"
