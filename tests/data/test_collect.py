"""fxcost.data.collect on the CPU: meta tensors and a fake timer that is a deterministic function of the
configuration, so nothing is really measured."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fxcost.cli.parser import parser
from fxcost.data import collect as collect_mod
from fxcost.data.collect import OPS, PROFILE_CHUNK, collect, header, kernel_columns, sample_config
from fxcost.records import KernelRecord

REPO = Path(__file__).resolve().parents[2]

# Source shared with the killed subprocess: the latency depends only on the op and its arguments.
FAKE_TIMER = """
import time, zlib, torch

def fake_timer(fn, device, delay=0.0):
    time.sleep(delay)
    parts = [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in (*fn.args, *fn.keywords.values())]
    return 0.001 + zlib.crc32(repr((fn.func.__name__, parts)).encode()) % 10**6 / 1e3
"""
_ns: dict = {}
exec(FAKE_TIMER, _ns)
fake_timer = _ns["fake_timer"]

SHARED_OPS = ["linear", "bmm", "conv", "add", "addu", "relu", "ln", "softmax"]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_header_matches_shared_data(data_dir: Path, tmp_path: Path) -> None:
    stats = collect(SHARED_OPS, 3, tmp_path, device="meta", timer=fake_timer, progress=False)
    for op in SHARED_OPS:
        shared = sorted((data_dir / "neusight" / "ops" / op).glob("*.csv"))[0]
        with shared.open(newline="") as f:
            expected = next(csv.reader(f))
        assert header(op) == expected
        with stats.paths[op].open(newline="") as f:
            assert next(csv.reader(f)) == expected
        assert stats.paths[op] == tmp_path / "ops" / op / "meta.csv"


def test_rows_parse_back(tmp_path: Path) -> None:
    stats = collect(["conv", "elementwise"], 5, tmp_path, device="meta", timer=fake_timer, progress=False)
    assert set(stats.paths) == {"conv"} | {op for op in OPS if OPS[op][0] == "vec"} - {"ln", "softmax"}
    for op, path in stats.paths.items():
        rows = _rows(path)
        assert len(rows) == 5 == stats.written[op]
        for i, row in enumerate(rows):
            assert row["OPName"] == op and row["Device"] == "meta"
            assert row["Torch Version"].startswith("p") and row["Kernel Name"] == "" and row["Grid x"] == ""
            cfg = sample_config(op, i)
            assert {d: int(row[d]) for d in cfg} == cfg
            assert float(row["Latency"]) > 0
    conv = sample_config("conv", 0)
    assert conv["Kernel_Szie"] <= conv["Input_Size"] + 2 * conv["Padding"]
    # The elementwise ops share one sequence of shapes, as in the shared data.
    assert sample_config("add", 3) == sample_config("softmax", 3) != sample_config("add", 4)


def test_resume_gives_the_same_file(tmp_path: Path) -> None:
    full = collect(["bmm", "ln"], 12, tmp_path / "a", device="meta", timer=fake_timer, progress=False)
    collect(["bmm", "ln"], 5, tmp_path / "b", device="meta", timer=fake_timer, progress=False)
    again = collect(["bmm", "ln"], 12, tmp_path / "b", device="meta", timer=fake_timer, progress=False)
    assert again.existing == {"bmm": 5, "ln": 5} and again.written == {"bmm": 7, "ln": 7}
    for op in ("bmm", "ln"):
        assert again.paths[op].read_bytes() == full.paths[op].read_bytes()
    done = collect(["bmm"], 12, tmp_path / "b", device="meta", timer=fake_timer, progress=False)
    assert done.written == {"bmm": 0} and done.existing == {"bmm": 12}
    fresh = collect(["bmm"], 2, tmp_path / "b", device="meta", resume=False, timer=fake_timer, progress=False)
    assert len(_rows(fresh.paths["bmm"])) == 2


def test_torn_last_line_is_dropped(tmp_path: Path) -> None:
    full = collect(["linear"], 6, tmp_path / "a", device="meta", timer=fake_timer, progress=False)
    path = tmp_path / "b" / "ops" / "linear" / "meta.csv"
    path.parent.mkdir(parents=True)
    whole = full.paths["linear"].read_bytes()
    path.write_bytes(whole[: whole.rfind(b"\n", 0, -1) + 8])  # five rows and a torn sixth
    stats = collect(["linear"], 6, tmp_path / "b", device="meta", timer=fake_timer, progress=False)
    assert stats.repaired == ["linear"] and stats.existing == {"linear": 5}
    assert path.read_bytes() == whole


def test_foreign_file_is_refused(tmp_path: Path) -> None:
    collect(["bmm"], 3, tmp_path, device="meta", seed=1, timer=fake_timer, progress=False)
    with pytest.raises(ValueError, match="not in the sequence"):
        collect(["bmm"], 3, tmp_path, device="meta", seed=2, timer=fake_timer, progress=False)


def test_killed_run_resumes_to_the_same_file(tmp_path: Path) -> None:
    code = FAKE_TIMER + (
        "from fxcost.data.collect import collect\n"
        f"collect(['bmm'], 40, {str(tmp_path / 'b')!r}, device='meta', progress=False,\n"
        "        timer=lambda fn, d: fake_timer(fn, d, delay=0.05))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    path = tmp_path / "b" / "ops" / "bmm" / "meta.csv"
    deadline = time.monotonic() + 60
    try:
        while not (path.exists() and path.read_bytes().count(b"\n") >= 6):
            assert proc.poll() is None and time.monotonic() < deadline, "child ended or stalled"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    kept = path.read_bytes()
    assert 5 <= kept.count(b"\n") < 41
    stats = collect(["bmm"], 40, tmp_path / "b", device="meta", timer=fake_timer, progress=False)
    full = collect(["bmm"], 40, tmp_path / "a", device="meta", timer=fake_timer, progress=False)
    result = path.read_bytes()
    assert result == full.paths["bmm"].read_bytes()
    assert result.startswith(kept[: kept.rfind(b"\n") + 1])  # no completed row lost or rewritten
    assert stats.existing["bmm"] + stats.written["bmm"] == 40


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB"),
        MemoryError(),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried... out of memory"),
    ],
)
def test_out_of_memory_is_skipped_and_counted(tmp_path: Path, error: BaseException) -> None:
    oom = {i for i in range(20) if sample_config("bmm", i)["B"] > 64}
    assert 0 < len(oom) < 20

    def timer(fn, device):  # type: ignore[no-untyped-def]
        if fn.args[0].shape[0] > 64:
            raise error
        return fake_timer(fn, device)

    stats = collect(["bmm"], 20, tmp_path / "a", device="meta", timer=timer, progress=False)
    assert stats.skipped_oom == {"bmm": len(oom)} and stats.written == {"bmm": 20 - len(oom)}
    rows = _rows(stats.paths["bmm"])
    assert [int(r["B"]) for r in rows] == [sample_config("bmm", i)["B"] for i in range(20) if i not in oom]
    # Resume recognises the skipped configurations between the rows and goes on after the last row.
    collect(["bmm"], 10, tmp_path / "b", device="meta", timer=timer, progress=False)
    again = collect(["bmm"], 20, tmp_path / "b", device="meta", timer=timer, progress=False)
    assert again.paths["bmm"].read_bytes() == stats.paths["bmm"].read_bytes()
    last_row = max(i for i in range(10) if i not in oom)
    assert again.skipped_oom["bmm"] == len({i for i in oom if i > last_row})


def test_other_errors_propagate(tmp_path: Path) -> None:
    def timer(fn, device):  # type: ignore[no-untyped-def]
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="measuring bmm"):
        collect(["bmm"], 2, tmp_path, device="meta", timer=timer, progress=False)


def test_rows_read_by_read_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pandas")
    from fxcost.data.datasets import read_ops

    # read_ops maps Device through the GPU database, which has no "meta": label the rows as a T4.
    monkeypatch.setattr(collect_mod, "device_label", lambda device: "Tesla T4")
    ops = ["linear", "bmm", "conv", "add", "ln", "softmax"]
    collect(ops, 4, tmp_path, device="meta", timer=fake_timer, progress=False)
    assert (tmp_path / "ops" / "add" / "Tesla_T4.csv").exists()
    frame = read_ops(tmp_path, ops)
    assert len(frame) == 24 and set(frame["OPName"]) == set(ops)
    assert set(frame["device"]) == {"T4"}
    vec = frame[frame["OPName"] == "add"]
    assert (vec["bytes"] == vec["B"] * vec["H"] * 4 * 3).all()


def test_training_takes_new_measurements_beside_the_shared_data(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fxcost train --data SHARED --data NEW``: a collected directory holds some ops and no
    held-out files, and its rows join the training rows."""
    pytest.importorskip("pandas")
    from fxcost.train.heads import split

    monkeypatch.setattr(collect_mod, "device_label", lambda device: "Tesla T4")
    collect(["ln"], 5, tmp_path, device="meta", timer=fake_timer, progress=False)
    shared, _ = split([data_dir], "ln")
    both, test = split([data_dir, tmp_path], "ln")
    assert len(both) == len(shared) + 5 and len(test) > 0


