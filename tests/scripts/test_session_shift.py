"""``benchmarks/session_shift.py``: held-out rows matched to training rows of the same shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

COLUMNS = ["OPName", "Latency", "Device", "B", "M", "N", "K"]
DIMS = ["B", "M", "N", "K"]


def _frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def test_a_held_out_row_is_compared_per_unit_of_work_with_the_nearest_training_row(load_script: Any) -> None:
    script = load_script("benchmarks/session_shift.py")
    train = _frame([
        ("linear", 2.0, "T4", 1, 1000, 1000, 1000),
        ("linear", 3.0, "T4", 1, 4500, 1000, 1000),  # also within 1.1 of the second held-out row, farther
        ("linear", 8.0, "T4", 1, 4000, 1000, 1000),
    ])  # fmt: skip
    test = _frame([
        ("linear", 1.6, "T4", 1, 1000, 1000, 1000),  # the same shape, 20% faster
        ("linear", 4.2, "T4", 1, 4200, 1000, 1000),  # 5% more rows than 4000: 4.2 over 8.4
        ("linear", 1.0, "T4", 1, 2000, 1000, 1000),  # nothing within 1.1: not compared
        ("linear", 1.0, "T4", 1, 1000, 1000, 1120),  # 1.12 times the first's K: just outside
    ])  # fmt: skip
    assert sorted(script.matched_ratios(train, test, DIMS).round(6)) == [0.5, 0.8]


def test_ops_are_matched_with_their_own_op_and_repeats_count_as_one(load_script: Any) -> None:
    script = load_script("benchmarks/session_shift.py")
    train = pd.DataFrame({"OPName": ["add", "add", "add", "relu"], "Latency": [1.0, 3.0, 2.0, 10.0],
                          "B": [64] * 4, "H": [1024] * 4})  # fmt: skip
    test = pd.DataFrame({"OPName": ["add", "relu"], "Latency": [2.0, 5.0], "B": [64, 64], "H": [1024, 1024]})
    # add: against the median of its three repeats (2.0); relu: against relu's own row
    assert sorted(script.matched_ratios(train, test, ["B", "H"]).round(6)) == [0.5, 1.0]


def test_held_out_rows_beyond_one_chunk_keep_their_own_times(load_script: Any, monkeypatch: Any) -> None:
    script = load_script("benchmarks/session_shift.py")
    monkeypatch.setattr(script, "_CHUNK", 2)
    train = _frame([("linear", 1.0 * m, "T4", 1, m, 64, 64) for m in (100, 200, 300, 400, 500)])
    test = _frame(
        [("linear", 0.1 * i * m, "T4", 1, m, 64, 64) for i, m in enumerate((100, 200, 300, 400, 500), 1)]
    )
    assert list(script.matched_ratios(train, test, DIMS).round(6)) == [0.1, 0.2, 0.3, 0.4, 0.5]


def test_one_class_of_data_prints_its_shift(load_script: Any, tmp_path: Path, capsys: Any) -> None:
    script = load_script("benchmarks/session_shift.py")
    (tmp_path / "ops" / "linear").mkdir(parents=True)
    (tmp_path / "ops_test").mkdir()
    shapes = [(1, 512 * i, 1024, 768) for i in range(1, 5)]
    _frame([("linear", 1.0 * i, "Tesla T4", *s) for i, s in enumerate(shapes, 1)]).to_csv(
        tmp_path / "ops" / "linear" / "T4.csv", index=False
    )
    held = [("linear", 0.75 * i, "Tesla T4", *s) for i, s in enumerate(shapes, 1)]
    held += [("linear", 0.1, "H100-SXM", *s) for s in shapes]  # a held-out GPU: never compared
    _frame(held).to_csv(tmp_path / "ops_test" / "linear.csv", index=False)
    assert script.main(["--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "H100" not in out
    assert "+33" in out  # a model reproducing the training rows is a third slow on the held-out ones
    assert out.strip().splitlines()[-1] == "shift_fc=0.75 pairs=4"


@pytest.mark.parametrize("missing", ["ops", "ops_test"])
def test_nothing_to_compare_says_so(load_script: Any, tmp_path: Path, capsys: Any, missing: str) -> None:
    script = load_script("benchmarks/session_shift.py")
    for kind in {"ops", "ops_test"} - {missing}:
        (tmp_path / kind).mkdir()
    assert script.main(["--data", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "pairs=0"
