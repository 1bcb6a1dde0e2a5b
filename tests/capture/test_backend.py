"""The torch.compile backend: capture, exactness against eager, graph breaks, failures, registration."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import fxcost
from fxcost import zoo
from fxcost.passes import annotate, measure
from fxcost.records import META_KEY, NodeCost
from fxcost.report import Report

SMALL_ZOO = {
    "mlp": dict(batch=4, features=32, hidden=64, layers=3, classes=10),
    "resnet50": dict(batch=2, image=32, width=8),
    "lstm": dict(batch=2, seq=6, vocab=50, embed=16, hidden=16),
    "transformer_block": dict(batch=2, seq=8, dim=32, heads=4),
    "gpt2": dict(batch=2, seq=8, vocab=64, dim=32, heads=4, layers=2),
}


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out if out.dim() == 0 else out.sum()


def _step(model: nn.Module, inputs, seed: int = 0):
    """One training step from a fixed seed: (loss, parameter gradients, buffers after the step)."""
    torch.manual_seed(seed)
    loss = _loss(model(*inputs))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]
    return loss.detach(), grads, buffers


def _assert_same_step(eager, compiled) -> None:
    (loss_e, grads_e, buffers_e), (loss_c, grads_c, buffers_c) = eager, compiled
    for a, b in zip([loss_e, *grads_e, *buffers_e], [loss_c, *grads_c, *buffers_c], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # bit-identical


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "resnet50" else n for n in SMALL_ZOO]
)
def test_zoo_model_outputs_and_gradients_equal_eager(name: str) -> None:
    config = dict(SMALL_ZOO[name])
    model, inputs = zoo.build(name, **config)
    compiled_model = copy.deepcopy(model)
    reference_model = copy.deepcopy(model)
    eager = _step(model, inputs)

    backend = fxcost.estimate(devices=["H100-SXM", "T4"], budget_ms=0.2)
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = _step(torch.compile(compiled_model, backend=backend), inputs)
        torch._dynamo.reset()
        reference = _step(torch.compile(reference_model, backend="aot_eager"), inputs)
    # fxcost runs exactly the graphs AOTAutograd captured: bit-identical to PyTorch's aot_eager.
    _assert_same_step(reference, compiled)
    if name == "lstm":
        # AOTAutograd decomposes the fused CPU LSTM kernel into per-step matmuls, which sums in
        # another order: equal to eager up to rounding, in any backend.
        torch.testing.assert_close(compiled[1], eager[1], rtol=1e-4, atol=1e-6)
    else:
        _assert_same_step(eager, compiled)

    report = backend.report()
    assert not backend.failures
    assert {g.phase for g in report.graphs} == {"fw", "bw"}
    assert report.nodes and all(n.origin_ms is not None for n in report.nodes)
    assert all(set(n.pred_ms) == {"H100-SXM", "T4"} for n in report.nodes)


def test_every_call_node_is_annotated() -> None:
    model, inputs = zoo.build("transformer_block", **SMALL_ZOO["transformer_block"])
    seen = []

    def spy(gm, phase, graph_index=0):
        seen.append(gm)
        return original(gm, phase, graph_index)

    original = annotate.run
    backend = fxcost.estimate(devices=["T4"], measure=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(annotate, "run", spy)
        _step(torch.compile(model, backend=backend), inputs)
    assert len(seen) == 2
    for gm in seen:
        for node in gm.graph.nodes:
            if node.op == "call_function":
                assert isinstance(node.meta[META_KEY], NodeCost), node.format_node()
            else:
                assert META_KEY not in node.meta


def test_module_paths_for_forward_and_backward_nodes() -> None:
    model, inputs = zoo.build("transformer_block", **SMALL_ZOO["transformer_block"])
    backend = fxcost.estimate(devices=["T4"], measure=False)
    _step(torch.compile(model, backend=backend), inputs)
    report = backend.report()
    qkv = [n for n in report.nodes if n.module == "attn.qkv"]
    assert {n.phase for n in qkv} == {
        "fw",
        "bw",
    }  # backward nodes map to the module they differentiate
    assert any(n.op == "aten.addmm.default" for n in qkv if n.phase == "fw")
    assert any(n.op == "aten.mm.default" for n in qkv if n.phase == "bw")
    assert {"ln1", "ln2", "mlp.0", "mlp.2", "attn.proj"} <= {n.module for n in report.nodes}


def test_graph_break_still_yields_one_report() -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.a(x))
            torch._dynamo.graph_break()
            return self.b(x)

    model, x = Broken(), torch.randn(3, 8)
    eager = _step(copy.deepcopy(model), (x,))
    backend = fxcost.estimate(devices=["T4"], budget_ms=0.2)
    compiled = _step(torch.compile(model, backend=backend), (x,))
    _assert_same_step(eager, compiled)
    report = fxcost.last_report()
    assert [g.phase for g in report.graphs] == ["fw", "fw", "bw", "bw"]
    assert len({g.frame for g in report.graphs}) == 2
    assert sum(n.op == "aten.addmm.default" for n in report.nodes) == 2
    assert [n.graph for n in report.nodes] == sorted(n.graph for n in report.nodes)


def test_a_graph_with_only_cpu_inputs_keeps_the_gpu_origin(monkeypatch) -> None:
    """Found on an H100: a graph break whose last graph took no CUDA tensor reset the origin to "cpu",
    and the runtime-based models then ignored every measurement of the step."""
    from fxcost.capture import backend as backend_module

    seen = iter(["NVIDIA H100 80GB HBM3", "cpu", "cpu", "cpu"])
    monkeypatch.setattr(backend_module, "_origin_name", lambda inputs: next(seen, "cpu"))

    def two_graphs(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        torch._dynamo.graph_break()
        return torch.arange(4.0) + y.sum()

    fxcost_backend = fxcost.estimate(devices=["T4"], budget_ms=0.2)
    torch.compile(two_graphs, backend=fxcost_backend)(torch.randn(4))
    assert fxcost.last_report().origin == "NVIDIA H100 80GB HBM3"


def test_recompile_replaces_the_frame_graphs() -> None:
    model = nn.Linear(8, 4)
    backend = fxcost.estimate(devices=["T4"], measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    compiled(torch.randn(2, 8)).sum().backward()
    compiled(torch.randn(5, 8)).sum().backward()  # new shape: Dynamo recompiles the frame
    report = backend.report()
    assert len(report.graphs) == 2
    (addmm,) = [n for n in report.nodes if n.op == "aten.addmm.default"]
    assert addmm.out_shapes == [(5, 4)]


@pytest.mark.parametrize("stage", ["annotate", "measure", "predict"])
def test_injected_failure_leaves_training_unchanged(stage: str, monkeypatch) -> None:
    model, inputs = zoo.build("transformer_block", **SMALL_ZOO["transformer_block"])
    eager = _step(copy.deepcopy(model), inputs)

    def boom(*args, **kwargs):
        raise RuntimeError(f"injected {stage} failure")

    from fxcost.passes import predict

    target = {"annotate": annotate, "measure": measure, "predict": predict}[stage]
    monkeypatch.setattr(target, "run", boom)
    backend = fxcost.estimate(devices=["T4"], budget_ms=0.2)
    with pytest.warns(RuntimeWarning, match=f"injected {stage} failure"):
        compiled = _step(torch.compile(model, backend=backend), inputs)
    _assert_same_step(eager, compiled)
    assert backend.failures


def test_failure_inside_aot_autograd_falls_back_to_the_dynamo_graph(monkeypatch) -> None:
    import torch._dynamo.backends.common as common

    def broken_aot(**kwargs):
        raise RuntimeError("injected capture failure")

    monkeypatch.setattr(common, "aot_autograd", broken_aot)
    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    eager = _step(copy.deepcopy(model), (x,))
    backend = fxcost.estimate(devices=["T4"])
    with pytest.warns(RuntimeWarning, match="injected capture failure"):
        compiled = _step(torch.compile(model, backend=backend), (x,))
    _assert_same_step(eager, compiled)


def test_failure_warns_once_per_stage(monkeypatch) -> None:
    monkeypatch.setattr(annotate, "run", lambda *a, **k: 1 / 0)
    backend = fxcost.estimate(devices=["T4"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step(torch.compile(nn.Linear(4, 2), backend=backend), (torch.randn(3, 4),))
    assert len([w for w in caught if "fxcost" in str(w.message)]) == 1
    assert len(backend.failures) == 2  # forward and backward graph both failed


def _train_with_optimizer(model: nn.Module, x: torch.Tensor, backend) -> list[torch.Tensor]:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    compiled_model = torch.compile(model, backend=backend)
    compiled_step = torch.compile(opt.step, backend=backend)
    for _ in range(2):
        compiled_model(x).sum().backward()
        compiled_step()
    return [p.detach().clone() for p in model.parameters()]


def test_optimizer_step_is_captured_as_its_own_phase() -> None:
    model, x = nn.Linear(16, 4), torch.randn(8, 16)
    reference_model = copy.deepcopy(model)
    backend = fxcost.estimate(devices=["T4"], budget_ms=0.2)
    params = _train_with_optimizer(model, x, backend)
    torch._dynamo.reset()
    # A compiled Adam step computes in another order than eager Adam; fxcost adds nothing to that.
    reference = _train_with_optimizer(reference_model, x, "aot_eager")
    for a, b in zip(reference, params, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    report = backend.report()
    assert report.phases() == ["fw", "bw", "opt"]
    opt_nodes = [n for n in report.nodes if n.phase == "opt"]
    assert opt_nodes and report.total_ms("T4", "opt") > 0
    assert all(n.origin_ms is not None for n in opt_nodes)


def test_backend_by_name() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("fxcost") is fxcost.capture.backend.fxcost_backend
    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    eager = _step(copy.deepcopy(model), (x,))
    compiled = _step(torch.compile(model, backend="fxcost"), (x,))
    _assert_same_step(eager, compiled)
    report = fxcost.last_report()
    assert report.devices == list(fxcost.gpus.DEFAULT_DEVICES)
    assert report.total_ms("H100-SXM") > 0


def test_unknown_device_fails_before_training() -> None:
    with pytest.raises(fxcost.gpus.UnknownDeviceError, match="closest"):
        fxcost.estimate(devices=["H100-SXM", "A100-90GB"])


def test_bad_options_fail_before_training() -> None:
    from fxcost.capture import CaptureOptions, FxcostBackend

    with pytest.raises(ValueError, match="unknown cost model 'nope'"):
        fxcost.estimate(devices=["T4"], cost_model="nope")
    with pytest.raises(ValueError, match="unknown cost model 'nope'"):
        fxcost.estimate(devices=["T4"], overrides={"aten.mm.default": "nope"})
    with pytest.raises(TypeError, match="unknown capture options \\['model'\\]; accepted: devices"):
        fxcost.estimate(devices=["T4"], model="roofline")
    with pytest.raises(TypeError, match="FxcostBackend takes a CaptureOptions"):
        FxcostBackend(["T4"])  # type: ignore[arg-type]
    overrides = {"aten.mm.default": "roofline"}
    options = CaptureOptions(devices="Tesla T4", overrides=overrides)
    assert options.devices == ("T4",) and options.overrides == overrides
    assert options.overrides is not overrides  # a copy: the caller's dict may change later


def test_two_backends_share_no_state() -> None:
    a = fxcost.estimate(devices=["T4"], measure=False)
    b = fxcost.estimate(devices=["L4"], measure=False)
    _step(torch.compile(nn.Linear(4, 2), backend=a), (torch.randn(3, 4),))
    assert a.report().nodes and not b.report().nodes
    assert a.report().devices == ["T4"] and b.report().devices == ["L4"]


def test_dynamic_shapes_are_recorded_at_the_sizes_last_run() -> None:
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    backend = fxcost.estimate(devices=["T4"], measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for rows in (8, 12):
        x = torch.randn(rows, 16)
        out = compiled(x)
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
        out.sum().backward()
    report = fxcost.last_report()  # SymInt FLOP counts once made this deep copy fail
    assert not backend.failures
    assert report.total_ms("T4") > 0 and report.coverage("T4") == 1.0
    mms = [n for n in report.nodes if n.op == "aten.addmm.default"]
    assert mms and all(isinstance(n.flops, int) for n in mms)
    assert any(n.note and n.note.startswith("dynamic shape") for n in report.nodes)

    # The report is the step last run, at the sizes it ran with (here 12 rows, not the traced 8).
    (first,) = [n for n in mms if n.phase == "fw" and n.in_shapes[1] == (12, 16)]
    assert first.out_shapes == [(12, 32)] and first.flops == 2 * 12 * 16 * 32


class _Branchy(nn.Module):
    """A data-dependent branch: Dynamo breaks the graph there and compiles each branch on first use."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.wide, self.narrow = nn.Linear(16, 16), nn.Linear(16, 256), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.wide(h).sum() if h.sum() > 0 else self.narrow(h).sum()


