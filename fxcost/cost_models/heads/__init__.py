"""MLP cost heads: origin-free predictions for GEMMs, convolutions and kernel-alike ops.

``features``: which head predicts a node and what it sees; ``elementwise``: the elementwise head as a
curve that never falls with size; ``model``: the heads as cost models (``mlp``, ``mlp_ratio``);
``weights``: their files; ``intervals``: how sure they are on GPUs they were not fit on.
"""

from fxcost.cost_models.heads.features import (
    CLOCKED_HEADS,
    EW_OPS,
    FEATURE_VERSION,
    HEAD_OUTPUT,
    HEADS,
    LOWERED,
    device_features,
    feature_matrix,
    fp32_traffic,
    head_of,
    node_features,
    roofline_ms,
    with_device,
)
from fxcost.cost_models.heads.model import TILED_HEADS, Heads, HeadsRatio, default_heads
from fxcost.cost_models.heads.weights import (
    load_heads,
    measured_in_training,
    shipped_heads,
    shipped_manifest,
    spec_sheet_caveat,
    trained_devices,
    unlike_training,
)

__all__ = [
    "CLOCKED_HEADS",
    "EW_OPS",
    "FEATURE_VERSION",
    "HEADS",
    "HEAD_OUTPUT",
    "LOWERED",
    "TILED_HEADS",
    "Heads",
    "HeadsRatio",
    "default_heads",
    "device_features",
    "feature_matrix",
    "fp32_traffic",
    "head_of",
    "load_heads",
    "measured_in_training",
    "node_features",
    "roofline_ms",
    "shipped_heads",
    "shipped_manifest",
    "spec_sheet_caveat",
    "trained_devices",
    "unlike_training",
    "with_device",
]
