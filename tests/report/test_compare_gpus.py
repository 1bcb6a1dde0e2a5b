"""GPU selection by throughput and samples per dollar (fxcost.report.gpu_choice, ``fxcost compare-gpus``)."""

from __future__ import annotations

import dataclasses
import io

import pytest

import fxcost
from fxcost import zoo
from fxcost.cli import main
from fxcost.gpus import device_names, get_device
from fxcost.report import Report
from fxcost.report.gpu_choice import compare_gpus, load_prices, plot, priced_devices, print_choices

DEVICES = ["T4", "L4", "H100-SXM", "P100-PCIE-16GB"]  # P100 has no price in the database


@pytest.fixture(scope="module")
def mlp_report() -> Report:
    model, inputs = zoo.build("mlp", batch=4)
    return fxcost.profile(model, inputs, devices=DEVICES, measure=False)


def test_throughput_and_cost_follow_from_the_eager_step(mlp_report) -> None:
    choices = compare_gpus(mlp_report, DEVICES)
    assert {c.device for c in choices} == set(DEVICES)
    for c in choices:
        assert c.step_ms == pytest.approx(mlp_report.eager_ms(c.device))
        assert c.samples_per_s == pytest.approx(4 / c.step_ms * 1000)
        price = get_device(c.device).price_usd_per_hr
        assert c.usd_per_hr == price
        if price is not None:
            assert c.samples_per_usd == pytest.approx(c.samples_per_s * 3600 / price)


def test_best_value_first_and_unpriced_last(mlp_report) -> None:
    choices = compare_gpus(mlp_report, DEVICES)
    per_usd = [c.samples_per_usd for c in choices[:-1]]
    assert None not in per_usd and per_usd == sorted(per_usd, reverse=True)  # type: ignore[type-var]
    last = choices[-1]
    assert last.device == "P100-PCIE-16GB" and last.usd_per_hr is None and last.samples_per_usd is None


def test_prices_override_the_database_and_change_the_ranking(mlp_report) -> None:
    before = compare_gpus(mlp_report, DEVICES)
    worst = before[-2].device  # the priced GPU with the fewest samples per dollar
    after = compare_gpus(mlp_report, DEVICES, prices={worst: 0.01, "Tesla P100-PCIE-16GB": 0.5})
    assert after[0].device == worst and after[0].usd_per_hr == 0.01
    p100 = next(c for c in after if c.device == "P100-PCIE-16GB")  # named by an alias
    assert p100.samples_per_usd == pytest.approx(p100.samples_per_s * 3600 / 0.5)


def test_default_devices_are_those_with_a_price() -> None:
    expected = [d for d in device_names() if get_device(d).price_usd_per_hr is not None]
    assert priced_devices() == expected and "P100-PCIE-16GB" not in expected
    assert "P100-PCIE-16GB" in priced_devices({"P100": 1.2})


def test_devices_not_in_the_report_are_predicted(mlp_report) -> None:
    choices = compare_gpus(mlp_report, ["A10"])
    assert [c.device for c in choices] == ["A10"] and choices[0].step_ms > 0
    assert "A10" not in mlp_report.devices  # the report itself is left alone


def test_a_report_without_batch_size_is_refused(mlp_report) -> None:
    with pytest.raises(ValueError, match="no batch size"):
        compare_gpus(dataclasses.replace(mlp_report, batch=None), DEVICES)


def test_load_prices_resolves_aliases(tmp_path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("Tesla T4: 0.35\nH100-SXM: 2\n")
    assert load_prices(path) == {"T4": 0.35, "H100-SXM": 2.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("H1OO: 2.0\n", r"unknown device 'H1OO'; accepted: .*H100-SXM"),
        ("T4: cheap\n", "T4: the price must be a positive number"),
        ("T4: 0\n", "T4: the price must be a positive number"),
        ("- T4\n", "expected a mapping"),
        ("T4: [\n", "not valid YAML"),
    ],
)
def test_bad_price_files_are_refused(tmp_path, text, message) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_prices(path)


def test_print_shows_prices_and_missing_ones(mlp_report) -> None:
    out = io.StringIO()
    print_choices(compare_gpus(mlp_report, DEVICES), file=out)
    text = out.getvalue()
    p100_row = next(line for line in text.splitlines() if "P100-PCIE-16GB" in line)
    assert p100_row.split()[-2:] == ["-", "-"]
    assert "fastest: H100-SXM" in text


def test_gpus_known_from_spec_sheets_alone_are_marked_and_explained(mlp_report) -> None:
    """The issue's case: an MI300X topping the table on its spec sheet's word, with nothing said."""
    choices = {c.device: c for c in compare_gpus(mlp_report, ["T4", "H100-SXM", "MI300X"])}
    assert not choices["T4"].spec_sheet_only  # a GPU the heads were fit on
    assert choices["H100-SXM"].spec_sheet_only and choices["MI300X"].spec_sheet_only
    out = io.StringIO()
    print_choices(list(choices.values()), file=out)
    text = out.getvalue()
    assert "H100-SXM*" in text and "MI300X*" in text and "T4*" not in text
    assert "* spec sheets alone: no measurement of H100-SXM went into the heads" in text
    assert "* caveat: MI300X is unlike every GPU the heads were fit on" in text
    fastest = max(choices.values(), key=lambda c: c.samples_per_s)
    assert f"fastest: {fastest.device}{'*' if fastest.spec_sheet_only else ''};" in text