def _branch_input(model: _Branchy, positive: bool) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    while True:
        x = torch.randn(8, 16, generator=generator)
        if bool(model.a(x).sum() > 0) == positive:
            return x


def test_a_branch_not_taken_in_the_last_step_is_listed_apart() -> None:
    model = _Branchy()
    backend = fxcost.estimate(devices=["T4"], measure=False)
    compiled = torch.compile(model, backend=backend)
    compiled(_branch_input(model, True)).backward()
    wide_only = backend.report()
    compiled(_branch_input(model, False)).backward()
    narrow = backend.report()
    # Both branches were captured; the step ran one: its total is not the sum of both.
    modules = {n.module for n in narrow.nodes}
    assert modules >= {"a", "narrow"} and "wide" not in modules
    assert [g.phase for g in narrow.apart] == ["fw", "bw"]
    assert len(backend.report(all_graphs=True).graphs) == len(narrow.graphs) + 2
    compiled(_branch_input(model, True)).backward()
    again = backend.report()
    assert again.total_ms("T4") == pytest.approx(wide_only.total_ms("T4"))
    assert "narrow" not in {n.module for n in again.nodes}
    assert Report.from_json(again.to_json()).apart == again.apart


def test_last_report_of_a_capture_that_got_nothing_says_why() -> None:
    """Found by a user: a GRU model compiled without allow_rnn gave no graph, and last_report()
    silently returned the report of a model captured earlier in the process."""
    _step(torch.compile(nn.Linear(4, 2), backend=fxcost.estimate(devices=["T4"], measure=False)),
          (torch.randn(3, 4),))  # fmt: skip
    gru = nn.GRU(8, 8, batch_first=True)
    with torch._dynamo.config.patch(allow_rnn=False):
        torch._dynamo.reset()
        torch.compile(gru, backend=fxcost.estimate(devices=["T4"], measure=False))(torch.randn(2, 3, 8))
    with pytest.raises(RuntimeError, match="allow_rnn"):
        fxcost.last_report()


