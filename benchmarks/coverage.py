"""How much of real graphs fxcost's learned and runtime models cover, and what falls back.

Captures a zoo of models on this CPU — the built-in ones and, when ``transformers`` is installed,
small Hugging Face models built from configs (GPT-2, BERT, T5, ViT, a Llama-style decoder, OPT, a
Mixtral mixture-of-experts layer) — in training and inference, fp32 and bf16 autocast, predicts them
on one GPU with the default policy and counts per model: nodes, nodes with a kernel, nodes predicted
by a learned or wave-scaling model (and among them, the nodes the heads price as the work they
lower to: memory-bound ops as elementwise passes, which ``benchmarks/lowered_ops.py`` checks on real
GPU traces, and cuDNN RNNs as their GEMMs),
nodes left to the roofline fallback, nodes nothing predicted.
A model that fails to capture is reported and counted, never fatal.

    python benchmarks/coverage.py [--device A100-SXM4-80GB] [--out rows.csv]

Last line: ``models=N failed_models=N fallback_node_pct=.. fallback_all_nodes_pct=.. lowered_node_pct=..``:
nodes on the roofline or unpredicted, over the nodes that launch a kernel (the figure to watch: views
cost nothing and are predicted trivially), and over all nodes (the denominator of issue 11's
wording); then the lowered nodes over the nodes that launch a kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

import fxcost
from fxcost import zoo
from fxcost.cost_models.heads import LOWERED, head_of

LEARNED = {"mlp", "mlp_ratio", "wave_scaling", "justus"}
Builder = Callable[[], tuple[torch.nn.Module, Any]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="A100-SXM4-80GB")
    parser.add_argument("--out", help="write one row per model to this CSV")
    args = parser.parse_args()
    start = time.perf_counter()
    device = fxcost.get_device(args.device).name
    rows, fallback_ops = [], Counter[str]()
    for name, build in _zoo().items():
        for train in (True, False):
            for precision in ("fp32", "bf16"):
                label = f"{name} {'train' if train else 'inference'} {precision}"
                rows.append({"model": label, **_measure(build, train, precision, device, fallback_ops)})
                print(f"  {label}: {rows[-1]['status']}", flush=True)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    print("\nops on the roofline fallback (kernel nodes, all models):")
    print("  " + ", ".join(f"{op} {n}" for op, n in fallback_ops.most_common(12)))
    if args.out:
        table.to_csv(args.out, index=False)
    ok = table[table["status"] == "ok"]
    kernels, nodes = int(ok["kernel_nodes"].sum()), int(ok["nodes"].sum())
    fallback = int(ok["roofline"].sum() + ok["unpredicted"].sum())
    lowered = int(ok["lowered"].sum())
    print(f"({time.perf_counter() - start:.0f} s)")
    print(f"models={len(table)} failed_models={int((table['status'] != 'ok').sum())} "
          f"fallback_node_pct={100 * fallback / max(kernels, 1):.2f} "
          f"fallback_all_nodes_pct={100 * fallback / max(nodes, 1):.2f} "
          f"lowered_node_pct={100 * lowered / max(kernels, 1):.2f}")  # fmt: skip
    return 0


def _measure(
    build: Builder, train: bool, precision: str, device: str, fallback: Counter[str]
) -> dict[str, Any]:
    try:
        model, inputs = build()
        model.train(train)
        step = zoo.Autocast(model, "cpu") if precision == "bf16" else model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = fxcost.profile(step, inputs, devices=[device], train=train, measure=False)
    except Exception as e:  # counted and shown: the point of the benchmark
        return {"status": f"failed: {type(e).__name__}: {str(e)[:80]}"}
    kernel_nodes = [n for n in report.nodes if n.has_kernel]
    sources = [n.pred_source.get(device) for n in kernel_nodes]
    fallback.update(n.op for n in report.nodes if n.has_kernel and n.pred_source.get(device) not in LEARNED)
    return {
        "status": "ok",
        "nodes": len(report.nodes),
        "kernel_nodes": len(sources),
        "learned": sum(s in LEARNED for s in sources),
        "lowered": sum(
            s == "mlp" and head_of(n) == LOWERED for n, s in zip(kernel_nodes, sources, strict=True)
        ),
        "roofline": sum(s == "roofline" for s in sources),
        "unpredicted": sum(s not in LEARNED and s != "roofline" for s in sources),
        "ms": round(report.eager_ms(device), 3),
    }


def _zoo() -> dict[str, Builder]:
    models: dict[str, Builder] = {name: (lambda name=name: zoo.build(name, batch=2)) for name in zoo.names()}
    with contextlib.suppress(ImportError):
        models.update(_hugging_face())
    return models


def _hugging_face() -> dict[str, Builder]:
    import transformers as t

    tokens = torch.ones(2, 32, dtype=torch.long)

    def lm(config: Any, cls: Any, **extra: Any) -> Builder:
        def build() -> tuple[torch.nn.Module, Any]:
            config._attn_implementation = "eager"
            return cls(config), {"input_ids": tokens, "labels": tokens, **extra}

        return build

    small = {"vocab_size": 256, "pad_token_id": 0}
    gpt2 = t.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, **small)
    bert = t.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, **small
    )
    t5 = t.T5Config(num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16,
                    decoder_start_token_id=0, **small)  # fmt: skip
    llama = t.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=2, **small)  # fmt: skip
    opt = t.OPTConfig(num_hidden_layers=2, hidden_size=64, ffn_dim=128, num_attention_heads=4,
                      word_embed_proj_dim=64, **small)  # fmt: skip
    mixtral = t.MixtralConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                              num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                              num_experts_per_tok=2, **small)  # fmt: skip
    vit = t.ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                      image_size=32, patch_size=8)  # fmt: skip
    images = {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 1])}
    return {
        "hf-gpt2": lm(gpt2, t.GPT2LMHeadModel),
        "hf-bert": lm(bert, t.BertForMaskedLM),
        "hf-t5": lm(t5, t.T5ForConditionalGeneration),
        "hf-llama": lm(llama, t.LlamaForCausalLM),
        "hf-opt": lm(opt, t.OPTForCausalLM),
        "hf-mixtral-moe": lm(mixtral, t.MixtralForCausalLM),
        "hf-vit": lambda: (t.ViTForImageClassification(vit), images),
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
