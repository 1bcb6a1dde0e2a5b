"""Execution modes (eager, compiled, cudagraphs) on reports, the estimator, sweeps and the CLI."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

import fxcost
from fxcost.cli import main
from fxcost.report import Report
from fxcost.sweeps import Point

DEVICE = "A100-PCIE-40GB"


class _Pointwise(nn.Module):
    """Mostly pointwise work: what Inductor's fusion saves most on."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = torch.tanh(x * 1.5 + 0.5) * torch.sigmoid(x)
        return torch.nn.functional.layer_norm(self.proj(x) + x, (256,))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(512, 256),)


@pytest.fixture(scope="module")
def pointwise() -> Report:
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fxcost.profile(_Pointwise(), _inputs(), devices=[DEVICE, "H100-SXM"], measure=False)


def test_compiled_and_cudagraphs_are_no_slower_than_eager(pointwise) -> None:
    for device in pointwise.devices:
        eager = pointwise.eager_ms(device)
        assert pointwise.step_ms_in(device, execution="eager") == eager
        assert pointwise.step_ms_in(device, execution="cudagraphs") <= eager
        compiled = pointwise.step_ms_in(device, execution="compiled")
        assert compiled == pointwise.compiled_ms(device)
        assert 0 < compiled < eager  # the pointwise chains fuse: fewer passes over memory, fewer launches
        for phase in pointwise.phases():
            assert pointwise.compiled_ms(device, phase) <= compiled
    kernels = pointwise.fused_kernels()
    assert len(kernels) < sum(n.has_kernel for n in pointwise.nodes)


def test_a_generated_kernel_is_priced_by_its_bytes_not_its_members(pointwise) -> None:
    device = fxcost.get_device(DEVICE)
    spans = pointwise.compiled_timeline(DEVICE)
    fused = [s for s in spans if s.kernel.kind != "extern" and len(s.kernel.members) > 2]
    assert fused
    for span in fused:
        members = span.kernel.nodes(pointwise.nodes)
        eager = sum(n.pred_ms[device.name] for n in members)
        assert span.end_ms - span.start_ms < eager  # one pass instead of one per member


def test_bad_execution_values_name_the_accepted_ones(pointwise) -> None:
    accepted = "accepted: eager, compiled, cudagraphs"
    with pytest.raises(ValueError, match=accepted):
        pointwise.step_ms_in(DEVICE, execution="jit")
    with pytest.raises(ValueError, match=accepted):
        Report(execution="inductor")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=accepted):
        fxcost.profile(_Pointwise(), _inputs(), devices=[DEVICE], measure=False, execution="fast")
    with pytest.raises(ValueError, match=accepted):
        fxcost.estimate(devices=[DEVICE], execution="graph")
    with pytest.raises(ValueError, match=accepted):
        fxcost.cost(_Pointwise(), _inputs(), device=DEVICE, execution="x")
    with pytest.raises(ValueError, match=accepted):
        Point("mlp", batch=2, device=DEVICE, execution="compile")


