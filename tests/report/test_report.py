"""Report totals, printouts, dataframes and the JSON trace format."""

from __future__ import annotations

import gzip
import io
import itertools
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fxcost
from fxcost.records import NodeCost
from fxcost.report import SCHEMA_VERSION, Report, TraceFormatError


def test_totals_add_up_by_phase(report: Report) -> None:
    for device in ("H100-SXM", "NVIDIA H100 80GB HBM3", "Tesla T4"):
        total = report.total_ms(device)
        assert total > 0
        assert total == pytest.approx(report.total_ms(device, "fw") + report.total_ms(device, "bw"))
    # Bandwidth and FLOPS favour the H100; the default heads need not (these ops are launch bound).
    roofline = report.predict(["T4", "H100-SXM"], "roofline")
    assert roofline.total_ms("T4") > roofline.total_ms("H100-SXM")
    assert report.origin_ms() == pytest.approx(report.origin_ms("fw") + report.origin_ms("bw"))
    assert report.total_ms("T4", "opt") == 0


def test_report_rejects_bad_phase_and_unpredicted_device(report: Report) -> None:
    with pytest.raises(ValueError, match="unknown phase 'forward'"):
        report.total_ms("T4", "forward")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="L4 was not predicted"):
        report.total_ms("L4")


def test_capture_fidelity_compares_nodes_with_the_step(report: Report) -> None:
    assert report.step_ms is not None and report.step_ms > 0
    assert report.capture_fidelity == pytest.approx(report.origin_ms() / report.step_ms)
    assert all(g.measured_ms is not None and g.measured_ms > 0 for g in report.graphs)


def test_print_shows_every_node_and_the_totals(report: Report) -> None:
    out = io.StringIO()
    report.print(file=out)
    text = out.getvalue()
    for node in report.nodes:
        assert node.name in text
    for word in ("totals (ms)", "fw", "bw", "all", "H100-SXM", "T4", "capture fidelity"):
        assert word in text


def test_print_top_keeps_the_slowest_on_the_first_gpu(report: Report) -> None:
    text = _printout(report, top=3)
    assert "the 3 slowest of" in text and "on H100-SXM" in text
    # Not the CPU's order: the one the printout is for.
    for first in ("H100-SXM", "T4"):
        gpus = report.predict([first, *{"H100-SXM", "T4"} - {first}])
        ranked = sorted(gpus.nodes, key=lambda n: n.pred_ms[first] or 0.0, reverse=True)
        assert _row_names(_printout(gpus, top=5)) == [f"g{n.graph}/{n.name}" for n in ranked[:5]]
    with pytest.raises(ValueError, match="top must be a positive"):
        report.print(top=0)


FOUR_GPUS = ["H100-SXM", "A100-SXM4-80GB", "L4", "T4"]


def _printout(report: Report, top: int | None = 15) -> str:
    out = io.StringIO()
    report.print(top=top, file=out)
    return out.getvalue()