def test_progress_bar_runs(tmp_path: Path) -> None:
    stats = collect(["relu"], 3, tmp_path, device="meta", timer=fake_timer, progress=True)
    assert stats.written == {"relu": 3}


def test_cli_parser_and_no_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli = parser()
    args = cli.parse_args(["collect", "--ops", "bmm,elementwise", "--samples", "3", "--out", str(tmp_path)])
    assert args.device == "cuda" and args.resume and args.seed == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        args.run(args)
    with pytest.raises(ValueError, match="unknown op"):
        collect(["lstm"], 1, tmp_path, device="meta", timer=fake_timer, progress=False)
    args = cli.parse_args(["collect", "--ops", "relu", "--samples", "2", "--out", str(tmp_path),
                              "--device", "cpu", "--no-resume", "--seed", "3"])  # fmt: skip

    def on_meta(*args, **kwargs):  # type: ignore[no-untyped-def]
        return collect(*args, **{**kwargs, "device": "meta", "timer": fake_timer, "progress": False})

    monkeypatch.setattr(collect_mod, "collect", on_meta)
    assert args.run(args) == 0
    assert len(_rows(tmp_path / "ops" / "relu" / "meta.csv")) == 2


def test_kernel_columns_follow_the_shared_data(data_dir: Path) -> None:
    """Blocks and warps per SM from the main kernel's grid and block, as the shared rows have them."""
    import pandas as pd

    from fxcost.gpus import get_device

    checked = 0
    for op in ("add", "ln", "bmm", "conv"):
        for path in sorted((data_dir / "neusight" / "ops" / op).glob("*.csv")):
            frame = pd.read_csv(path).head(50)
            sms = get_device(frame["Device"].iloc[0]).num_sms
            for row in frame.to_dict("records"):
                grid = (int(row["Grid x"]), int(row["Grid y"]), int(row["Grid z"]))
                block = (int(row["Block x"]), int(row["Block y"]), int(row["Block z"]))
                other = KernelRecord("other", 0.0001, (1, 1, 1), (32, 1, 1))
                got = kernel_columns([other, KernelRecord(row["Kernel Name"], 0.01, grid, block)], sms)
                assert got["Kernel Name"] == row["Kernel Name"]
                assert float(got["Blocks per SM"]) == pytest.approx(row["Blocks per SM"], rel=1e-3, abs=0.01)
                assert float(got["Warps per SM"]) == pytest.approx(row["Warps per SM"], rel=1e-3, abs=0.01)
                assert got["Grid x"] == str(grid[0]) and got["Block y"] == str(block[1])
                assert got["Kernels"] == f";other;{row['Kernel Name']}"
                checked += 1
    assert checked > 500
    assert kernel_columns([], 40) == {}


