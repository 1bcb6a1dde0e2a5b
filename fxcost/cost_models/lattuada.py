"""Lattuada et al.: linear regression over run-level features with stepwise feature selection.

The model predicts a whole run's time from a few facts about it (§3.2): iterations ``I``, batch size
``B``, GPUs ``G``, GPU peak GFLOPS ``P``, data-loader threads ``T``, data-loading delay ``D``, inner
modules ``N``. The features are augmented (§3.3) with every monomial of the features and their
reciprocals in which each variable appears with degree at most 1 and never next to its own
reciprocal (``I*B``, ``I*B/P``, ``1/G``, ...), and terms are chosen by Draper and Smith's stepwise
regression: start from the intercept alone and alternate a forward step (add the term whose t-test
p-value is smallest, if below ``p_enter``) and a backward step (drop the least significant term, if
its p-value is above ``p_remove``) until neither applies.

Features that do not vary in the data carry no information and are left out before augmentation.

Example:
    >>> model = LattuadaRegression().fit(runs, target="time_s")  # doctest: +SKIP
    >>> print(model.summary())  # doctest: +SKIP
    >>> model.predict(new_runs)  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["FEATURES", "LattuadaRegression", "Term", "augment"]

# The paper's run-level features, in its order.
FEATURES = ("I", "B", "G", "P", "T", "D", "N")


@dataclass(frozen=True, order=True)
class Term:
    """A monomial: each variable with exponent +1 or -1 (absent variables are not listed)."""

    powers: tuple[tuple[str, int], ...]

    @property
    def name(self) -> str:
        numerator = "*".join(v for v, p in self.powers if p > 0) or "1"
        below = [v for v, p in self.powers if p < 0]
        denominator = below[0] if len(below) == 1 else f"({'*'.join(below)})"
        return f"{numerator}/{denominator}" if below else numerator

    def __call__(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        out = np.ones(len(next(iter(columns.values()))))
        for variable, power in self.powers:
            out = out * (columns[variable] if power > 0 else 1.0 / columns[variable])
        return out


def augment(variables: Sequence[str], max_degree: int | None = None) -> list[Term]:
    """Every monomial of ``variables`` and their reciprocals with degree at most 1 per variable and no
    variable next to its reciprocal (§3.3); ``max_degree`` bounds how many variables a term multiplies."""
    terms = []
    for choice in itertools.product((0, 1, -1), repeat=len(variables)):
        used = sum(1 for c in choice if c)
        if used and (max_degree is None or used <= max_degree):
            terms.append(Term(tuple((v, c) for v, c in zip(variables, choice, strict=True) if c)))
    return sorted(terms, key=lambda t: (len(t.powers), t.name))


@dataclass
class LattuadaRegression:
    """Stepwise-selected multiple linear regression of a run's time (Lattuada et al. §3.2-3.3).

    Attributes:
        p_enter: a term enters when its t-test p-value is below this.
        p_remove: a selected term leaves when its p-value rises above this.
        max_degree: the most variables one term multiplies (None: all of them, as in the paper).
    """

    p_enter: float = 0.05
    p_remove: float = 0.10
    max_degree: int | None = None
    features: list[str] = field(default_factory=list)
    terms: list[Term] = field(default_factory=list)
    coefficients: np.ndarray = field(default_factory=lambda: np.zeros(0))
    p_values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    target: str = "time"

    def fit(self, runs: Any, target: str, features: Sequence[str] | None = None) -> LattuadaRegression:
        """Fit on ``runs`` (a DataFrame or a mapping of columns) to predict column ``target``.

        ``features`` defaults to the paper's (``I B G P T D N``) that are present; constant ones are
        dropped. Raises ValueError naming missing columns, non-positive values or too few runs.
        """
        columns = _columns(runs)
        if target not in columns:
            raise ValueError(f"no target column {target!r}; columns: {', '.join(sorted(columns))}")
        wanted = list(features) if features is not None else [f for f in FEATURES if f in columns]
        missing = [f for f in wanted if f not in columns]
        if missing or not wanted:
            raise ValueError(
                f"feature columns {missing or wanted} not found; the paper's features are "
                f"{', '.join(FEATURES)} and the table has {', '.join(sorted(columns))}"
            )
        for name in [*wanted, target]:
            values = columns[name]
            if not np.all(np.isfinite(values)) or np.any(values <= 0):
                raise ValueError(f"column {name!r} must be finite and positive (reciprocals are taken)")
        self.features = [f for f in wanted if np.ptp(columns[f]) > 0]
        self.target = target
        y = columns[target]
        candidates = augment(self.features, self.max_degree)
        if len(y) < 3:
            raise ValueError(f"need at least 3 runs to fit, got {len(y)}")
        self.terms = self._stepwise(candidates, columns, y)
        self.coefficients, self.p_values = _ols(self._design(self.terms, columns), y)
        return self

    def predict(self, runs: Any) -> np.ndarray:
        """Predicted target for each run."""
        if not self.coefficients.size:
            raise ValueError("the model is not fitted: call fit() first")
        return self._design(self.terms, _columns(runs)) @ self.coefficients

    def summary(self) -> str:
        """The selected terms and their coefficients, like the paper's Table 8."""
        rows = [f"{'term':<20} {'coefficient':>14} {'p-value':>9}"]
        for name, c, p in zip(["(intercept)", *(t.name for t in self.terms)], self.coefficients,
                              self.p_values, strict=True):  # fmt: skip
            rows.append(f"{name:<20} {c:>14.6g} {p:>9.2g}")
        return "\n".join(rows)

    # -- internals -------------------------------------------------------------------------------

    @staticmethod
    def _design(terms: Sequence[Term], columns: dict[str, np.ndarray]) -> np.ndarray:
        n = len(next(iter(columns.values())))
        return np.column_stack([np.ones(n), *(t(columns) for t in terms)])

    def _stepwise(self, candidates: list[Term], columns: dict[str, np.ndarray], y: np.ndarray) -> list[Term]:
        selected: list[Term] = []
        values = {t: t(columns) for t in candidates}
        for _ in range(4 * len(candidates) + 4):  # each term can enter and leave a few times at most
            changed = False
            # Forward: the candidate with the smallest p-value, if significant.
            best: tuple[float, Term] | None = None
            if len(selected) + 2 < len(y):  # keep a residual degree of freedom
                for term in candidates:
                    if term in selected:
                        continue
                    x = np.column_stack([np.ones(len(y)), *(values[t] for t in selected), values[term]])
                    _, p = _ols(x, y)
                    if math.isfinite(p[-1]) and (best is None or p[-1] < best[0]):
                        best = (float(p[-1]), term)
            if best is not None and best[0] < self.p_enter:
                selected.append(best[1])
                changed = True
            # Backward: the least significant selected term, if no longer significant.
            if selected:
                _, p = _ols(np.column_stack([np.ones(len(y)), *(values[t] for t in selected)]), y)
                worst = int(np.nanargmax(p[1:]))
                if not math.isfinite(p[1 + worst]) or p[1 + worst] > self.p_remove:
                    selected.pop(worst)
                    changed = True
            if not changed:
                break
        return selected


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares coefficients and their two-sided t-test p-values (NaN where undetermined)."""
    from scipy import stats

    coefficients, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = len(y) - x.shape[1]
    if dof <= 0:
        return coefficients, np.full(x.shape[1], np.nan)
    residual = y - x @ coefficients
    sigma2 = float(residual @ residual) / dof
    try:
        covariance = sigma2 * np.linalg.inv(x.T @ x)
    except np.linalg.LinAlgError:
        return coefficients, np.full(x.shape[1], np.nan)
    se = np.sqrt(np.maximum(np.diag(covariance), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = coefficients / se
    p = 2 * stats.t.sf(np.abs(t), dof)
    return coefficients, np.where(se > 0, p, np.nan)


def _columns(runs: Any) -> dict[str, np.ndarray]:
    if hasattr(runs, "columns"):  # a DataFrame
        return {str(c): runs[c].to_numpy(dtype=np.float64) for c in runs.columns if _numeric(runs[c])}
    return {str(k): np.asarray(v, dtype=np.float64) for k, v in dict(runs).items()}


def _numeric(column: Any) -> bool:
    try:
        return bool(np.issubdtype(column.dtype, np.number))
    except TypeError:  # pandas extension dtypes (strings, categories): not a feature
        return False
