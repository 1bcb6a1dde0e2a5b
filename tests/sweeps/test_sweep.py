"""fxcost.sweep: many points from few traces, locally and on a local Ray instance, with resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fxcost import zoo
from fxcost.estimator import Estimator
from fxcost.sweeps import Point, sweep

BLOCK = {"seq": 16, "dim": 64, "heads": 4}
BUILDS: list[int] = []


def counted_block(batch: int, **config: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The zoo block, counting how often it is built."""
    BUILDS.append(batch)
    return zoo.build("transformer_block", batch, **config)


def broken(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    raise RuntimeError("this candidate does not build")


def _points(model: Any = "transformer_block") -> list[Point]:
    return [Point(model, batch=b, device=d, config=BLOCK, precision=p)
            for b in (2, 8, 32) for d in ("T4", "H100-SXM") for p in (None, "bf16")]  # fmt: skip


def test_local_sweep_matches_the_estimator_point_by_point() -> None:
    points = _points()
    results = sweep(points, progress=False)
    assert [r.point for r in results] == points
    model, inputs = zoo.build("transformer_block", 32, **BLOCK)
    est = Estimator(["T4"])
    for r in results:
        expected = est.cost(model, inputs, batch_size=r.point.batch, device=r.point.device,
                            precision=r.point.precision)  # fmt: skip
        assert r.error is None and r.ms == pytest.approx(expected.ms, rel=1e-9)
        assert r.samples_per_s == pytest.approx(r.point.batch / r.ms * 1000)


def test_a_group_is_built_once_and_a_broken_candidate_does_not_stop_the_sweep() -> None:
    BUILDS.clear()
    points = [*_points(counted_block), Point(broken, batch=4, device="T4")]
    results = sweep(points, progress=False)
    assert BUILDS == [32]  # one build, at the group's largest batch
    assert all(r.ms for r in results[:-1])
    assert results[-1].ms is None and "does not build" in (results[-1].error or "")


def test_an_interrupted_sweep_resumes_from_its_results_file(tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    points = _points(counted_block)
    first = sweep(points[:5], out=out, progress=False)
    with out.open("a") as f:
        f.write('{"point": {"model": "torn')  # the line being written when the process died
    BUILDS.clear()
    second = sweep(points, out=out, progress=False)
    assert BUILDS == [32]  # only the new points were evaluated
    assert [r.ms for r in second[:5]] == [r.ms for r in first]
    BUILDS.clear()
    third = sweep(points, out=out, progress=False)
    assert BUILDS == [] and [r.ms for r in third] == [r.ms for r in second]
    rows = [json.loads(line) for line in out.read_text().splitlines()[:5]]
    assert [row["ms"] for row in rows] == [r.ms for r in first]


def test_dict_points_and_bad_points_fail_before_anything_runs() -> None:
    result = sweep([{"model": "mlp", "batch": 4, "device": "L4", "config": {"features": 32}}], progress=False)
    assert result[0].ms and result[0].ms > 0
    with pytest.raises(ValueError, match=r"unknown sweep point fields \['gpu'\]"):
        sweep([{"model": "mlp", "batch": 4, "gpu": "L4"}])
    with pytest.raises(ValueError, match="batch must be a positive int"):
        sweep([Point("mlp", batch=0, device="L4")])
    with pytest.raises(ValueError, match="unknown precision"):
        sweep([Point("mlp", batch=2, device="L4", precision="int4")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown sweep backend"):
        sweep([Point("mlp", batch=2, device="L4")], backend="dask")  # type: ignore[arg-type]


@pytest.mark.slow
def test_ray_sweep_gives_the_local_answers() -> None:
    ray = pytest.importorskip("ray")
    points = [*_points(), *(Point("mlp", batch=b, device="L4", config={"features": 64}) for b in (2, 4))]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = sweep(points, backend="ray", progress=False)
    finally:
        ray.shutdown()
    local = sweep(points, progress=False)
    # A GPU's axis tables are read in one batch with whatever other tables this process builds at the
    # time, and the batch's BLAS blocking moves the last digits: 2.4e-9 apart after other tests, not
    # in a fresh worker.
    assert [r.ms for r in remote] == pytest.approx([r.ms for r in local], rel=1e-7)
    assert [r.point for r in remote] == points


def test_points_with_a_strategy_are_simulated_iterations() -> None:
    from fxcost.sim import simulate

    config = {"features": 64}
    points = [
        Point("mlp", batch=8, device="A100-SXM4-40GB", config=config, strategy=s) for s in ("dp=1", "dp=4")
    ]
    results = sweep(points, progress=False)
    model, inputs = zoo.build("mlp", 8, **config)
    expected = simulate(model, "dp=4", "4xA100-SXM4-40GB", example_inputs=inputs, batch=8).iteration_ms
    assert results[1].ms == pytest.approx(expected, rel=1e-9) and results[0].ms and results[0].ms > 0
    with pytest.raises(ValueError, match="unknown strategy key"):
        sweep([Point("mlp", batch=8, device="T4", strategy="dq=2")])
    with pytest.raises(ValueError, match="only used with a strategy"):
        sweep([Point("mlp", batch=8, device="T4", cluster="2xT4")])


def test_strategy_points_use_the_sweeps_cost_model() -> None:
    """A simulated point is priced by the sweep's cost model, as a single-GPU point is (it was
    priced by the default policy whatever the sweep asked for)."""
    from fxcost.sim import simulate

    point = Point("mlp", batch=8, device="A100-SXM4-80GB", config={"features": 64}, strategy="dp=2")
    (roofline,) = sweep([point], cost_model="roofline", progress=False)
    (auto,) = sweep([point], progress=False)
    model, inputs = zoo.build("mlp", 8, features=64)
    expected = simulate(model, "dp=2", "2xA100-SXM4-80GB", example_inputs=inputs, batch=8,
                        estimator=Estimator(cost_model="roofline")).iteration_ms  # fmt: skip
    assert roofline.ms == pytest.approx(expected, rel=1e-9)
    assert roofline.ms != pytest.approx(auto.ms, rel=1e-3)