def _fake_profiler(builders, device):  # type: ignore[no-untyped-def]
    launched = [
        KernelRecord("setup", 0.001, (1, 1, 1), (128, 1, 1)),
        KernelRecord("main", 0.05, (60, 1, 1), (32, 4, 1)),
    ]
    return [launched for _ in builders]


def test_collect_writes_kernel_columns(tmp_path: Path) -> None:
    fake = {"device": "meta", "timer": fake_timer, "profiler": _fake_profiler, "progress": False}
    stats = collect(["ln", "relu"], 3, tmp_path / "a", sms=40, **fake)
    for op in ("ln", "relu"):
        for row in _rows(stats.paths[op]):
            assert row["Kernel Name"] == "main"
            assert (row["Blocks per SM"], row["Warps per SM"]) == ("1.5", "6")
            assert (row["Grid x"], row["Block x"], row["Block y"], row["Block z"]) == ("60", "32", "4", "1")
    assert _rows(stats.paths["ln"])[0]["Kernels"] == ";setup;main"  # only ln's schema has the column
    assert "Kernels" not in _rows(stats.paths["relu"])[0]
    plain = collect(["ln"], 3, tmp_path / "b", kernels=False, **fake)
    assert all(row["Kernel Name"] == "" for row in _rows(plain.paths["ln"]))
    with pytest.raises(ValueError, match="sms= is needed"):
        collect(
            ["ln"],
            1,
            tmp_path / "c",
            device="meta",
            timer=fake_timer,
            profiler=_fake_profiler,
            progress=False,
        )


