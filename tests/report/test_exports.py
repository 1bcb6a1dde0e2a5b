"""Report exports: the ONNX model (for Netron) and the CSV table."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

import fxcost
from fxcost.gpus import UnknownDeviceError
from fxcost.records import NodeCost
from fxcost.report import Report

DEVICES = ["T4", "H100-SXM"]


@pytest.fixture(scope="module")
def unmeasured_report(small_model: Callable[[], nn.Module]) -> Report:
    """The shared small step, unmeasured: exports leave out what is unknown (``origin_ms``)."""
    torch._dynamo.reset()
    return fxcost.profile(small_model(), (torch.randn(8, 16),), devices=DEVICES, measure=False)


@pytest.fixture(scope="module")
def model(unmeasured_report: Report, tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    path = unmeasured_report.to_onnx(tmp_path_factory.mktemp("onnx") / "step.onnx")
    return onnx.load(path)


def _nodes(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {n.name: n for n in model.graph.node}


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_onnx_passes_the_checker_with_one_node_per_record(
    unmeasured_report: Report, model: onnx.ModelProto
) -> None:
    onnx.checker.check_model(model)
    assert [n.name for n in model.graph.node] == [f"g{n.graph}/{n.name}" for n in unmeasured_report.nodes]
    assert {n.graph for n in unmeasured_report.nodes} == {0, 1}  # forward and backward, both exported
    mm = _nodes(model)["g1/mm"]
    assert (mm.op_type, mm.domain) == ("mm", "fxcost.aten")
    assert {o.domain for o in model.opset_import} >= {"fxcost.aten", "fxcost.operator"}


def test_onnx_edges_connect_producers_to_consumers(unmeasured_report: Report, model: onnx.ModelProto) -> None:
    nodes = _nodes(model)
    assert list(nodes["g0/addmm"].input) == list(nodes["g0/t"].output) == ["g0/t"]
    # A tuple result: one output per tensor, all read by each getitem (as in_shapes lists them).
    norm = nodes["g0/native_layer_norm"].output
    assert list(norm) == [f"g0/native_layer_norm:{i}" for i in range(3)]
    assert list(nodes["g0/getitem_1"].input) == list(norm)
    for n in unmeasured_report.nodes:
        producers = [o for p in n.inputs for o in nodes[f"g{n.graph}/{p}"].output]
        assert list(nodes[f"g{n.graph}/{n.name}"].input) == producers


def test_onnx_values_are_typed_with_shapes_and_dtypes(
    unmeasured_report: Report, model: onnx.ModelProto
) -> None:
    values = {v.name: v for v in [*model.graph.value_info, *model.graph.output]}
    addmm = next(n for n in unmeasured_report.nodes if n.graph == 0 and n.name == "addmm")
    tensor = values["g0/addmm"].type.tensor_type
    assert tensor.elem_type == TensorProto.FLOAT
    assert tuple(d.dim_value for d in tensor.shape.dim) == addmm.out_shapes[0]
    # Results nobody in the graph reads (the loss, activations saved for backward) are graph outputs.
    assert {"g0/sum_1", "g0/getitem_1"} <= {v.name for v in model.graph.output}


def test_onnx_metadata_equals_the_report(unmeasured_report: Report, model: onnx.ModelProto) -> None:
    nodes = _nodes(model)
    for n in unmeasured_report.nodes:
        attrs = _attrs(nodes[f"g{n.graph}/{n.name}"])
        assert attrs["op"] == n.op.encode()
        assert attrs["phase"] == n.phase.encode()
        assert attrs["module"] == n.module.encode()
        assert attrs["has_kernel"] == n.has_kernel
        assert (attrs["flops"], attrs["bytes_read"], attrs["bytes_written"]) == (
            n.flops,
            n.bytes_read,
            n.bytes_written,
        )
        assert "origin_ms" not in attrs  # not measured: left out, not written as 0
        for d in DEVICES:
            assert attrs[f"pred_ms[{d}]"] == pytest.approx(n.pred_ms[d], rel=1e-6)  # float32
            assert attrs[f"pred_source[{d}]"] == n.pred_source[d].encode()
    props = {p.key: p.value for p in model.metadata_props}
    assert props["origin"] == unmeasured_report.origin == "cpu"
    assert props["devices"] == ",".join(DEVICES)
    assert props["fxcost_version"] == fxcost.__version__
    for d in DEVICES:
        assert float(props[f"total_ms[{d}]"]) == unmeasured_report.total_ms(d) > 0


def test_onnx_for_some_devices(unmeasured_report: Report, tmp_path: Path) -> None:
    model = onnx.load(unmeasured_report.to_onnx(tmp_path / "t4.onnx", devices=["Tesla T4"]))
    attrs = _attrs(_nodes(model)["g1/mm"])
    assert "pred_ms[T4]" in attrs and "pred_ms[H100-SXM]" not in attrs
    assert {p.key: p.value for p in model.metadata_props}["devices"] == "T4"


@pytest.mark.parametrize("export", ["to_onnx", "to_csv"])
def test_exports_reject_unknown_and_unpredicted_devices(
    unmeasured_report: Report, tmp_path: Path, export: str
) -> None:
    write = getattr(unmeasured_report, export)
    with pytest.raises(UnknownDeviceError, match="unknown device 'T5000'"):
        write(tmp_path / "x", devices=["T5000"])
    with pytest.raises(ValueError, match="L4 was not predicted"):
        write(tmp_path / "x", devices=["L4"])
    assert not list(tmp_path.iterdir())


def test_onnx_rejects_an_input_no_node_produces(tmp_path: Path) -> None:
    unmeasured_report = Report(nodes=[NodeCost("relu", "aten.relu.default", "fw", inputs=["missing"])])
    with pytest.raises(ValueError, match="reads 'missing'"):
        unmeasured_report.to_onnx(tmp_path / "x.onnx")


def test_empty_report_exports(tmp_path: Path) -> None:
    onnx.checker.check_model(onnx.load(Report().to_onnx(tmp_path / "empty.onnx")))
    lines = Report().to_csv(tmp_path / "empty.csv").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("name,op,phase,graph,module,")  # the header only


def test_csv_has_a_row_per_node_and_round_trips_values(unmeasured_report: Report, tmp_path: Path) -> None:
    path = unmeasured_report.to_csv(tmp_path / "step.csv")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(unmeasured_report.nodes)
    assert list(rows[0])[-2:] == [f"pred_ms[{d}]" for d in DEVICES]
    for row, n in zip(rows, unmeasured_report.nodes, strict=True):
        assert row["name"] == n.name
        assert float(row["pred_ms[T4]"]) == n.pred_ms["T4"]  # exact: floats are written in full
        assert int(row["flops"]) == n.flops
        assert json.loads(row["in_shapes"]) == [list(s) for s in n.in_shapes]
        assert json.loads(row["inputs"]) == n.inputs
        assert row["origin_ms"] == ""  # unknown, not 0
    assert sum(float(r["pred_ms[H100-SXM]"]) for r in rows) == pytest.approx(
        unmeasured_report.total_ms("H100-SXM")
    )


def test_csv_has_the_columns_of_the_dataframe(unmeasured_report: Report, tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    with unmeasured_report.to_csv(tmp_path / "step.csv").open(newline="") as f:
        header = next(csv.reader(f))
    assert header == list(unmeasured_report.to_dataframe().columns)
    with unmeasured_report.to_csv(tmp_path / "t4.csv", devices=["T4"]).open(newline="") as f:
        assert next(csv.reader(f))[-1] == "pred_ms[T4]"
