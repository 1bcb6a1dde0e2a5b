"""``benchmarks/published_runs.py``: unit conversions, a tiny CSV end to end, a bad row in its place."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import pytest

from fxcost.gpus import get_device

HEADER = [
    "source", "url", "model", "params_b", "layers", "hidden", "heads", "ffn_hidden", "vocab", "seq", "gpu",
    "gpus", "tp", "pp", "vpp", "dp", "sp", "cp", "ep", "zero", "recompute", "micro_batch", "global_batch",
    "precision", "measured", "unit", "notes",
]  # fmt: skip


def _row(**values: Any) -> dict[str, str]:
    row = dict.fromkeys(HEADER, "")
    row.update(model="tiny", layers="4", hidden="64", heads="4", ffn_hidden="256", vocab="512", seq="32",
               gpu="A100-SXM4-80GB", gpus="4", tp="2", pp="2", dp="1", recompute="full", micro_batch="1",
               global_batch="4", precision="bf16", measured="1.0", unit="s_per_iter")  # fmt: skip
    row.update({k: str(v) for k, v in values.items()})
    return row


def test_units_are_converted_as_computed_by_hand(load_script: Any) -> None:
    script = load_script("benchmarks/published_runs.py")
    run = script.parse_run(_row(global_batch=8, gpus=4, unit="tflops_per_gpu"))
    h, s, n, v, b = 64, 32, 4, 512, 8  # the row's ffn is 4h, as Megatron's formula assumes
    # Megatron eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh) under full recomputation; without it the
    # layers' forward is counted three times, not four: 72 B s l h^2 (1 + s/6h + V/12lh).
    megatron = 96 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    model_flops = 72 * b * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))
    assert script.iteration_flops(run, hardware=True) == pytest.approx(megatron)
    assert script.iteration_flops(run, hardware=False) == pytest.approx(model_flops)
    # Llama 3 8B: queries and output 2 h^2, its 8 key/value heads' 2 h x 1024, SwiGLU 3 h f, each
    # product two FLOPs a parameter, three passes; the scores' 4 s h; the output layer's 6 h V.
    llama = script.parse_run(_row(params_b="8.0", layers=32, hidden=4096, heads=32, ffn_hidden=14336,
                                  vocab=128000, seq=8192, global_batch=2, unit="mfu_pct"))  # fmt: skip
    layer = 2 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 4 * 8192 * 4096
    by_hand = 2 * 8192 * (3 * 32 * layer + 6 * 4096 * 128000)
    assert script.iteration_flops(llama, hardware=False) == pytest.approx(by_hand)
    a100 = get_device("A100-SXM4-80GB")
    assert script.in_unit(run, 2.0, a100) == pytest.approx(megatron / 2.0 / 4 / 1e12)
    tokens = script.parse_run(_row(global_batch=8, gpus=4, unit="tokens_per_s_per_gpu"))
    assert script.in_unit(tokens, 2.0, a100) == pytest.approx(8 * 32 / 2.0 / 4)
    seconds = script.parse_run(_row(unit="s_per_iter"))
    assert script.in_unit(seconds, 2.5, a100) == 2.5
    mfu = script.parse_run(_row(global_batch=8, unit="mfu_pct", recompute="full"))
    assert a100.bf16_tflops is not None
    assert script.in_unit(mfu, 2.0, a100) == pytest.approx(
        model_flops / 2.0 / 4 / 1e12 / a100.bf16_tflops * 100
    )


def test_a_llama_is_chosen_when_the_parameters_say_so(load_script: Any) -> None:
    script = load_script("benchmarks/published_runs.py")
    # Llama 3's dimensions: 8.0B and 70B parameters fit three h x ffn matrices per layer, not two, and
    # 8 key/value heads (8.03B and 70.55B; with every head's, 8.83B and 80.0B).
    llama = _row(params_b="8.0", layers=32, hidden=4096, heads=32, ffn_hidden=14336, vocab=128000, seq=8192)
    assert script.parse_run(llama).gated and not script.parse_run(_row(params_b="0.00023")).gated
    run = script.parse_run(llama)
    config = script.config_of(run)
    assert (config["model_type"], config["intermediate_size"], config["num_key_value_heads"]) == (
        "llama",
        14336,
        8,
    )
    assert "assumed: 8 key/value heads (grouped-query, as the parameter count says)" in run.flags
    big = script.parse_run(
        _row(params_b="70.0", layers=80, hidden=8192, heads=64, ffn_hidden=28672, vocab=128000)
    )
    assert (big.model.gated, big.model.kv_heads) == (True, 8)
    # Llama 2 7B (6.74B, every head's keys and values) and 70B (68.98B, 8 key/value heads), stated rounded.
    seven = script.parse_run(
        _row(params_b="7", layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000)
    )
    assert (seven.model.gated, seven.model.kv_heads) == (True, 32)
    seventy = script.parse_run(
        _row(params_b="70", layers=80, hidden=8192, heads=64, ffn_hidden=28672, vocab=32000)
    )
    assert seventy.model.kv_heads == 8
    # A kv_heads column (not in the schema) is read where a CSV has one.
    stated = script.parse_run({**llama, "kv_heads": "4"})
    assert stated.model.kv_heads == 4 and not any("key/value" in f for f in stated.flags)
    full = script.parse_run({**_row(params_b="0.00023"), "kv_heads": "4"})  # every head's: GPT stays
    assert not full.model.gated and full.model.kv_heads is None
    with pytest.raises(script.RowError, match="kv_heads must divide heads 32, got 5"):
        script.parse_run({**llama, "kv_heads": "5"})
    gpt = script.parse_run(_row(params_b="0.00023"))
    assert script.config_of(gpt)["model_type"] == "gpt2" and not any("key/value" in f for f in gpt.flags)


def test_unsupported_settings_and_assumptions_are_flagged(load_script: Any) -> None:
    script = load_script("benchmarks/published_runs.py")
    run = script.parse_run(
        _row(vpp=2, sp=1, cp=2, gpus=8, global_batch=4, micro_batch="", recompute="selective")
    )
    flags = "; ".join(run.flags)
    assert "assumed: micro_batch" in flags and "recompute" not in flags
    # Selective recomputation is Megatron-LM's unless the row is torchtitan's, whose default is per-op.
    assert (run.dp, run.recompute, run.strategy.recompute) == (1, "selective", "selective")
    titan = script.parse_run(_row(recompute="selective", notes="torchtitan benchmark"))
    assert titan.strategy.recompute == "ops" and any("torchtitan" in r for r in titan.readings)
    with pytest.raises(script.RowError, match="recompute must be none, selective or full"):
        script.parse_run(_row(recompute="some"))
    # Context parallelism is simulated where the sequence splits into 2 cp chunks, folded into dp where not.
    assert "cp" not in flags and run.strategy.cp == 2
    odd = script.parse_run(_row(cp=2, gpus=8, seq=30))
    assert "unsupported: cp=2" in "; ".join(odd.flags) and (odd.dp, odd.strategy.cp) == (2, 1)
    # Interleaving is simulated where the 2 micro-batches split over pp=2, flagged and left out where not.
    assert "vpp" not in flags and run.strategy.vpp == 2
    one = script.parse_run(_row(vpp=2, global_batch=2, micro_batch=2))
    assert "unsupported: vpp=2 with pp=2, 1 micro-batches" in "; ".join(one.flags) and one.strategy.vpp == 1
    # Sequence parallelism is simulated (not flagged) with tensor parallelism, and moot without it.
    assert "unsupported: sp" not in flags and run.strategy.sp
    alone = script.parse_run(_row(sp=1, tp=1, gpus=2))
    assert not alone.strategy.sp and not any("unsupported: sp" in flag for flag in alone.flags)
    with pytest.raises(script.RowError, match="makes 4 GPUs, the row has 8"):
        script.parse_run(_row(gpus=8))
    with pytest.raises(script.RowError, match="unknown unit 'furlongs'"):
        script.parse_run(_row(unit="furlongs"))


@pytest.mark.slow
def test_a_tiny_csv_runs_end_to_end_and_a_bad_row_fails_in_its_place(
    load_script: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data_parallel = _row(model="tiny-dp", tp=1, pp=1, dp=4, zero=3, recompute="none", measured=1000,
                         unit="tokens_per_s_per_gpu")  # fmt: skip
    rows = [_row(), _row(gpu="Z9000-NOPE"), data_parallel]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=HEADER)
        writer.writeheader()
        writer.writerows(rows)
    script = load_script("benchmarks/published_runs.py")
    assert script.main(["--runs", str(path), "--cache", str(tmp_path / "cache")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    bad = next(line for line in lines if "Z9000-NOPE" in line)
    assert "ERROR: unknown device 'Z9000-NOPE'" in bad
    assert sum("tiny" in line and "%" in line for line in lines) == 2
    last = lines[-1]
    assert last.startswith("mape_published=") and last.endswith("rows=2 rows_flagged=0 rows_failed=1")
    # Each row's interval in its unit holds the prediction; the coverage counts the rows inside it.
    fields = dict(item.split("=") for item in last.split())
    inside = matched = 0
    for line in lines:
        found = re.search(r" ([\d.e+]+) +([\d.e+]+) +([\d.e+]+)-([\d.e+]+)( !)? +[+-][\d.]+%", line)
        if "tiny" in line and found:
            measured, predicted, low, high = (float(found.group(i)) for i in range(1, 5))
            assert low <= predicted <= high
            assert (found.group(5) is None) == (low <= measured <= high)
            inside += low <= measured <= high
            matched += 1
    assert matched == 2 and float(fields["coverage80_published"]) == inside / 2
    # Resumed from the cache: the same figures.
    assert script.main(["--runs", str(path), "--cache", str(tmp_path / "cache")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == last
    # Other code (another simulator, other weights) simulates the rows again, not read back.
    cached = len(list((tmp_path / "cache").glob("*.json")))
    monkeypatch.setattr(script, "code_state", lambda: "other code")
    assert script.main(["--runs", str(path), "--cache", str(tmp_path / "cache")]) == 0
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2 * cached == 4


def test_a_row_with_expert_parallelism_is_simulated_as_a_mixture_of_experts(load_script: Any) -> None:
    script = load_script("benchmarks/published_runs.py")
    # Mixtral 8x7B's dimensions and 46.7B parameters: eight SwiGLU experts of the MLP's width and 8
    # key/value heads fit the count; top-2 routing assumed where the notes do not say.
    mixtral = dict(model="Mixtral-8x7B", params_b="46.7", layers=32, hidden=4096, heads=32, ffn_hidden=14336,
                   vocab=32000, seq=4096, gpu="H100-SXM", gpus=64, tp=1, pp=1, dp=64, ep=8, global_batch=512,
                   recompute="none", unit="tokens_per_s_per_gpu")  # fmt: skip
    run = script.parse_run(_row(**mixtral))
    assert (run.model.experts, run.model.top_k, run.model.kv_heads, run.strategy.ep) == (8, 2, 8, 8)
    assert "assumed: 8 experts of the MLP's width (as the parameter count says)" in run.flags
    assert "assumed: top-2 routing" in run.flags
    # Megatron's count takes the experts a token runs: two SwiGLU MLPs and the router's 8 columns.
    h, f, s, v, layers = 4096, 14336, 4096, 32000, 32
    layer = 2 * (2 * h * h + 2 * h * 1024 + 2 * 3 * h * f + 8 * h) + 4 * s * h
    assert script.iteration_flops(run, hardware=False) == pytest.approx(
        512 * s * (3 * layers * layer + 6 * h * v)
    )
    # Stated in the notes: read, not assumed; with tp, expert tensor parallelism and its sp.
    stated = script.parse_run(_row(**{**mixtral, "tp": 2, "dp": 32, "notes": "16 experts, top-1 gating"}))
    assert (stated.model.experts, stated.model.top_k, stated.strategy.sp) == (16, 1, True)
    assert "16 experts of the MLP's width (as the report states)" in stated.readings
    from fxcost.sim.runs import mixture_of

    assert mixture_of("2 experts per token of 64 routed experts") == (64, 2)  # a token's count is no expert's
    # Experts named in the notes of a row whose parameters fit the dense model leave it dense, unflagged.
    gpt = script.parse_run(_row(params_b="0.00023", notes="unlike the 64 experts MoE of its section 5"))
    assert gpt.model.experts == 1 and not gpt.model.gated and not gpt.flags
    # An ep the count cannot fit is simulated, flagged with how far off; an ep that does not divide dp
    # runs at the largest degree that does.
    far = script.parse_run(_row(**{**mixtral, "ep": 16}))
    assert far.model.experts == 16 and "assumed: 16 experts of the MLP's width (+97% off" in "; ".join(
        far.flags
    )
    uneven = script.parse_run(_row(**{**mixtral, "gpus": 48, "dp": 48, "global_batch": 480}))
    assert uneven.strategy.ep == 8
    odd = script.parse_run(_row(**{**mixtral, "gpus": 12, "dp": 12, "global_batch": 12}))
    assert (
        odd.strategy.ep == 4
        and "unsupported: ep=8 with dp=12 and 8 experts (simulated with ep=4)" in odd.flags
    )
    with pytest.raises(script.RowError, match="'params_b' must be a finite number"):
        script.parse_run(_row(**{**mixtral, "params_b": "inf"}))
    # Without a parameter count or stated experts, ep is flagged and the dense model simulated.
    dense = script.parse_run(_row(tp=1, pp=1, dp=4, ep=2))
    assert dense.model.experts == 1 and any("unsupported: ep=2" in f for f in dense.flags)
    # A tiny mixture simulates: its experts split over ep, a dispatch and a combine all-to-all.
    # 525,312 parameters: four experts of 3 x 64 x 128 in each of 4 layers, with their attention, router
    # and the 512-token vocabulary's embedding and output layer.
    tiny = script.parse_run(
        _row(params_b="0.000525", tp=1, pp=1, dp=4, ep=2, ffn_hidden=128, recompute="none")
    )
    assert (tiny.model.experts, tiny.strategy.ep) == (4, 2)
    _, cluster, _ = script.cluster_of(tiny)
    saved = script.simulated(tiny, cluster, None)
    assert saved["iteration_s"] > 0 and not saved["oom"]