def test_kernels_are_profiled_a_chunk_per_session_and_match_their_rows(tmp_path: Path) -> None:
    sessions: list[int] = []

    def profiler(builders, device):  # type: ignore[no-untyped-def]
        sessions.append(len(builders))
        # each configuration's "kernel" is named after its first input's shape: rows must get their own
        return [[KernelRecord(str(tuple(b().args[0].shape)), 0.01, (1, 1, 1), (32, 1, 1))] for b in builders]

    samples = PROFILE_CHUNK + 5
    stats = collect(["relu"], samples, tmp_path, device="meta", timer=fake_timer, profiler=profiler,
                    sms=1, progress=False)  # fmt: skip
    assert sessions == [PROFILE_CHUNK, 5]
    rows = _rows(stats.paths["relu"])
    assert len(rows) == samples
    assert all(row["Kernel Name"] == str((int(row["B"]), int(row["H"]))) for row in rows)


def test_precision_column_and_its_own_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp32 = collect(["bmm"], 3, tmp_path, device="meta", timer=fake_timer, progress=False)
    bf16 = collect(["bmm"], 3, tmp_path, device="meta", timer=fake_timer, progress=False, precision="bf16")
    assert fp32.paths["bmm"] == tmp_path / "ops" / "bmm" / "meta.csv"
    assert bf16.paths["bmm"] == tmp_path / "bf16" / "ops" / "bmm" / "meta.csv"
    with fp32.paths["bmm"].open(newline="") as f:
        assert next(csv.reader(f)) == header("bmm") and "Precision" not in header("bmm")
    with bf16.paths["bmm"].open(newline="") as f:
        assert next(csv.reader(f)) == [*header("bmm"), "Precision"] == header("bmm", "bf16")
    assert [row["Precision"] for row in _rows(bf16.paths["bmm"])] == ["bf16"] * 3
    # Same configurations whatever the precision, so the files compare row by row.
    dims = [[row[d] for d in ("B", "M", "N", "K")] for row in _rows(fp32.paths["bmm"])]
    assert dims == [[row[d] for d in ("B", "M", "N", "K")] for row in _rows(bf16.paths["bmm"])]
    # read_ops of the directory gives the fp32 rows alone; the precision's directory its own rows.
    pytest.importorskip("pandas")
    from fxcost.data.datasets import read_ops

    monkeypatch.setattr(collect_mod, "device_label", lambda device: "Tesla T4")
    collect(["bmm"], 3, tmp_path / "t4", device="meta", timer=fake_timer, progress=False)
    collect(["bmm"], 2, tmp_path / "t4", device="meta", timer=fake_timer, progress=False, precision="bf16")
    assert len(read_ops(tmp_path / "t4", ["bmm"])) == 3
    assert "Precision" not in read_ops(tmp_path / "t4", ["bmm"])
    assert list(read_ops(tmp_path / "t4" / "bf16", ["bmm"])["Precision"]) == ["bf16"] * 2