def test_a_gpu_origin_makes_nvidia_gpus_runtime_based_not_spec_sheet_only() -> None:
    from fxcost.data.datasets import kernel_alike_node

    node = kernel_alike_node("add", 8192, 1024)
    node.origin_ms = 0.2
    report = Report(nodes=[node], origin="Tesla V100-PCIE-32GB", devices=[], batch=8)
    choices = {c.device: c for c in compare_gpus(report, ["H100-SXM", "MI300X"])}
    assert not choices["H100-SXM"].spec_sheet_only  # scaled from what the V100 measured
    assert choices["MI300X"].spec_sheet_only  # no AMD GPU informs the scaling


def test_the_throughput_chart_is_sorted_by_throughput(mlp_report) -> None:
    from fxcost.report.gpu_choice import _chart_orders

    choices = compare_gpus(mlp_report, DEVICES)  # by samples per dollar
    fastest, priced = _chart_orders(choices)
    assert [c.samples_per_s for c in fastest] == sorted((c.samples_per_s for c in choices), reverse=True)
    assert [c.device for c in fastest] != [c.device for c in choices]  # the order differs from the table's
    assert [c.device for c in priced] == [c.device for c in choices if c.samples_per_usd is not None]


def test_plot_writes_a_png(mlp_report, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = plot(compare_gpus(mlp_report, DEVICES), tmp_path / "gpus.png", title="mlp")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_ranks_gpus_with_a_price_file_and_plots(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    prices = tmp_path / "prices.yaml"
    prices.write_text("L4: 0.01\n")
    png = tmp_path / "out.png"
    argv = ["compare-gpus", "mlp", "--batch", "2", "--devices", *DEVICES, "--prices", str(prices)]
    assert main([*argv, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    ranked = [line.split()[1].rstrip("*") for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(ranked) == 4 and ranked[0] == "L4" and ranked[-1] == "P100-PCIE-16GB"
    assert "most samples per dollar: L4*" in out  # no L4 measurement went into the heads
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_reads_a_saved_trace(mlp_report, tmp_path, capsys) -> None:
    trace = mlp_report.save(tmp_path / "mlp.json")
    assert main(["compare-gpus", str(trace), "--devices", "T4", "A10"]) == 0
    out = capsys.readouterr().out
    assert "batch 4" in out and "A10" in out
    assert main(["compare-gpus", str(trace), "--batch", "8"]) == 2
    assert "captured at batch 4, not 8" in capsys.readouterr().err


def test_cli_bad_price_file_names_the_device(tmp_path, capsys) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("NoSuchGPU: 1.0\n")
    assert main(["compare-gpus", "mlp", "--batch", "2", "--prices", str(prices)]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'NoSuchGPU'" in err and "H100-SXM" in err


def test_cli_reads_a_compressed_trace(mlp_report, tmp_path, capsys) -> None:
    trace = mlp_report.save(tmp_path / "mlp.json.gz")
    assert main(["compare-gpus", str(trace), "--devices", "T4", "L4"]) == 0
    out = capsys.readouterr().out
    assert "batch 4" in out and "trace captured on" in out


def test_cli_captures_a_hugging_face_config_on_meta_tensors(tiny_gpt2_config, capsys) -> None:
    path = tiny_gpt2_config
    argv = ["compare-gpus", str(path), "--batch", "2", "--seqlen", "16", "--devices", "T4", "L4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(batch 2, 16 tokens), training step on meta tensors" in out and "L4" in out
    assert main([*argv, "--measure"]) == 2
    assert "--measure needs a model" in capsys.readouterr().err


def test_the_step_is_the_reports_execution_mode(mlp_report, tmp_path, capsys) -> None:
    compiled = dataclasses.replace(mlp_report, execution="compiled")
    for c in compare_gpus(compiled, ["T4", "H100-SXM"]):
        assert c.step_ms == pytest.approx(mlp_report.compiled_ms(c.device))
        assert c.step_ms != pytest.approx(mlp_report.eager_ms(c.device))
    trace = mlp_report.save(tmp_path / "mlp.json")
    steps = {}
    for execution in ("eager", "compiled"):
        assert main(["compare-gpus", str(trace), "--devices", "T4", "--execution", execution]) == 0
        steps[execution] = capsys.readouterr().out
    assert steps["eager"] != steps["compiled"]
    with pytest.raises(SystemExit):
        main(["compare-gpus", str(trace), "--execution", "jit"])
    assert "invalid choice: 'jit'" in capsys.readouterr().err
