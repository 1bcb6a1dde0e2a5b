"""A step's interval: its nodes' bounds summed, the classes the runs calibrated drawn in."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fxcost.cost_models.heads.intervals import Intervals, node_bounds, shipped_intervals
from fxcost.cost_models.heads.step_intervals import StepSums, step_bounds, step_scale_for, step_sums
from fxcost.lowering.nodes import conv_node, gemm_node

INTERVALS = Intervals(
    {"linear": (-0.5, 0.5), "conv": (-0.4, 0.3)}, rows={}, step_scale=0.5, step_classes=("linear",)
)


def test_the_drawn_part_reaches_its_share_of_the_log_distance_and_the_rest_its_sums() -> None:
    sums = StepSums(drawn=(2.0, 1.0, 4.0), rest=(1.0, 0.5, 2.0))
    assert sums.total == 3.0
    assert sums.bounds(1.0) == pytest.approx((1.5, 6.0))  # the summed bounds
    assert sums.bounds(0.5) == pytest.approx((2 * 0.5**0.5 + 0.5, 2 * 2**0.5 + 2.0))
    assert sums.bounds(0.0) == pytest.approx((2.5, 4.0))  # the drawn part at its prediction
    lows, highs = zip(*(sums.bounds(s) for s in (0.0, 0.25, 0.5, 1.0)), strict=True)
    assert list(lows) == sorted(lows, reverse=True) and list(highs) == sorted(highs)


def test_only_the_calibrated_classes_are_drawn_in_and_weights_count_nodes() -> None:
    gemm, conv = gemm_node("linear", 1, 256, 256, 256), conv_node(8, 64, 64, 3, 28, 1, 1)
    ms, weights = np.array([1.0, 2.0]), np.array([3.0, 1.0])
    sums = step_sums([gemm, conv], ms, ["mlp", "mlp"], weights, intervals=INTERVALS)
    assert sums.drawn == pytest.approx((3.0, 3 * math.exp(-0.5), 3 * math.exp(0.5)))
    assert sums.rest == pytest.approx((2.0, 2 * math.exp(-0.4), 2 * math.exp(0.3)))
    low, high = step_bounds([gemm, conv], ms, ["mlp", "mlp"], weights, intervals=INTERVALS)
    assert (low, high) == pytest.approx(sums.bounds(0.5))
    # at scale 1 the step's interval is its nodes' summed bounds
    summed = node_bounds([gemm, conv], ms, ["mlp", "mlp"], INTERVALS)
    unscaled = dataclasses.replace(INTERVALS, step_scale=1.0)
    assert step_bounds([gemm, conv], ms, ["mlp", "mlp"], weights, intervals=unscaled) == pytest.approx(
        (float(summed[0] @ weights), float(summed[1] @ weights))
    )


def test_the_step_scale_is_the_smallest_that_covers_the_nominal_share_of_each_gpus_runs() -> None:
    # summed bounds x0.5 to x2 (log distance 0.69 each way); runs within 10% of their prediction
    runs = {gpu: [(ratio, StepSums((1.0, 0.5, 2.0), (0.0, 0.0, 0.0))) for ratio in ratios]
            for gpu, ratios in {"a": [0.95, 1.05, 1.1], "b": [0.92, 1.0, 1.08]}.items()}  # fmt: skip

    def coverage(scale: float) -> float:  # the mean over GPUs of the share of their runs inside
        inside = [
            [lo <= r <= hi for r, sums in rs for lo, hi in [sums.bounds(scale)]] for rs in runs.values()
        ]
        return float(np.mean([np.mean(i) for i in inside]))

    scale = step_scale_for(runs)
    assert 0.1 <= scale <= 0.2  # log(1/0.92) / log(2) = 0.12, log(1.1) / log(2) = 0.14
    assert coverage(scale) >= 0.8 > coverage(scale - 0.01)
    assert step_scale_for({}) == 1.0
    far = {"a": [(5.0, StepSums((1.0, 0.5, 2.0), (0.0, 0.0, 0.0)))]}  # outside even the summed bounds
    assert step_scale_for(far) == 1.0


def test_step_fields_round_trip_and_an_older_file_sums_the_bounds() -> None:
    assert Intervals.from_json(INTERVALS.to_json()) == INTERVALS
    older = Intervals.from_json('{"nominal": 0.8, "quantiles": {"linear": [-0.5, 0.5]}}')
    assert (older.step_scale, older.step_classes) == (1.0, ())
    shipped = shipped_intervals()
    assert shipped is not None and 0 < shipped.step_scale < 1 and "linear" in shipped.step_classes
    assert "conv" not in shipped.step_classes  # no calibration run holds a convolution
