"""The cost function for search loops: a model traced once per structure, priced for any GPU, batch and
precision (``estimator``: :class:`Estimator` and ``fxcost.cost``), the traced step as its distinct
nodes (``captured``), its sizes as polynomials in the batch (``symbolic``), and the cache keys
(``keys``)."""

from fxcost.estimator.captured import Captured, Cost
from fxcost.estimator.estimator import Estimator, clear_default_estimators, cost, default_estimator
from fxcost.estimator.keys import inputs_key, model_key

__all__ = [
    "Captured",
    "Cost",
    "Estimator",
    "clear_default_estimators",
    "cost",
    "default_estimator",
    "inputs_key",
    "model_key",
]
