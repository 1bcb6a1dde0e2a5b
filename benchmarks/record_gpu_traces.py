"""Record measured fxcost traces of issue 10's training steps on the local GPU, for ``gpu_pairs.py``.

Per case and precision (fp32, bf16 autocast) it captures one training step with measurement
(``fxcost.profile``: every node timed with CUDA events, its kernels from the profiler, and the whole
eager step timed as ground truth, median of repeats after warm-ups) and writes

    OUT/<gpu>/<case>-<precision>.json.gz     the trace (Report.save; Report.load reads it anywhere)
    OUT/<gpu>/<case>-<precision>.meta.json   GPU, driver, CUDA, torch, TF32 flags, measured step ms

A case whose meta file exists is skipped, so an interrupted run resumes; ``--force`` records again.
Cases: ResNet-50 (batch 32, 64), GPT-2 small (batch 8, seq 512), BERT-base (batch 16, seq 128), the
zoo's LSTM language model (batch 64, seq 32). ``--smoke`` swaps in tiny versions of each, for checking
the script on a CPU (``--device cpu``); nothing recorded that way belongs in the fixtures.

    python benchmarks/record_gpu_traces.py --out benchmarks/fixtures/gpu
    python benchmarks/record_gpu_traces.py --device cpu --smoke --out /tmp/smoke

Last line: ``recorded=N skipped=N failed=N bytes=N``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

import fxcost
from fxcost import zoo
from fxcost.data.collect import device_label

Case = Callable[[], tuple[torch.nn.Module, Any]]
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
FIXTURE_BUDGET_BYTES = 10 * 2**20  # what issue 10 allows all fixtures together


def _hf(kind: str, batch: int, seq: int, **config: Any) -> Case:
    def build() -> tuple[torch.nn.Module, Any]:
        import transformers as t

        cls, config_cls = {
            "gpt2": (t.GPT2LMHeadModel, t.GPT2Config),
            "bert": (t.BertForMaskedLM, t.BertConfig),
        }[kind]
        hf_config = config_cls(**config)
        hf_config._attn_implementation = "eager"  # attention as matmuls and softmax, as eager GPT-2 runs it
        ids = torch.randint(0, hf_config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
        return cls(hf_config), {"input_ids": ids, "labels": ids}

    return build


def cases(smoke: bool) -> dict[str, Case]:
    """Issue 10's steps, or tiny stand-ins of the same code paths."""
    if smoke:
        tiny = {"vocab_size": 128, "n_positions": 32, "n_layer": 1, "n_embd": 32, "n_head": 2}
        bert = {"vocab_size": 128, "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                "intermediate_size": 64}  # fmt: skip
        return {
            "resnet50-b2": lambda: zoo.build("resnet50", batch=2, image=32),
            "gpt2-b2-s16": _hf("gpt2", 2, 16, **tiny),
            "bert-b2-s16": _hf("bert", 2, 16, **bert),
            "lstm-b2": lambda: zoo.build("lstm", batch=2, seq=8, vocab=128, embed=32, hidden=32),
        }
    return {
        "resnet50-b32": lambda: zoo.build("resnet50", batch=32),
        "resnet50-b64": lambda: zoo.build("resnet50", batch=64),
        "gpt2-b8-s512": _hf("gpt2", 8, 512),
        "bert_base-b16-s128": _hf("bert", 16, 128),
        "lstm-b64": lambda: zoo.build("lstm", batch=64),
    }


def environment(device: torch.device) -> dict[str, Any]:
    """What the measurements depend on besides the model."""
    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
                           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                           "tf32_cudnn": torch.backends.cudnn.allow_tf32}  # fmt: skip
    env["gpu"], env["driver"] = device_label(device), None
    if device.type == "cuda":
        try:
            query = [
                "nvidia-smi",
                "--query-gpu=driver_version",
                "--format=csv,noheader",
                f"--id={device.index or 0}",
            ]
            env["driver"] = (
                subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip() or None
            )
        except (OSError, subprocess.SubprocessError):
            pass
    return env


def record(
    name: str, build: Case, precision: str, device: torch.device, env: dict[str, Any], out: Path
) -> dict[str, Any]:
    """Capture and measure one case; returns the meta it wrote beside the trace (``env``:
    :func:`environment`)."""
    model, inputs = build()
    model = model.to(device)
    inputs = tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, inputs)
    dtype = PRECISIONS[precision]
    if dtype is not None:
        model = zoo.Autocast(model, device.type, dtype)
    started = time.perf_counter()
    report = fxcost.profile(model, inputs, train=True, devices=["H100-SXM", "H200"])
    stem = f"{name}-{precision}"
    trace = report.save(out / f"{stem}.json.gz")
    meta = {"case": name, "precision": precision, **env, "origin": report.origin,
            "step_ms": report.step_ms, "node_sum_ms": report.origin_ms(), "fidelity": report.capture_fidelity,
            "nodes": len(report.nodes), "trace": trace.name,
            "capture_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    path = out / f"{stem}.meta.json"
    path.write_text(json.dumps(meta, indent=1) + "\n")  # last: its presence marks the case done
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/fixtures/gpu"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", nargs="+", help="a subset of the case names")
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--smoke", action="store_true", help="tiny models, to check the script on a CPU")
    parser.add_argument("--force", action="store_true", help="record cases that are already there again")
    args = parser.parse_args(argv)
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
            if (out / f"{name}-{precision}.meta.json").exists() and not args.force:
                counts["skipped"] += 1
                continue
            try:
                meta = record(name, available[name], precision, device, env, out)
            except Exception as e:  # one case failing should not lose the others
                counts["failed"] += 1
                print(f"{name} {precision}: FAILED {type(e).__name__}: {e}", flush=True)
                continue
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            counts["recorded"] += 1
            print(f"{name:20s} {precision}  step {meta['step_ms']:9.3f} ms  fidelity {meta['fidelity']:.3f}  "
                  f"nodes {meta['nodes']:5d}  ({meta['capture_s']} s)", flush=True)  # fmt: skip
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    if size > FIXTURE_BUDGET_BYTES:
        print(f"warning: {size} bytes under {args.out}, over the {FIXTURE_BUDGET_BYTES}-byte fixture budget")
    print(" ".join(f"{k}={v}" for k, v in counts.items()) + f" bytes={size}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
