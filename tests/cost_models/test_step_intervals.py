"""A step's interval: its nodes' bounds summed, the classes the runs calibrated drawn in."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fxcost.cost_models.heads.intervals import Intervals, node_bounds, shipped_intervals
from fxcost.cost_models.heads.step_intervals import StepSums, step_scale_for, step_sums
from fxcost.lowering.nodes import conv_node, gemm_node
from fxcost.records import NodeCost

INTERVALS = Intervals(
    {"linear": (-0.5, 0.5), "conv": (-0.4, 0.3)}, rows={}, step_scale=0.5, drawn_classes=("linear",)
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
    # at scale 1 the step's interval is its nodes' summed bounds
    summed = node_bounds([gemm, conv], ms, ["mlp", "mlp"], INTERVALS)
    assert sums.bounds(1.0) == pytest.approx((float(summed[0] @ weights), float(summed[1] @ weights)))


def test_fused_attention_and_nodes_without_a_prediction_are_not_drawn_in() -> None:
    sdpa = NodeCost(name="sdpa", op="aten._scaled_dot_product_efficient_attention.default", phase="fw",
                    in_shapes=[(2, 4, 128, 64)] * 3, out_shapes=[(2, 4, 128, 64)])  # fmt: skip
    gemm = gemm_node("linear", 1, 256, 256, 256)
    both = dataclasses.replace(INTERVALS, quantiles={**INTERVALS.quantiles, "bmm": (-0.3, 0.6)},
                               drawn_classes=("linear", "bmm"))  # fmt: skip
    sums = step_sums([sdpa, gemm], np.array([2.0, 1.0]), ["mlp", "mlp"], intervals=both)
    assert sums.drawn[0] == 1.0 and sums.rest[0] == 2.0  # the attention kernel keeps its summed bounds
    unpredicted = step_sums([gemm, gemm], np.array([1.0, np.nan]), ["mlp", None], intervals=INTERVALS)
    assert unpredicted.total == 1.0 and all(math.isfinite(b) for b in unpredicted.bounds(0.5))


def _runs(ratios: dict[str, list[float]]) -> dict[str, list[tuple[float, StepSums]]]:
    """Runs measured at ``ratios`` of their prediction, whose summed bounds are x0.5 to x2."""
    return {gpu: [(r, StepSums((1.0, 0.5, 2.0), (0.0, 0.0, 0.0))) for r in rs] for gpu, rs in ratios.items()}


def test_the_step_scale_covers_the_runs_of_a_gpu_left_out() -> None:
    runs = _runs({"a": [1.05, 0.97, 1.1], "b": [1.08, 0.95, 1.02], "c": [1.06, 0.93, 1.09]})
    scale = step_scale_for(runs)
    inside = [s.covers(r, scale) for rs in runs.values() for r, s in rs]
    assert 0.05 < scale < 1 and np.mean(inside) >= 0.8
    assert step_scale_for({"a": runs["a"]}) == pytest.approx(
        0.14
    )  # one GPU: its runs at 80%: log 1.1 / log 2


def test_a_scale_no_left_out_gpu_would_have_been_given_falls_back_to_the_summed_bounds() -> None:
    """Two GPUs whose runs lean 5% and 15% slow: a scale covering both (0.21) exists, but the GPU
    leaning further, left out, gets the other's 0.08 and none of its runs inside; nested coverage
    never reaches 80%, so the summed bounds stand."""
    runs = _runs({"a": [1.05] * 3, "b": [1.15] * 3})
    assert all(s.covers(r, 0.21) for rs in runs.values() for r, s in rs)
    assert step_scale_for(runs) == 1.0
    assert step_scale_for({}) == 1.0


def test_step_fields_round_trip_and_an_older_file_sums_the_bounds() -> None:
    assert Intervals.from_json(INTERVALS.to_json()) == INTERVALS
    older = Intervals.from_json('{"nominal": 0.8, "quantiles": {"linear": [-0.5, 0.5]}}')
    assert (older.step_scale, older.drawn_classes) == (1.0, ())
    shipped = shipped_intervals()
    assert shipped is not None and 0 < shipped.step_scale < 1 and "linear" in shipped.drawn_classes
    assert "conv" not in shipped.drawn_classes  # no calibration run holds a convolution
