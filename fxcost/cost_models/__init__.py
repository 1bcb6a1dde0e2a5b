"""Cost models: given nodes and a target GPU, milliseconds per node.

Every model implements :class:`CostModel` and is vectorized over nodes (``interface``); which model
predicts a node is a policy (``policy``, ``"auto"`` by default). The models: the roofline, Habitat's
wave scaling, the origin-free model (``heads``: GEMMs by their tiles, the rest by MLP heads),
Justus et al.'s per-layer network; Lattuada et al.'s
run-level regression predicts whole runs. ``eager`` says what of an isolated-op prediction an eager
step hides.
"""

# The built-in models register themselves as their modules load.
from fxcost.cost_models import heads, justus, roofline, wave_scaling  # noqa: F401
from fxcost.cost_models.interface import CostModel, NodeBatch, get_model, model_names, register
from fxcost.cost_models.policy import (
    AUTO,
    ORIGIN_FREE,
    RUNTIME_BASED,
    ModelSpec,
    chain_name,
    model_chain,
    predict,
    predict_batch,
    spec_name,
)

__all__ = [
    "AUTO",
    "ORIGIN_FREE",
    "RUNTIME_BASED",
    "CostModel",
    "ModelSpec",
    "NodeBatch",
    "chain_name",
    "get_model",
    "model_chain",
    "model_names",
    "predict",
    "predict_batch",
    "register",
    "spec_name",
]