def test_the_trace_keeps_the_mode_and_old_traces_read_as_eager(pointwise, tmp_path) -> None:
    compiled = Report.from_json(pointwise.to_json() | {"execution": "compiled"})
    compiled.save(tmp_path / "t.json.gz")
    loaded = Report.load(tmp_path / "t.json.gz")
    assert loaded.execution == "compiled"
    assert loaded.step_ms_in(DEVICE) == pytest.approx(pointwise.compiled_ms(DEVICE))
    old = pointwise.to_json()
    del old["execution"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Report.load(tmp_path / "old.json").execution == "eager"


def test_the_printout_names_the_mode_and_lists_fused_kernels(pointwise, capsys) -> None:
    pointwise.print(top=3)
    eager = capsys.readouterr().out
    assert "eager (op by op" in eager and "compiled step" not in eager
    Report.from_json(pointwise.to_json() | {"execution": "compiled"}).print(top=3)
    out = capsys.readouterr().out
    assert "compiled (torch.compile with Inductor" in out
    assert "eager step" in out and "compiled step" in out  # both, side by side
    listing = [line for line in out.splitlines() if line.startswith("  ") and " + " in line]
    assert listing and any("tanh" in line and "sigmoid" in line for line in listing)


def test_the_estimator_prices_the_modes_as_the_report_does(pointwise) -> None:
    estimator = fxcost.Estimator(devices=[DEVICE])
    costs = {mode: estimator.cost(_Pointwise(), _inputs(), train=False, execution=mode)
             for mode in ("eager", "compiled", "cudagraphs")}  # fmt: skip
    assert costs["compiled"].execution == "compiled"
    assert costs["compiled"].ms < costs["eager"].ms and costs["cudagraphs"].ms <= costs["eager"].ms
    inference = fxcost.profile(_Pointwise(), _inputs(), devices=[DEVICE], measure=False, train=False)
    assert costs["compiled"].ms == pytest.approx(inference.compiled_ms(DEVICE), rel=1e-6)
    assert costs["eager"].ms == pytest.approx(inference.eager_ms(DEVICE), rel=1e-6)
    # At another batch the fused kernels are priced at that batch's sizes.
    double = estimator.cost(_Pointwise(), _inputs(), train=False, batch_size=1024, execution="compiled")
    assert double.ms > costs["compiled"].ms


class _ScaledRelu(nn.Module):
    """``relu(x) * 1.5``: the backward's ``grad * 1.5`` equals the forward's ``mul`` node for node, so
    the estimator keeps one distinct node for both, and it opens a backward kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) * 1.5)


class _ConvNet(nn.Module):
    """Convolutions wide enough for Inductor's channels-last layout, batch norms between them."""

    def __init__(self) -> None:
        super().__init__()
        layers = [(nn.Conv2d(c, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU()) for c in (3, 128)]
        self.body = nn.Sequential(*(layer for block in layers for layer in block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize(("model", "inputs"), [(_ScaledRelu, (32, 64)), (_ConvNet, (8, 3, 16, 16))])
def test_the_estimators_compiled_step_and_phases_are_the_reports(model, inputs) -> None:
    """The estimator prices the compiled step as the report does (a channels-last conv net's batch
    norms included), and splits it where the report's forward kernels end."""
    from fxcost.lowering.fusion_layout import channels_last

    torch.manual_seed(0)
    args = (torch.randn(*inputs),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fxcost.profile(model(), args, devices=[DEVICE], measure=False)
        cost = fxcost.Estimator(devices=[DEVICE]).cost(model(), args, execution="compiled")
    assert channels_last(report.nodes) == (model is _ConvNet)
    assert cost.ms == pytest.approx(report.compiled_ms(DEVICE), rel=1e-6)
    forward_end = max(s.end_ms for s in report.compiled_timeline(DEVICE) if s.phase == "fw")
    assert cost.fw_ms == pytest.approx(forward_end, rel=1e-6)


def test_the_torch_compile_backend_reports_the_compiled_step_beside_eager() -> None:
    torch._dynamo.reset()
    backend = fxcost.estimate(devices=[DEVICE], measure=False)
    torch.compile(_Pointwise(), backend=backend)(*_inputs())
    report = fxcost.last_report()
    assert report.execution == "compiled"
    assert 0 < report.step_ms_in(DEVICE) < report.eager_ms(DEVICE)


def test_the_cli_takes_the_execution_mode(tmp_path, capsys) -> None:
    trace = tmp_path / "mlp.json"
    argv = ["profile", "mlp", "--batch", "2", "--devices", "T4", "--top", "3", "--device", "cpu",
            "--execution", "cudagraphs", "--out", str(trace)]  # fmt: skip
    assert main(argv) == 0
    assert "cudagraphs step" in capsys.readouterr().out and Report.load(trace).execution == "cudagraphs"
    assert main(["show", str(trace), "--execution", "compiled", "--top", "2"]) == 0
    assert "compiled step" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["show", str(trace), "--execution", "fast"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_header_warns_when_attention_was_captured_on_its_math_path() -> None:
    from fxcost.records import NodeCost
    from fxcost.report import Report
    from fxcost.report.header import MATH_ATTENTION, MATH_ATTENTION_CAVEAT, header_lines

    softmax = NodeCost("s", MATH_ATTENTION, "fw", in_shapes=[(2, 4, 8, 8)], out_shapes=[(2, 4, 8, 8)])
    plain = NodeCost("r", "aten.relu.default", "fw", in_shapes=[(8,)], out_shapes=[(8,)])
    assert MATH_ATTENTION_CAVEAT in header_lines(Report(nodes=[plain, softmax]))
    assert MATH_ATTENTION_CAVEAT not in header_lines(Report(nodes=[plain]))
    assert MATH_ATTENTION_CAVEAT not in header_lines(Report(nodes=[plain, softmax], execution="compiled"))


def test_an_execution_set_after_construction_is_checked_when_printed() -> None:
    from fxcost.records import NodeCost
    from fxcost.report import Report
    from fxcost.report.header import header_lines

    report = Report(nodes=[NodeCost("r", "aten.relu.default", "fw", in_shapes=[(8,)], out_shapes=[(8,)])])
    report.execution = "fast"
    with pytest.raises(ValueError, match="eager"):
        header_lines(report)
