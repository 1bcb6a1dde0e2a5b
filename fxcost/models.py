"""The seed predictors of the papers fxcost builds on, as first-class objects.

- :class:`JustusPredictor` (Justus et al.): a per-layer feed-forward network over layer,
  implementation and hardware features; also the ``"justus"`` cost model.
- :class:`LattuadaRegression` (Lattuada et al.): stepwise linear regression over run-level features,
  fit from a table of measured runs (``fxcost fit-runs runs.csv --target time_s``).

Habitat's wave scaling and MLPs and the roofline are cost models in :mod:`fxcost.cost_models`.
"""

from fxcost.cost_models.justus import JustusConfig, JustusPredictor
from fxcost.cost_models.lattuada import LattuadaRegression

__all__ = ["JustusConfig", "JustusPredictor", "LattuadaRegression"]