def _row_names(text: str) -> list[str]:
    """The first cell of each row of the node table (the first table printed)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("─")) + 1
    rows = itertools.takewhile(str.strip, lines[start:])
    return [row.split()[0] for row in rows]


def test_the_printout_of_four_gpus_fits_120_columns_and_cuts_no_figure(report: Report) -> None:
    import re

    from fxcost.report.table import WIDTH

    four = report.predict(FOUR_GPUS)
    four.nodes[0].module = "encoder.layers.11.attention.output.dense.dropout"  # longer than any column
    for top in (15, None):
        lines = _printout(four, top).splitlines()
        assert WIDTH == 120 and max(map(len, lines)) <= WIDTH
    text = _printout(four)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("node"))
    assert "GFLOP" in header and "L4" in header and "T4" in header and "H100-SXM" in header
    # Every figure is whole: a shape, a GFLOP and a time never end in an ellipsis.
    assert not re.search(r"[\dx]…", text)
    slowest = sorted(four.nodes, key=lambda n: n.pred_ms["H100-SXM"] or 0.0, reverse=True)[:15]
    for n in slowest:
        row = next(line for line in text.splitlines() if f"g{n.graph}/{n.name} " in line)
        assert row.split()[-4:] == [f"{n.pred_ms[d]:.4f}" for d in FOUR_GPUS]


def test_a_table_too_wide_leaves_out_the_least_useful_columns_first(report: Report) -> None:
    from fxcost.report.table import _DROPPABLE

    def header(gpus: list[str]) -> list[str]:
        text = _printout(report.predict(gpus))
        return next(line for line in text.splitlines() if line.lstrip().startswith("node")).split()

    assert {"node", "phase", "module", "output", "GFLOP", "MB"} <= set(header(["T4"]))
    four = header(FOUR_GPUS)
    dropped = [c for c in _DROPPABLE if c not in four]
    assert dropped and dropped == list(_DROPPABLE[: len(dropped)])
    assert {"node", "output", "GFLOP"} <= set(four)


def test_shapes_are_abbreviated_to_the_largest_tensor() -> None:
    from fxcost.report.table import shape_text

    assert shape_text([(8, 64), (8, 1024, 14, 14), (1024,)]) == "8x1024x14x14 +2"
    assert shape_text([(8, 32)]) == "8x32"
    assert shape_text([()]) == "scalar"
    assert shape_text([]) == "-"


def test_the_header_states_the_step_its_precision_and_origin(report: Report) -> None:
    text = _printout(report)
    first = text.splitlines()[0]
    assert first.startswith("Sequential: training step (fw + bw), batch 8, fp32") and "eager" in first
    assert "sequence length" not in first  # float inputs: no sequence
    assert "origin: cpu (where the step was captured); node times shown for reference" in text
    assert "GPU predictions never use CPU times" in text
    assert "predicted by auto (share of predicted time): MLP heads" in text
    # The heads were fit on T4 measurements, never on an H100's: the header says which rest on specs.
    (unmeasured,) = [line for line in text.splitlines() if line.startswith("never measured")]
    assert "H100-SXM" in unmeasured and "T4" not in unmeasured


def test_the_header_names_autocast_and_the_sequence_length() -> None:
    from fxcost import zoo

    model, inputs = zoo.build("gpt2", 2, layers=1, dim=64, heads=2, seq=16, vocab=128)
    mixed = fxcost.profile(zoo.Autocast(model, "cpu"), inputs, devices=["T4"], measure=False)
    text = _printout(mixed, top=3)
    assert "GPT2" not in text.splitlines()[0] and "Autocast: training step (fw + bw), batch 2" in text
    assert "sequence length 16, bf16 autocast, eager" in text
    assert "nothing timed: GPU predictions are origin-free" in text
    assert "(measured)" not in text and "capture fidelity" not in text  # nothing measured: no column


def test_to_dataframe(report: Report) -> None:
    pytest.importorskip("pandas")
    df = report.to_dataframe()
    assert len(df) == len(report.nodes)
    assert {"name", "op", "phase", "flops", "bytes", "origin_ms", "pred_ms[T4]"} <= set(df.columns)
    assert df["pred_ms[T4]"].sum() == pytest.approx(report.total_ms("T4"))


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_trace_round_trip_gives_an_identical_report(report: Report, tmp_path, suffix: str) -> None:
    path = report.save(tmp_path / f"trace{suffix}")
    loaded = Report.load(path)
    assert loaded == report
    assert loaded.to_json() == report.to_json()
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if suffix.endswith(".gz") else raw)
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["torch_version"] == torch.__version__
    assert data["origin"] == "cpu"


def test_loaded_trace_predicts_other_devices(report: Report, tmp_path) -> None:
    loaded = Report.load(report.save(tmp_path / "t.json"))
    other = loaded.predict(["L4", "A100-SXM4-80GB"])
    assert other.devices == ["L4", "A100-SXM4-80GB"]
    assert other.total_ms("L4") > 0
    assert loaded.devices == ["H100-SXM", "T4"]  # the original is untouched
    assert [n.origin_ms for n in other.nodes] == [n.origin_ms for n in report.nodes]


def test_other_schema_version_is_refused(report: Report, tmp_path) -> None:
    data = report.to_json()
    data["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError, match=f"this fxcost reads version {SCHEMA_VERSION}"):
        Report.load(path)


def test_truncated_or_foreign_json_is_refused(report: Report, tmp_path) -> None:
    path = report.save(tmp_path / "t.json")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(TraceFormatError, match="not a readable fxcost trace"):
        Report.load(path)
    path.write_text('{"hello": 1}')
    with pytest.raises(TraceFormatError, match="no schema_version"):
        Report.load(path)
    data = report.to_json()
    del data["nodes"][0]["op"]
    path.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError, match="malformed"):
        Report.load(path)


def test_save_is_atomic(report: Report, tmp_path, monkeypatch) -> None:
    path = report.save(tmp_path / "t.json")
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", fail)
    with pytest.raises(OSError, match="disk full"):
        report.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary file left behind


def test_last_report_before_any_capture(monkeypatch) -> None:
    from fxcost.capture import backend

    monkeypatch.setattr(backend, "_last_backend", None)
    with pytest.raises(RuntimeError, match="no fxcost capture yet"):
        fxcost.last_report()


def test_by_module_rolls_up_predictions(report: Report) -> None:
    rollup = report.by_module("T4")
    assert set(rollup) >= {"0", "1", "2", "3"}  # the Sequential's four children
    total = sum(ms for phases in rollup.values() for ms in phases.values())
    assert total == pytest.approx(report.total_ms("T4"))
    assert rollup["0"]["bw"] > 0  # backward nodes count for the module they differentiate
    assert next(iter(rollup)) == max(rollup, key=lambda m: sum(rollup[m].values()))
    assert set(report.by_module("T4", depth=0)) == {""}


def test_at_batch_extrapolates_a_line_through_smaller_batches() -> None:
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))

    def captured(batch: int) -> Report:
        return fxcost.profile(model, (torch.randn(batch, 512),), devices=["T4"], measure=False,
                              cost_model="roofline")  # fmt: skip

    reports = [captured(b) for b in (1024, 2048, 4096)]
    assert [r.batch for r in reports] == [1024, 2048, 4096]
    fit = fxcost.at_batch(reports, 16384)
    assert fit.total_ms("T4") == pytest.approx(captured(16384).total_ms("T4"), rel=0.05)
    assert fxcost.at_batch({r.batch: r for r in reports}, 16384).total_ms("T4") == fit.total_ms("T4")
    slope, _ = fit.line("T4", "fw")
    assert slope > 0
    with pytest.raises(ValueError, match="two reports of one batch size"):
        fxcost.at_batch([reports[0], reports[0]], 64)
    with pytest.raises(ValueError, match="two or more positive batch sizes"):
        fxcost.at_batch({8: captured(8)}, 64)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        fxcost.at_batch({8: captured(8), 16: captured(16)}, 0)


def test_at_batch_never_extrapolates_below_the_steps_roofline() -> None:
    model = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024))

    def captured(batch: int) -> Report:
        return fxcost.profile(model, (torch.randn(batch, 1024),), devices=["H100-SXM"], measure=False)

    fit = fxcost.at_batch([captured(b) for b in (8, 16, 32)], 8192)
    big = captured(8192)
    roofline = big.predict(["H100-SXM"], "roofline").total_ms("H100-SXM")
    # Launch-bound small batches draw a flat line; the floor holds the prediction up to the roofline.
    slope, fixed = fit.line("H100-SXM")
    assert fixed + slope * 8192 < roofline
    assert roofline * 0.95 <= fit.floor_ms("H100-SXM") <= roofline * 1.0001
    assert fit.total_ms("H100-SXM") == fit.floor_ms("H100-SXM")
    assert fxcost.at_batch([captured(b) for b in (8, 16, 32)], 12).floor_ms("H100-SXM") == 0.0


def test_eager_pipeline_hides_per_op_overhead_and_waits_for_the_host() -> None:
    from fxcost.gpus import get_device
    from fxcost.records import NodeCost

    t4 = get_device("T4")

    def node(ms: float, source: str = "mlp") -> NodeCost:
        return NodeCost(
            name="n", op="aten.add.Tensor", phase="fw", pred_ms={"T4": ms}, pred_source={"T4": source}
        )

    # Long kernels: back to back, each without the overhead of timing it alone.
    big = Report(nodes=[node(1.0), node(2.0)], devices=["T4"])
    assert big.total_ms("T4") == pytest.approx(3.0)
    assert big.eager_ms("T4") == pytest.approx(3.0 - 2 * t4.overhead_ms + 0.010)
    # Roofline times are kernel times already: nothing to take off.
    roofline = Report(nodes=[node(1.0, "roofline")], devices=["T4"])
    assert roofline.eager_ms("T4", host_ms=0) == pytest.approx(1.0)
    # Tiny kernels: the host issuing them bounds the iteration.
    tiny = Report(nodes=[node(t4.overhead_ms + 0.001) for _ in range(100)], devices=["T4"])
    assert tiny.eager_ms("T4", host_ms=0.05) == pytest.approx(100 * 0.05 + 0.002, rel=0.01)
    with pytest.raises(ValueError, match="host_ms must be >= 0"):
        tiny.eager_ms("T4", host_ms=-1)


def test_critical_path_overlaps_independent_branches() -> None:
    class TwoBranches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x) + self.b(x)

    report = fxcost.profile(TwoBranches(), (torch.randn(64, 256),), devices=["T4"], measure=False,
                            cost_model="roofline")  # fmt: skip
    ms = {n.name: n.pred_ms["T4"] for n in report.nodes if n.phase == "fw"}
    addmms = [v for k, v in ms.items() if k.startswith("addmm")]
    assert len(addmms) == 2
    # Both GEMMs read only x: on two streams they overlap; the add (then the loss's sum) waits for both.
    critical = report.critical_path_ms("T4", "fw", host_ms=0)
    assert critical == pytest.approx(max(addmms) + ms["add"] + ms["sum_1"])
    assert critical < report.eager_ms("T4", "fw", host_ms=0)
    assert report.critical_path_ms("T4") <= report.eager_ms("T4")


@settings(max_examples=200, deadline=None)
@given(
    graphs=st.lists(
        st.lists(st.tuples(st.floats(0.0, 5.0), st.booleans(), st.lists(st.integers(0, 30), max_size=3)),
                 min_size=1, max_size=30),
        min_size=1, max_size=3,
    ),
    host_ms=st.floats(0.0, 0.5),
    source=st.sampled_from(["roofline", "mlp"]),
)  # fmt: skip
def test_critical_path_never_exceeds_the_eager_step(graphs, host_ms: float, source: str) -> None:
    """Any DAG, any kernel times, any host speed: overlapping independent ops never takes longer."""
    nodes = []
    for g, graph in enumerate(graphs):
        for i, (ms, kernel, inputs) in enumerate(graph):
            nodes.append(NodeCost(
                name=f"n{i}", op="aten.add.Tensor" if kernel else "aten.view.default", phase="fw",
                graph=g, inputs=[f"n{j}" for j in inputs if j < i], has_kernel=kernel,
                pred_ms={"T4": ms}, pred_source={"T4": source},
            ))  # fmt: skip
    report = Report(nodes=nodes, devices=["T4"])
    eager = report.eager_ms("T4", host_ms=host_ms)
    assert report.critical_path_ms("T4", host_ms=host_ms) <= eager + 1e-9


def test_chrome_trace_of_the_predicted_eager_step(report: Report, tmp_path) -> None:
    path = report.to_chrome_trace(tmp_path / "step.json", "T4")
    events = json.loads(path.read_text())["traceEvents"]
    gpu = [e for e in events if e["ph"] == "X" and e["tid"] == 1]
    host = [e for e in events if e["ph"] == "X" and e["tid"] == 0]
    assert len(gpu) == len(host) == sum(n.has_kernel for n in report.nodes)
    assert all(
        b["ts"] >= a["ts"] + a["dur"] - 1e-6 for a, b in itertools.pairwise(gpu)
    )  # one stream, in order
    assert all(
        g["ts"] >= h["ts"] + h["dur"] - 1e-6 for g, h in zip(gpu, host, strict=True)
    )  # issued, then run
    end = gpu[-1]["ts"] + gpu[-1]["dur"]
    assert end / 1e3 == pytest.approx(report.eager_ms("T4"))
    with pytest.raises(ValueError, match="not predicted"):
        report.to_chrome_trace(tmp_path / "x.json", "H200")


def test_eager_ms_of_a_device_never_predicted_is_an_error(report: Report) -> None:
    with pytest.raises(ValueError, match="H200 was not predicted"):
        report.eager_ms("H200")


def test_a_measured_step_sets_the_host_time_and_in_step_kernel_scale() -> None:
    from fxcost.cost_models.eager import HOST_MS
    from fxcost.records import KernelRecord, NodeCost

    def node(kernel_ms: float) -> NodeCost:
        return NodeCost(name="n", op="aten.add.Tensor", phase="fw", origin_ms=kernel_ms + 0.02,
                        kernels=[KernelRecord("k", kernel_ms)], pred_ms={"T4": kernel_ms + 0.02},
                        pred_source={"T4": "wave_scaling"})  # fmt: skip

    nodes = [node(0.01) for _ in range(100)]  # 1 ms of kernels
    host_bound = Report(nodes=nodes, devices=["T4"], origin="T4", step_ms=5.0)
    pipeline = host_bound.pipeline()
    assert pipeline.fitted and pipeline.host_ms == pytest.approx(0.05 - 0.0001, rel=0.01)
    assert pipeline.kernel_scale == 1.0
    assert host_bound.eager_ms("T4") == pytest.approx(5.0, rel=1e-6)  # the replay is the step
    gpu_bound = Report(nodes=nodes, devices=["T4"], origin="T4", step_ms=0.8)
    pipeline = gpu_bound.pipeline()
    # The host issued the 100 ops and the last kernel ran after them: at most 0.8 / 101 ms per op.
    assert pipeline.host_ms == pytest.approx(min(HOST_MS, 0.8 / 101)) and 0.5 < pipeline.kernel_scale < 1
    assert gpu_bound.eager_ms("T4") == pytest.approx(0.8, rel=1e-6)
    unmeasured = Report(nodes=nodes, devices=["T4"], origin="cpu", step_ms=5.0)
    assert not unmeasured.pipeline().fitted and unmeasured.pipeline().host_ms == HOST_MS


def test_the_printout_gives_intervals_and_warns_where_spec_sheets_are_all_there_is(report: Report) -> None:
    import io

    amd = report.predict(["H100-SXM", "MI250"])
    out = io.StringIO()
    amd.print(file=out)
    text = out.getvalue()
    assert "80% interval" in text
    assert "caveat: MI250 is unlike every GPU the heads were fit on" in text and "caveat: H100" not in text
    low, high = amd.eager_interval_ms("H100-SXM")
    assert low < amd.eager_ms("H100-SXM") < high


def test_the_precision_is_read_from_the_matmuls_dtypes_and_tf32_flags() -> None:
    from fxcost.records import NodeCost
    from fxcost.report.header import captured_precision

    def mm(dtype: str, tf32: bool = False) -> NodeCost:
        return NodeCost("mm", "aten.mm.default", "fw", in_dtypes=[dtype] * 2, out_dtypes=[dtype], tf32=tf32)

    fp32 = ["float32"]
    norm = NodeCost("ln", "aten.native_layer_norm.default", "fw", in_dtypes=fp32, out_dtypes=fp32)
    ids = NodeCost("emb", "aten.embedding.default", "fw", in_dtypes=[*fp32, "int64"], out_dtypes=fp32)
    assert captured_precision([mm("float32"), norm]) == "fp32"
    assert captured_precision([mm("float32", tf32=True), norm]) == "fp32 (TF32 allowed)"
    assert captured_precision([mm("bfloat16"), norm]) == "bf16 autocast"
    assert captured_precision([mm("float16"), mm("float16")]) == "fp16"
    # A half-precision cast outside the matmuls does not make an fp32 step mixed.
    cast = NodeCost("c", "aten._to_copy.default", "fw", in_dtypes=["float32"], out_dtypes=["bfloat16"])
    assert captured_precision([mm("float32"), cast, ids]) == "fp32"
    assert captured_precision([NodeCost("a", "aten.add.Tensor", "fw", in_dtypes=["int64"])]) == (
        "no floating-point tensors"
    )


def test_a_gpu_origin_is_named_with_its_measured_column(report: Report) -> None:
    on_gpu = Report.from_json({**report.to_json(), "origin": "NVIDIA H100 80GB HBM3"}).predict(["T4", "L4"])
    text = _printout(on_gpu, top=5)
    assert "origin: H100-SXM (where the step was captured), each node timed there" in text
    assert "other GPUs are predicted from those times" in text and "never use CPU times" not in text
    header = [line for line in text.splitlines() if "(measured)" in line]
    assert header and "H100-SXM" in text.splitlines()[text.splitlines().index(header[0]) - 1]
    assert "predicted by auto (share of predicted time)" in text and "wave scaling" in text
