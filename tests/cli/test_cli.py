"""The fxcost command."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fxcost.cli import main, status
from fxcost.cli.status import BAD_INPUT, OK, OUT_OF_MEMORY
from fxcost.report import Report

REPO = Path(__file__).resolve().parents[2]


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
    assert "GEMM" in out and "clock %" in out and "tensor" in out and "peak %" in out  # headers fold
    rows = [line.split("│") for line in out.splitlines() if line.startswith("│ ")]
    cells = {row[1].strip(): row[2:] for row in rows}
    gemm_clock, tensor_peak = 3, 4  # after SMs, FP32 and BF16 TFLOPS
    assert cells["T4"][gemm_clock].strip() == "59?"  # a 70 W T4: 59% of its boost clock (12FFN unconfirmed)
    assert cells["T4"][tensor_peak].strip() == "59?"  # no tensor clock known: the FP32 one
    assert cells["H100-SXM-96GB-HBM2e"][tensor_peak].strip() == "71?"  # 500 W: the 700 W H100's watts


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare-gpus", "mlp", "--batch", "0"], "argument --batch: must be a whole number >= 1, got '0'"),
        (["profile", "mlp", "--batch", "-2"], "argument --batch: must be a whole number >= 1, got '-2'"),
        (["simulate", "mlp", "--cluster", "T4", "--strategy", "dp=1", "--batch", "0"], "--batch"),
        (["profile", "x.json", "--seqlen", "0"], "argument --seqlen: must be a whole number >= 1"),
        (["show", "t.json", "--top", "zero"], "argument --top: must be a whole number >= 1, got 'zero'"),
        (["profile"], "the following arguments are required: MODEL"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == BAD_INPUT and message in err and err.count("\n") == 1


def test_bad_input_is_one_line_on_stderr_without_a_traceback() -> None:
    argv = ["simulate", "mlp", "--cluster", "2xT4", "--strategy", "dp=2,mb=3", "--batch", "4"]
    done = subprocess.run([sys.executable, "-m", "fxcost", *argv], capture_output=True, text=True)
    assert done.returncode == BAD_INPUT
    assert (
        done.stderr
        == "fxcost: error: batch 4 does not split into dp=2 x 3 micro-batches; accepted: a multiple of 6\n"
    )


def test_a_plan_out_of_memory_exits_3(tmp_path, monkeypatch, fresh_database, capsys) -> None:
    (tmp_path / "tiny.yaml").write_text("Tiny-T4:\n  base: T4\n  memory_gb: 0.001\n")
    monkeypatch.setenv("FXCOST_DEVICES", str(tmp_path / "tiny.yaml"))
    fresh_database._database.cache_clear()
    argv = ["simulate", "mlp", "--strategy", "dp=2", "--batch", "4", "--cluster"]
    assert main([*argv, "2xTiny-T4"]) == OUT_OF_MEMORY
    assert "ms per iteration" in capsys.readouterr().out  # the result is printed all the same
    assert main([*argv, "2xT4"]) == OK


def test_a_fault_inside_fxcost_keeps_its_traceback(monkeypatch) -> None:
    """Status 1 is Python's for an exception nothing catches: main does not turn a bug into bad input."""
    from fxcost.cli import step_commands

    def devices_command(args: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(step_commands, "devices_command", devices_command)
    with pytest.raises(ZeroDivisionError):
        main(["devices"])


def _listed_statuses(text: str, after: str) -> set[int]:
    """The status numbers listed in ``text`` after the line that starts with ``after``: the first
    number of each following line, until a blank line."""
    lines = text[text.index(after) :].splitlines()[1:]
    listed = set()
    for line in lines:
        number = re.match(r"^\W*(\d+)\b", line)
        if not line.strip() or (number is None and listed):
            break
        if number:
            listed.add(int(number.group(1)))
    return listed


def _returned_statuses() -> tuple[set[str], list[str]]:
    """The names of fxcost.cli.status the command's code returns or exits with, and any bare number
    it returns or exits with instead (file:line)."""
    names, literals = set(), []
    for path in sorted((REPO / "fxcost" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            values = []
            if isinstance(node, ast.Return) and node.value is not None:
                values = [node.value]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "self.exit", "exit"):
                values = node.args[:1]
            for value in values:
                for part in ast.walk(value):
                    if isinstance(part, ast.Constant) and type(part.value) is int:
                        literals.append(f"{path.name}:{node.lineno}")
                    elif isinstance(part, ast.Name) and isinstance(getattr(status, part.id, None), int):
                        names.add(part.id)
    return names, literals


def test_the_exit_statuses_in_help_and_readme_are_those_the_command_uses() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fxcost", "--help"], capture_output=True, text=True, check=True
    )
    listed = _listed_statuses(out.stdout, "exit status:")
    assert listed == set(status.EXIT_STATUSES) == {0, 1, 2, 3, 130}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert _listed_statuses(readme, "| status | meaning |") == listed
    names, literals = _returned_statuses()
    assert not literals, f"exit statuses as bare numbers (use fxcost.cli.status): {literals}"
    used = {getattr(status, name) for name in names}
    # Status 1 is Python's own, for an exception no handler catches; every other one is returned.
    assert used | {status.INTERNAL_ERROR} == listed
