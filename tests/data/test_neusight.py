"""NeuSight per-node traces read as origin measurements (needs the shared data and transformers)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("transformers")


def test_trace_lowers_kernel_nodes_repeats_layers_and_scales_to_other_gpus(data_dir) -> None:
    from fxcost.data.neusight import read_trace

    path = data_dir / "neusight" / "models" / "Tesla_V100-PCIE-32GB" / "gpt2_large-inf-1024-4.csv"
    if not path.exists():
        pytest.skip(f"{path} not found")
    report = read_trace(path)
    assert report.origin == "V100-PCIE-32GB"
    layers = json.loads(path.with_suffix(".json").read_text())["num_layer"]
    addmms = [n for n in report.nodes if n.op == "aten.addmm.default"]
    assert len(addmms) == 4 * layers  # four linear layers per block, the first block's repeated
    assert len([n for n in report.nodes if n.op == "aten.mm.default"]) == 1  # the LM head, once
    assert not any(n.op.startswith("aten.view") or not n.has_kernel for n in report.nodes)
    # The measured times are kept (nodes that launch nothing drop their host-only time).
    trace = pd.read_csv(path)
    c_attn = trace.loc[trace["Name"] == "addmm", "fw_latency"].item()
    assert addmms[0].origin_ms == pytest.approx(c_attn)
    # On its own GPU the runtime-based prediction is the measurement; a T4 is slower.
    predicted = report.predict(["V100-PCIE-32GB", "T4"])
    assert predicted.total_ms("V100-PCIE-32GB") == pytest.approx(report.origin_ms())
    assert predicted.total_ms("T4") > 2 * predicted.total_ms("V100-PCIE-32GB")
    assert {n.pred_source["T4"] for n in predicted.nodes} == {"wave_scaling", "mlp_ratio"}


def test_repeated_layer_nodes_are_separate_records(data_dir) -> None:
    from fxcost import cost_models
    from fxcost.data.neusight import read_trace

    path = data_dir / "neusight" / "models" / "Tesla_T4" / "bert_large-inf-512-8.csv"
    if not path.exists():
        pytest.skip(f"{path} not found")
    report = read_trace(path)
    cost_models.predict(report.nodes, ["T4", "P4"], origin=report.origin)  # node by node, no report copy
    assert len({id(n.pred_ms) for n in report.nodes}) == len(report.nodes)
    assert sum(n.pred_ms["T4"] for n in report.nodes) == pytest.approx(report.origin_ms())


def test_model_runs_are_the_single_gpu_runs_with_their_traces(data_dir) -> None:
    from fxcost.data.datasets import read_model_runs

    runs = read_model_runs(data_dir)
    if runs.empty:
        pytest.skip("no model runs in the data")
    assert not runs["model"].str.contains("fusion|dp4|tp4|pp4").any()
    assert set(runs["mode"]) <= {"train", "inf"} and (runs["e2e"] > 0).all()
    with_trace = runs[runs["trace"].notna()]
    assert all(p.suffix == ".csv" and p.exists() for p in with_trace["trace"])
    with pytest.raises(FileNotFoundError, match="no models/ or model_configs/ directory"):
        read_model_runs(data_dir / "nowhere")