@pytest.mark.parametrize(
    ("precision", "dtype", "tf32"),
    [("fp32", torch.float32, False), ("tf32", torch.float32, True), ("bf16", torch.bfloat16, False),
     ("fp16", torch.float16, False)],
)  # fmt: skip
def test_tensors_are_built_in_the_precision(
    tmp_path: Path, precision: str, dtype: torch.dtype, tf32: bool
) -> None:
    seen: list[tuple[torch.dtype, bool, bool]] = []

    def timer(fn, device):  # type: ignore[no-untyped-def]
        seen.append(
            (fn.args[0].dtype, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        )
        return fake_timer(fn, device)

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    collect(["linear", "sdpa"], 2, tmp_path, device="meta", timer=timer, progress=False, precision=precision)
    assert seen == [(dtype, tf32, tf32)] * 4
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_bad_precision_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown precision 'int8'.*fp32, tf32, fp16, bf16"):
        collect(["bmm"], 1, tmp_path, device="meta", timer=fake_timer, progress=False, precision="int8")
    with pytest.raises(SystemExit):
        parser().parse_args(["collect", "--ops", "bmm", "--samples", "1", "--out", "x", "--precision", "fp8"])


def test_sdpa_configs_are_valid_and_deterministic() -> None:
    configs = [sample_config("sdpa", i, seed=5) for i in range(300)]
    assert configs == [sample_config("sdpa", i, seed=5) for i in range(300)]
    assert sample_config("sdpa_bwd", 7, seed=5) == configs[7] != sample_config("sdpa", 7, seed=6)
    for cfg in configs:
        assert list(cfg) == ["B", "H", "S_q", "S_k", "D", "causal"]
        assert cfg["causal"] in (0, 1) and (not cfg["causal"] or cfg["S_q"] == cfg["S_k"])
        assert cfg["D"] in (64, 80, 96, 128) and 1 <= cfg["H"] <= 64 and 1 <= cfg["B"] <= 64
        assert 128 <= cfg["S_q"] <= 8192 and 128 <= cfg["S_k"] <= 8192
        assert cfg["B"] * cfg["H"] * (cfg["S_q"] + 2 * cfg["S_k"]) * cfg["D"] * 4 <= 4 * 2**30
    # Both kinds occur: causal and not, cross-attention lengths, non-powers of two, a batch at the cap.
    assert {c["causal"] for c in configs} == {0, 1} and any(c["S_q"] != c["S_k"] for c in configs)
    assert any(c["S_q"] & (c["S_q"] - 1) for c in configs)
    assert any(c["B"] * c["H"] * (c["S_q"] + 2 * c["S_k"]) * c["D"] * 4 > 2**30 for c in configs)


def _tiny_sdpa(op: str, index: int, seed: int = 0) -> dict[str, int]:
    """The real configuration shrunk to a few KB, keeping causal and whether S_q == S_k."""
    cfg = sample_config(op, index, seed)
    if OPS[op][0] != "sdpa":
        return cfg
    s_k = 8 if cfg["S_k"] == cfg["S_q"] else 5
    return {**cfg, "B": 1 + cfg["B"] % 2, "H": 1 + cfg["H"] % 3, "S_q": 8, "S_k": s_k, "D": cfg["D"] // 16}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sdpa_forward_and_backward_on_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """Really run on the CPU (tiny shapes): the backward call is autograd.grad of a forward already
    run, which gives gradients of q, k and v and can be called again."""
    from fxcost.data.op_configs import build_call

    monkeypatch.setattr(collect_mod, "sample_config", _tiny_sdpa)
    calls: list[str] = []

    def timer(fn, device):  # type: ignore[no-untyped-def]
        out = fn()
        calls.append(fn.func.__name__)
        if fn.func is torch.autograd.grad:
            assert [g.shape for g in out] == [t.shape for t in fn.args[1]] and fn() is not None
        return fake_timer(fn, device)

    stats = collect(["sdpa", "sdpa_bwd"], 4, tmp_path, device="cpu", timer=timer, progress=False,
                    precision=precision)  # fmt: skip
    assert calls == ["scaled_dot_product_attention"] * 4 + ["grad"] * 4
    for op in ("sdpa", "sdpa_bwd"):
        rows = _rows(stats.paths[op])
        assert [{d: int(r[d]) for d in OPS[op][1]} for r in rows] == [_tiny_sdpa(op, i) for i in range(4)]
    bwd = build_call("sdpa_bwd", _tiny_sdpa("sdpa", 0), torch.device("cpu"), torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 and t.requires_grad for t in bwd.args[1])


def test_resume_per_precision_file(tmp_path: Path) -> None:
    kw = {"device": "meta", "timer": fake_timer, "progress": False}
    full = collect(["sdpa"], 9, tmp_path / "a", precision="bf16", **kw)
    collect(["sdpa"], 4, tmp_path / "b", precision="bf16", **kw)
    collect(["sdpa"], 6, tmp_path / "b", precision="tf32", **kw)
    again = collect(["sdpa"], 9, tmp_path / "b", precision="bf16", **kw)
    assert again.existing == {"sdpa": 4} and again.written == {"sdpa": 5}
    assert again.paths["sdpa"].read_bytes() == full.paths["sdpa"].read_bytes()
    assert len(_rows(tmp_path / "b" / "tf32" / "ops" / "sdpa" / "meta.csv")) == 6
    # An fp32 file (no Precision column) where bf16 rows go is refused, not continued.
    fp32 = collect(["sdpa"], 2, tmp_path / "c", **kw)
    path = tmp_path / "c" / "bf16" / "ops" / "sdpa" / "meta.csv"
    path.parent.mkdir(parents=True)
    path.write_bytes(fp32.paths["sdpa"].read_bytes())
    with pytest.raises(ValueError, match="differs from the sdpa schema"):
        collect(["sdpa"], 9, tmp_path / "c", precision="bf16", **kw)


def test_max_seconds_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    def slow_timer(fn, device):  # type: ignore[no-untyped-def]
        time.sleep(0.02)
        return fake_timer(fn, device)

    kw = {"device": "meta", "progress": False}
    stats = collect(["bmm", "relu"], 200, tmp_path / "b", timer=slow_timer, max_seconds=0.5, **kw)
    assert stats.unfinished == ["bmm", "relu"] and "relu" not in stats.paths
    assert 0 < stats.written["bmm"] < 200 and len(_rows(stats.paths["bmm"])) == stats.written["bmm"]
    again = collect(["bmm", "relu"], 200, tmp_path / "b", timer=fake_timer, **kw)
    full = collect(["bmm", "relu"], 200, tmp_path / "a", timer=fake_timer, **kw)
    assert again.unfinished == [] and again.existing["bmm"] == stats.written["bmm"]
    assert again.paths["bmm"].read_bytes() == full.paths["bmm"].read_bytes()
    with pytest.raises(ValueError, match="max_seconds must be >= 0"):
        collect(["bmm"], 1, tmp_path, timer=fake_timer, max_seconds=-1, **kw)


def test_cli_precision_and_max_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    args = parser().parse_args(["collect", "--ops", "relu", "--samples", "2", "--out", str(tmp_path),
                                "--precision", "fp16", "--max-seconds", "0"])  # fmt: skip
    assert args.precision == "fp16" and args.max_seconds == 0
    assert (
        parser().parse_args(["collect", "--ops", "relu", "--samples", "2", "--out", "x"]).precision == "fp32"
    )

    def on_meta(*args, **kwargs):  # type: ignore[no-untyped-def]
        return collect(*args, **{**kwargs, "device": "meta", "timer": fake_timer, "progress": False})

    monkeypatch.setattr(collect_mod, "collect", on_meta)
    assert args.run(args) == 0
    assert "--max-seconds 0: relu not finished" in capsys.readouterr().out
    args.max_seconds = None
    assert args.run(args) == 0
    assert [r["Precision"] for r in _rows(tmp_path / "fp16" / "ops" / "relu" / "meta.csv")] == ["fp16"] * 2
