"""The fxcost command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fxcost.cli import main
from fxcost.report import Report


def test_help_lists_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fxcost.cli", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("demo", "profile", "show", "devices"):
        assert command in out.stdout


def test_profile_then_show(tmp_path, capsys) -> None:
    trace = tmp_path / "mlp.json"
    argv = ["profile", "mlp", "--batch", "2", "--devices", "T4", "L4", "--out", str(trace), "--top", "5",
            "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("mlp: training step (fw + bw), batch 2, fp32") and "totals (ms)" in out
    # A CPU machine times nothing unless asked: no CPU column, no fidelity, the GPUs predicted anyway.
    assert "nothing timed" in out and "(measured)" not in out and "capture fidelity" not in out
    report = Report.load(trace)
    assert report.devices == ["T4", "L4"] and report.origin_ms() is None
    assert report.name == "mlp" and report.batch == 2

    assert main(["show", str(trace), "--devices", "H100-SXM", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mlp: training step") and "H100-SXM" in out and "the 3 slowest of" in out


def test_profile_times_nodes_on_the_cpu_only_when_asked(capsys) -> None:
    argv = ["profile", "mlp", "--batch", "2", "--devices", "T4", "--top", "3", "--device", "cpu"]
    argv.append("--measure-cpu")
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "(measured)" in captured.out and "capture fidelity" in captured.out
    assert "GPU predictions never use CPU times" in captured.out
    assert "timing" not in captured.out and "capturing" not in captured.out  # progress stays off stdout


def test_demo_prints_tables_that_fit_120_columns(monkeypatch, capsys) -> None:
    from fxcost.cli import step_commands

    monkeypatch.setattr(step_commands, "_default_device", lambda: "cpu")  # as on a machine without a GPU
    monkeypatch.setattr(step_commands, "DEMO_MODELS", (("mlp", 2, {"layers": 2}), ("gpt2", 2, {
        "layers": 1, "dim": 64, "heads": 2, "seq": 16, "vocab": 128})))  # fmt: skip
    assert main(["demo", "--top", "5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 120
    assert "mlp (layers 2): training step (fw + bw), batch 2, fp32" in out
    gpt2 = "gpt2 (layers 1, dim 64, heads 2, vocab 128): training step (fw + bw), batch 2, sequence length 16"
    assert gpt2 in out
    assert "(measured)" not in out  # nothing timed on a CPU
    header = next(line for line in lines if line.lstrip().startswith("node"))
    assert "GFLOP" in header and "T4" in header and "L4" in header and "H100-SXM" in header


def test_profile_module_callable(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "my_models.py").write_text(
        "import torch\ndef tiny(batch):\n    return torch.nn.Linear(4, 2), (torch.randn(batch, 4),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["profile", "my_models:tiny", "--batch", "3", "--no-measure", "--devices", "T4"]) == 0
    assert "addmm" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "nosuchmodel"], "unknown zoo model 'nosuchmodel'"),
        (["profile", "mlp", "--devices", "H1OO"], "unknown device 'H1OO'"),
        (["profile", "nosuchmodule:f"], "cannot load 'nosuchmodule:f'"),
        (["show", "/nonexistent/trace.json"], "No such file"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, message, capsys) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_devices_lists_the_database(capsys) -> None:
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "H100-SXM" in out and "T4" in out


def test_show_scales_a_gpu_trace_with_wave_scaling(tmp_path, capsys) -> None:
    from fxcost.data.datasets import kernel_alike_node

    node = kernel_alike_node("add", 8192, 1024)
    node.origin_ms = 0.2
    trace = Report(nodes=[node], origin="Tesla V100-PCIE-32GB", devices=[], model="roofline")
    path = trace.save(tmp_path / "v100.json")
    assert main(["show", str(path), "--devices", "T4", "--model", "wave_scaling,roofline"]) == 0
    out = capsys.readouterr().out
    assert "wave_scaling" in out and "T4" in out
    assert main(["show", str(path), "--devices", "T4", "--model", "nope"]) == 2
    assert "unknown cost model 'nope'" in capsys.readouterr().err


def test_simulate_takes_a_hugging_face_config(tiny_gpt2_config, capsys) -> None:
    path = tiny_gpt2_config
    argv = [
        "simulate",
        str(path),
        "--cluster",
        "1x2xT4",
        "--strategy",
        "dp=2",
        "--batch",
        "4",
        "--seqlen",
        "32",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "dp=2" in out and "on 1x2xT4" in out and "samples/s" in out
