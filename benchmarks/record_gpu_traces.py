"""Record measured fxcost traces of training steps on the local GPU, for ``gpu_pairs.py``.

Per case, precision and execution it writes under ``OUT/<gpu>/``:

- ``eager``: one training step captured with measurement (``fxcost.profile``: every node timed with
  CUDA events, its kernels from the profiler, the whole eager step timed as ground truth) as
  ``<case>-<precision>.json.gz`` (the trace; ``Report.load`` reads it anywhere) and
  ``<case>-<precision>.meta.json`` (GPU, driver, CUDA, torch, TF32 flags, measured step ms).
- ``inductor`` and ``inductor-max-autotune`` (``torch.compile`` with Inductor, default mode and
  ``mode="max-autotune-no-cudagraphs"``): the compiled step timed and its kernels profiled, as
  ``<case>-<precision>.<execution>.json`` (timing, clocks, kernel summary) and
  ``<case>-<precision>.<execution>-kernels.json.gz`` (every kernel of one step: name, microseconds).

Every step time, eager or compiled, also follows one protocol (:func:`time_step`): warm-ups until
three steps agree within 2%, then two blocks of timed steps; the median of all, and the two blocks'
medians apart (a step whose blocks disagree by more than 2% is flagged ``repeats_ok: false``), with
the GPU's clocks, temperature and power read (never set) before and after.

A case whose output exists is skipped, so an interrupted run resumes; ``--force`` records again;
``--retime`` times the steps of cases already recorded again, into ``<stem>.retime-<n>.json``, to see
how a measurement repeats on another machine of the same kind.
Cases: issue 10's host-bound steps (ResNet-50 at batch 32 and 64, GPT-2 small, BERT-base, the zoo's
LSTM; eager attention) and GPU-bound ones (Llama-style, GPT-2 medium, BERT-large with SDPA attention,
ResNet-50 at batch 256). Precisions: ``fp32`` (PyTorch's default flags: TF32 off for matmuls, on for
cuDNN), ``tf32`` (on for both), ``bf16`` (autocast). ``--smoke`` swaps in tiny versions, for checking
the script on a CPU (``--device cpu``); nothing recorded that way belongs in the fixtures.

    python benchmarks/record_gpu_traces.py --out benchmarks/fixtures/gpu
    python benchmarks/record_gpu_traces.py --cases llama-b4-s2048 --precisions bf16 \\
        --executions eager inductor --deadline-s 500
    python benchmarks/record_gpu_traces.py --device cpu --smoke --out /tmp/smoke

Last line: ``recorded=N skipped=N failed=N bytes=N``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

import fxcost
from fxcost import zoo
from fxcost.capture.step import default_loss
from fxcost.data.collect import device_label

Case = Callable[[], tuple[torch.nn.Module, Any]]
PRECISIONS = {"fp32": None, "tf32": None, "bf16": torch.bfloat16}
EXECUTIONS = {"eager": None, "inductor": "default", "inductor-max-autotune": "max-autotune-no-cudagraphs"}
FIXTURE_BUDGET_BYTES = 20 * 2**20  # what issues 10 and 23 allow all fixtures together
SETTLED = 0.02  # warm-ups end when three steps agree this closely; blocks further apart are flagged
CLOCKS = "clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active"


def _hf(kind: str, batch: int, seq: int, attention: str = "eager", **config: Any) -> Case:
    def build() -> tuple[torch.nn.Module, Any]:
        import transformers as t

        cls, config_cls = {
            "gpt2": (t.GPT2LMHeadModel, t.GPT2Config),
            "bert": (t.BertForMaskedLM, t.BertConfig),
            "llama": (t.LlamaForCausalLM, t.LlamaConfig),
        }[kind]
        hf_config = config_cls(**config)
        # eager: attention as matmuls and softmax, as issue 10's steps ran it; sdpa: the fused kernel
        hf_config._attn_implementation = attention
        ids = torch.randint(0, hf_config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
        return cls(hf_config), {"input_ids": ids, "labels": ids}

    return build


GPT2_MEDIUM = {"n_embd": 1024, "n_layer": 24, "n_head": 16, "n_positions": 1024}
BERT_LARGE = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
}
# A Llama-style model of half a billion parameters: grouped-query attention, SwiGLU, RMSNorm, RoPE.
LLAMA = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 8, "num_attention_heads": 16,
         "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048}  # fmt: skip


def cases(smoke: bool) -> dict[str, Case]:
    """Issue 10's host-bound steps and the GPU-bound ones, or tiny stand-ins of the same code paths."""
    if smoke:
        tiny = {"vocab_size": 128, "n_positions": 32, "n_layer": 1, "n_embd": 32, "n_head": 2}
        bert = {"vocab_size": 128, "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                "intermediate_size": 64}  # fmt: skip
        llama = {"vocab_size": 128, "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "intermediate_size": 64,
                 "max_position_embeddings": 32}  # fmt: skip
        return {
            "resnet50-b2": lambda: zoo.build("resnet50", batch=2, image=32),
            "gpt2-b2-s16": _hf("gpt2", 2, 16, **tiny),
            "bert-b2-s16": _hf("bert", 2, 16, **bert),
            "lstm-b2": lambda: zoo.build("lstm", batch=2, seq=8, vocab=128, embed=32, hidden=32),
            "llama-b2-s16": _hf("llama", 2, 16, "sdpa", **llama),
        }
    return {
        "resnet50-b32": lambda: zoo.build("resnet50", batch=32),
        "resnet50-b64": lambda: zoo.build("resnet50", batch=64),
        "gpt2-b8-s512": _hf("gpt2", 8, 512),
        "bert_base-b16-s128": _hf("bert", 16, 128),
        "lstm-b64": lambda: zoo.build("lstm", batch=64),
        # GPU-bound: kernels long enough that the host's issue time hides behind them
        "llama-b4-s2048": _hf("llama", 4, 2048, "sdpa", **LLAMA),
        "gpt2_medium-b16-s1024": _hf("gpt2", 16, 1024, "sdpa", **GPT2_MEDIUM),
        "bert_large-b32-s512": _hf("bert", 32, 512, "sdpa", **BERT_LARGE),
        "resnet50-b256": lambda: zoo.build("resnet50", batch=256),
    }


def _gpu_query(fields: str, device: torch.device) -> str | None:
    """``nvidia-smi``'s reading of ``fields`` for ``device`` (nothing is set), None where it cannot."""
    if device.type != "cuda":
        return None
    query = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader", f"--id={device.index or 0}"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """What the measurements depend on besides the model."""
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
            "gpu": device_label(device), "driver": _gpu_query("driver_version", device)}  # fmt: skip


@contextlib.contextmanager
def _tf32(allowed: bool | None) -> Iterator[dict[str, bool]]:
    """TF32 for matmuls and cuDNN set to ``allowed`` (None: PyTorch's defaults left as they are) and
    restored afterwards; yields the flags in force."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if allowed is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield {
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        }
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_ms(step: Callable[[], None], device: torch.device) -> float:
    """One step's milliseconds, from the host's view with the device synchronised on both sides."""
    _sync(device)
    start = time.perf_counter()
    step()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def time_step(step: Callable[[], None], device: torch.device, budget_s: float = 3.0) -> dict[str, Any]:
    """The repeatable step time: warm-ups until three consecutive steps agree within :data:`SETTLED`
    (at most 20), then two blocks of timed steps (each about ``budget_s / 2``, 5 to 30 steps). Returns
    the median of all timed steps, each block's median, their disagreement in percent, whether it is
    within :data:`SETTLED`, and the GPU's clocks before and after."""
    before = _gpu_query(CLOCKS, device)
    warm: list[float] = []
    while len(warm) < 20:
        warm.append(_step_ms(step, device))
        last = warm[-3:]
        if len(last) == 3 and (max(last) - min(last)) <= SETTLED * statistics.median(last):
            break
    per_block = int(min(30, max(5, budget_s * 1e3 / 2 / max(statistics.median(warm[-3:]), 1e-3))))
    blocks = [[_step_ms(step, device) for _ in range(per_block)] for _ in range(2)]
    medians = [statistics.median(b) for b in blocks]
    step_ms = statistics.median(blocks[0] + blocks[1])
    spread = abs(medians[0] - medians[1]) / step_ms * 100
    return {"step_ms": step_ms, "block_ms": medians, "spread_pct": round(spread, 3),
            "repeats_ok": spread <= SETTLED * 100, "warmups": len(warm), "steps_per_block": per_block,
            "clocks_before": before, "clocks_after": _gpu_query(CLOCKS, device),
            "clocks_fields": CLOCKS}  # fmt: skip


def _training_step(model: Any, inputs: Any) -> Callable[[], None]:
    """Forward, the loss fxcost captures (``default_loss``) and backward, gradients reset each step."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        for p in params:
            p.grad = None
        out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
        default_loss(out).backward()

    return step


def _kernels_of_one_step(step: Callable[[], None], device: torch.device) -> list[tuple[str, float]]:
    """(name, microseconds) of every GPU kernel one step launches, in launch order."""
    if device.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        _sync(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    return [(e.name, round(e.device_time, 3)) for e in kernels]


def _built(build: Case, precision: str, device: torch.device) -> tuple[torch.nn.Module, Any]:
    model, inputs = build()
    model = model.to(device)
    inputs = tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, inputs)
    dtype = PRECISIONS[precision]
    if dtype is not None:
        model = zoo.Autocast(model, device.type, dtype)
    return model, inputs


def record_eager(name: str, model: Any, inputs: Any, precision: str, device: torch.device,
                 env: dict[str, Any], out: Path) -> dict[str, Any]:  # fmt: skip
    """Capture and measure one eager step; returns the meta it wrote beside the trace."""
    started = time.perf_counter()
    report = fxcost.profile(model, inputs, train=True, devices=["H100-SXM", "H200"])
    stem = f"{name}-{precision}"
    trace = report.save(out / f"{stem}.json.gz")
    timed = time_step(_training_step(model, inputs), device)
    meta = {"case": name, "precision": precision, "execution": "eager", **env, "origin": report.origin,
            "step_ms": report.step_ms, "node_sum_ms": report.origin_ms(), "fidelity": report.capture_fidelity,
            "nodes": len(report.nodes), "trace": trace.name, "timed": timed,
            "capture_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    path = out / f"{stem}.meta.json"
    path.write_text(json.dumps(meta, indent=1) + "\n")  # last: its presence marks the case done
    return meta


def record_compiled(name: str, model: Any, inputs: Any, precision: str, execution: str, device: torch.device,
                    env: dict[str, Any], out: Path) -> dict[str, Any]:  # fmt: skip
    """Compile one training step with Inductor, time it and list its kernels; returns what it wrote."""
    torch._dynamo.reset()
    compiled = torch.compile(model, mode=EXECUTIONS[execution])
    step = _training_step(compiled, inputs)
    started = time.perf_counter()
    step()  # compiles the forward and the backward
    _sync(device)
    compile_s = time.perf_counter() - started
    timed = time_step(step, device)
    kernels = _kernels_of_one_step(step, device)
    stem = f"{name}-{precision}.{execution}"
    listing = out / f"{stem}-kernels.json.gz"
    with gzip.open(listing, "wt") as f:
        json.dump(kernels, f)
    families = Counter(k.split("_")[1] if k.startswith("triton_") else "extern" for k, _ in kernels)
    meta = {"case": name, "precision": precision, "execution": execution, "mode": EXECUTIONS[execution],
            **env, "step_ms": timed["step_ms"], "timed": timed, "kernels": len(kernels),
            "kernel_ms": sum(us for _, us in kernels) / 1e3, "kernel_families": dict(families),
            "kernel_listing": listing.name, "compile_s": round(compile_s, 1)}  # fmt: skip
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=1) + "\n")
    torch._dynamo.reset()
    return meta


def retime(name: str, model: Any, inputs: Any, precision: str, execution: str, device: torch.device,
           env: dict[str, Any], out: Path) -> dict[str, Any]:  # fmt: skip
    """Time an already recorded step again (eager, or compiled anew) into ``<stem>.retime-<n>.json``."""
    stem = f"{name}-{precision}" + ("" if execution == "eager" else f".{execution}")
    if execution != "eager":
        torch._dynamo.reset()
        model = torch.compile(model, mode=EXECUTIONS[execution])
    step = _training_step(model, inputs)
    step()
    meta = {"case": name, "precision": precision, "execution": execution, **env, **time_step(step, device)}
    n = 1 + sum(1 for _ in out.glob(f"{stem}.retime-*.json"))
    (out / f"{stem}.retime-{n}.json").write_text(json.dumps(meta, indent=1) + "\n")
    torch._dynamo.reset()
    return meta


def _done(out: Path, name: str, precision: str, execution: str) -> bool:
    stem = f"{name}-{precision}"
    return (out / (f"{stem}.meta.json" if execution == "eager" else f"{stem}.{execution}.json")).exists()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/fixtures/gpu"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", nargs="+", help="a subset of the case names")
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=["fp32", "bf16"])
    parser.add_argument("--executions", nargs="+", choices=list(EXECUTIONS), default=["eager"])
    parser.add_argument("--smoke", action="store_true", help="tiny models, to check the script on a CPU")
    parser.add_argument("--force", action="store_true", help="record cases that are already there again")
    parser.add_argument("--retime", action="store_true", help="time recorded steps again (no capture)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no new case after this many seconds")  # fmt: skip
    args = parser.parse_args(argv)
    began = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here; use --device cpu --smoke to check the script", file=sys.stderr)
        return 2
    available = cases(args.smoke)
    unknown = set(args.cases or []) - set(available)
    if unknown:
        print(f"unknown cases {sorted(unknown)}; cases: {', '.join(available)}", file=sys.stderr)
        return 2
    env = environment(device)
    out = args.out / env["gpu"].replace(" ", "_").replace("/", "_")
    out.mkdir(parents=True, exist_ok=True)
    counts = {"recorded": 0, "skipped": 0, "failed": 0}
    for name in args.cases or available:
        for precision in args.precisions:
            done = [x for x in args.executions if _done(out, name, precision, x)]
            # --retime times what was recorded; otherwise what was not (everything with --force)
            todo = done if args.retime else [x for x in args.executions if args.force or x not in done]
            counts["skipped"] += len(args.executions) - len(todo)
            if not todo:
                continue
            if args.deadline_s is not None and time.perf_counter() - began > args.deadline_s:
                print(
                    f"{name} {precision}: not started, past the {args.deadline_s:.0f} s deadline", flush=True
                )
                counts["skipped"] += len(todo)
                continue
            with _tf32(True if precision == "tf32" else None) as flags:
                model, inputs = _built(available[name], precision, device)
                for execution in todo:
                    try:
                        if args.retime:
                            meta = retime(name, model, inputs, precision, execution, device, env | flags, out)
                        elif execution == "eager":
                            meta = record_eager(name, model, inputs, precision, device, env | flags, out)
                        else:
                            meta = record_compiled(name, model, inputs, precision, execution, device,
                                                   env | flags, out)  # fmt: skip
                    except Exception as e:  # one case failing should not lose the others
                        counts["failed"] += 1
                        print(f"{name} {precision} {execution}: FAILED {type(e).__name__}: {e}", flush=True)
                        torch._dynamo.reset()
                        continue
                    counts["recorded"] += 1
                    timed = meta.get("timed", meta)
                    print(f"{name:22s} {precision} {execution:22s} step {meta['step_ms']:9.3f} ms  "
                          f"protocol {timed['step_ms']:9.3f} ms  spread {timed['spread_pct']:5.2f}%  "
                          f"({time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
                del model, inputs
            if device.type == "cuda":
                torch.cuda.empty_cache()
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    if size > FIXTURE_BUDGET_BYTES:
        print(f"warning: {size} bytes under {args.out}, over the {FIXTURE_BUDGET_BYTES}-byte fixture budget")
    print(" ".join(f"{k}={v}" for k, v in counts.items()) + f" bytes={size}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