def test_the_report_names_the_model_batch_and_sequence_length_it_was_given() -> None:
    model, inputs = zoo.build("gpt2", **SMALL_ZOO["gpt2"])
    backend = fxcost.estimate(devices=["T4"], measure=False)
    torch.compile(model, backend=backend)(*inputs).sum().backward()
    report = backend.report()
    # The batch is the caller's (2), not the leading dimension of a lifted parameter.
    assert (report.name, report.batch, report.seqlen) == (type(model).__name__, 2, 8)


def test_a_validation_pass_between_training_steps_leaves_the_training_step_reported() -> None:
    """Found in review: an eval call recompiles the frame under no_grad; the training graphs, run
    again after it, were no longer the report's."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    backend = fxcost.estimate(devices=["T4"], measure=False)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(8, 16)
    compiled(x).sum().backward()
    with torch.no_grad():
        compiled(x)
    assert [g.phase for g in backend.report().graphs] == ["fw"]  # the step last run: inference
    compiled(x).sum().backward()
    report = backend.report()
    assert [g.phase for g in report.graphs] == ["fw", "bw"] and len(report.apart) == 1


def test_a_dynamic_batch_is_reported_at_the_batch_last_run() -> None:
    backend = fxcost.estimate(devices=["T4"], measure=False)
    compiled = torch.compile(nn.Linear(16, 4), backend=backend)
    for batch in (4, 8, 6, 64):  # the third call compiles for a dynamic batch
        compiled(torch.randn(batch, 16)).sum().backward()
        report = backend.report()
        assert report.batch == batch
        assert [n.out_shapes for n in report.nodes if n.op == "aten.addmm.default"] == [[(batch, 4)]]
