"""How much of real graphs fxcost's learned and runtime models cover, what falls back, and whether the
backend changes any model's results.

The zoo, captured on this CPU: the built-in models; torchvision-style architectures written out in
``fxcost.zoo.vision`` (MobileNetV3, a U-Net with bilinear upsampling, FCN on a ResNet, a CenterNet-style
detection head with roll/topk/sort, a CTC-loss LSTM, an EmbeddingBag classifier): torchvision's and
timm's wheels do not import beside a CPU build of PyTorch; and, when ``transformers`` is installed,
small Hugging Face models built from configs with random weights: GPT-2, BERT, T5, OPT, Llama,
Mixtral (eager attention, as the measured data runs it), and with PyTorch's fused attention (SDPA,
Hugging Face's default) Qwen2, Whisper, a Qwen2-MoE, and the vision models ViT, ConvNeXt, Swin
(shifted windows: roll) and SegFormer (segmentation, upsampling); ``--full`` adds EfficientNet,
MobileNetV2 and ResNet.

Each model's training step in fp32 runs three times from the same weights and seed: eagerly, through
``torch.compile(backend="aot_eager")`` and through fxcost's backend (measuring its nodes). A model is
*changed* when fxcost's loss, gradients or buffers differ from aot_eager's in any bit: fxcost runs the
graphs AOTAutograd made, so any difference would be its own. Differences from eager are shown too
(``eager_diff``, the largest absolute one, equal in aot_eager where AOTAutograd causes them).
Then each model is predicted on one GPU with the default policy, from that capture and from captures
of the other variants (inference, bf16 autocast; by default the built-in models' only, all with
``--full``), counting per variant: nodes, nodes with a kernel, nodes predicted by a learned or
wave-scaling model (among them, the ``lowered`` ones the heads price as the work they lower to:
memory-bound ops as elementwise passes, which ``benchmarks/lowered_ops.py`` checks on real GPU
traces, RNNs, attention and MoE experts as their GEMMs), nodes left to the roofline fallback, nodes
nothing predicted. A model that fails is reported and counted, never fatal.

    python benchmarks/coverage.py [--device A100-SXM4-80GB] [--out rows.csv] [--full] [--only NAME ...]

Last line: ``models=N failed_models=N fallback_node_pct=.. fallback_all_nodes_pct=.. lowered_node_pct=..
changed_models=N``: nodes on the roofline or unpredicted, over the nodes that launch a kernel (the
figure to watch: views cost nothing and are predicted trivially), and over all nodes (the
denominator of issue 11's wording); the lowered nodes over the nodes that launch a kernel; models
whose results fxcost's backend changed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import torch

import fxcost
from fxcost import zoo
from fxcost.capture.step import default_loss
from fxcost.cost_models.heads import LOWERED, head_of
from fxcost.report import Report
from fxcost.zoo import vision

LEARNED = {"mlp", "mlp_ratio", "wave_scaling", "justus"}
Builder = Callable[[], tuple[torch.nn.Module, Any]]
VARIANTS = [(True, "fp32"), (True, "bf16"), (False, "fp32"), (False, "bf16")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="A100-SXM4-80GB")
    parser.add_argument("--out", help="write one row per model variant to this CSV")
    parser.add_argument("--full", action="store_true", help="every variant of every model, and more models")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these models")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    device = fxcost.get_device(args.device).name
    fallback_ops = Counter[str]()
    rows, comparisons = [], []
    hugging_face = not args.only or any(name.startswith("hf-") for name in args.only)
    for name, build in _zoo(args.full, hugging_face).items():
        if args.only and name not in args.only:
            continue
        builtin = name in SMALL_BUILTIN
        begun = time.perf_counter()
        # The built-in models' default sizes take minutes to measure on a CPU: they are compared at
        # the small sizes of the test suite, and their coverage counted at full size without running.
        small = (lambda name=name: zoo.build(name, **SMALL_BUILTIN[name])) if builtin else build
        comparison, report = _compare(small, device)
        comparisons.append({"model": name, **comparison, "s": round(time.perf_counter() - begun, 1)})
        print(f"  {name}: {comparison['status']}", flush=True)
        for train, precision in VARIANTS if (args.full or builtin) else VARIANTS[:1]:
            label = f"{name} {'train' if train else 'inference'} {precision}"
            if report is not None and not builtin and train and precision == "fp32":
                row = {"status": "ok", **_coverage(report, device, fallback_ops)}
            else:
                row = _measure(build, train, precision, device, fallback_ops)
            rows.append({"model": label, **row})
    table, compared = pd.DataFrame(rows), pd.DataFrame(comparisons)
    with pd.option_context("display.width", 250, "display.max_colwidth", 70):
        print(table.to_string(index=False))
        print("\nfp32 training steps: changed = fxcost's results differ from aot_eager's in some bit;")
        print("eager_diff, aot_eager_diff = the largest absolute difference of each from eager's")
        print(compared.to_string(index=False))
    print("\nops on the roofline fallback (kernel nodes, all models):")
    print("  " + (", ".join(f"{op} {n}" for op, n in fallback_ops.most_common(12)) or "none"))
    if args.out:
        table.to_csv(args.out, index=False)
    ok = table[table["status"] == "ok"]
    kernels, nodes = int(ok["kernel_nodes"].sum()), int(ok["nodes"].sum())
    fallback = int(ok["roofline"].sum() + ok["unpredicted"].sum())
    lowered = int(ok["lowered"].sum())
    changed = int(compared["changed"].fillna(False).astype(bool).sum())
    failed = int((table["status"] != "ok").sum() + (compared["status"] != "ok").sum())
    print(f"({time.perf_counter() - start:.0f} s)")
    print(f"models={len(table)} failed_models={failed} "
          f"fallback_node_pct={100 * fallback / max(kernels, 1):.2f} "
          f"fallback_all_nodes_pct={100 * fallback / max(nodes, 1):.2f} "
          f"lowered_node_pct={100 * lowered / max(kernels, 1):.2f} changed_models={changed}")  # fmt: skip
    return 0


def _measure(
    build: Builder, train: bool, precision: str, device: str, fallback: Counter[str]
) -> dict[str, Any]:
    """Coverage of one variant, captured without running (``profile(measure=False)``)."""
    try:
        model, inputs = build()
        model.train(train)
        step = zoo.Autocast(model, "cpu") if precision == "bf16" else model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = fxcost.profile(step, inputs, devices=[device], train=train, measure=False)
    except Exception as e:  # counted and shown: the point of the benchmark
        return {"status": f"failed: {type(e).__name__}: {str(e)[:80]}"}
    return {"status": "ok", **_coverage(report, device, fallback)}


def _compare(build: Builder, device: str) -> tuple[dict[str, Any], Report | None]:
    """One fp32 training step eagerly, through aot_eager and through fxcost's backend (measuring each
    node, as by default), from the same weights and seed: whether fxcost's results equal aot_eager's
    bit for bit, how far each is from eager's; and fxcost's report."""
    try:
        model, inputs = build()
        model.train(True)
        eager = _step(copy.deepcopy(model), inputs, None)
        aot = _step(copy.deepcopy(model), inputs, "aot_eager")
        backend = fxcost.estimate(devices=[device], budget_ms=0.5)
        ours = _step(copy.deepcopy(model), inputs, backend)
        report = backend.report()
    except Exception as e:  # counted and shown: the point of the benchmark
        return {"status": f"failed: {type(e).__name__}: {str(e)[:80]}"}, None
    comparison = {
        "status": "ok" if not backend.failures else f"fxcost warned: {backend.failures[0][:80]}",
        "changed": not all(_same(a, b) for a, b in zip(ours, aot, strict=True)),
        "eager_diff": max(_difference(a, b) for a, b in zip(ours, eager, strict=True)),
        "aot_eager_diff": max(_difference(a, b) for a, b in zip(aot, eager, strict=True)),
    }
    return comparison, report


def _step(model: torch.nn.Module, inputs: Any, backend: Any) -> list[torch.Tensor | None]:
    """Loss, parameter gradients and buffers after one training step (compiled with ``backend``,
    eager if None), from seed 0."""
    torch._dynamo.reset()
    step = model if backend is None else torch.compile(model, backend=backend)
    with _quiet(), torch.random.fork_rng(devices=[]), torch._dynamo.config.patch(allow_rnn=True):
        torch.manual_seed(0)
        output = step(**inputs) if isinstance(inputs, dict) else step(*inputs)
        loss = default_loss(output)
        loss.backward()
    torch._dynamo.reset()
    grads = [p.grad for p in model.parameters()]
    return [loss.detach(), *grads, *model.buffers()]


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bit-equal results (NaNs in the same places count as equal)."""
    if a is None or b is None:
        return a is b
    if a.shape != b.shape:
        return False
    nan = a.isnan()
    return bool(torch.equal(a, b) or (torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])))


def _difference(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """The largest absolute difference of two results (infinite if one is missing or shapes differ)."""
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    if a.shape != b.shape:
        return float("inf")
    if _same(a, b):
        return 0.0
    return float((a.double() - b.double()).abs().nan_to_num(float("inf")).max())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _coverage(report: Report, device: str, fallback: Counter[str]) -> dict[str, Any]:
    kernel_nodes = [n for n in report.nodes if n.has_kernel]
    sources = [n.pred_source.get(device) for n in kernel_nodes]
    fallback.update(n.op for n, s in zip(kernel_nodes, sources, strict=True) if s not in LEARNED)
    return {
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


# The built-in models at the sizes of tests/capture/test_backend.py.
SMALL_BUILTIN: dict[str, dict[str, int]] = {
    "mlp": {"batch": 4, "features": 32, "hidden": 64, "layers": 3, "classes": 10},
    "resnet50": {"batch": 2, "image": 32, "width": 8},
    "lstm": {"batch": 2, "seq": 6, "vocab": 50, "embed": 16, "hidden": 16},
    "transformer_block": {"batch": 2, "seq": 8, "dim": 32, "heads": 4},
    "gpt2": {"batch": 2, "seq": 8, "vocab": 64, "dim": 32, "heads": 4, "layers": 2},
}


def _zoo(full: bool, hugging_face: bool = True) -> dict[str, Builder]:
    models: dict[str, Builder] = {
        name: (lambda name=name: zoo.build(name, batch=2)) for name in SMALL_BUILTIN
    }
    models.update({name: (lambda name=name: vision.build(name, batch=2)) for name in vision.MODELS})
    if hugging_face:  # importing transformers takes seconds
        with contextlib.suppress(ImportError):
            models.update(_hugging_face(full))
    return models


def _hugging_face(full: bool) -> dict[str, Builder]:
    import transformers as t

    tokens = torch.ones(2, 32, dtype=torch.long)

    def lm(config: Any, cls: Any, attention: str = "eager", **extra: Any) -> Builder:
        def build() -> tuple[torch.nn.Module, Any]:
            config._attn_implementation = attention
            return cls(config), {"input_ids": tokens, "labels": tokens, **extra}

        return build

    def vision_model(config: Any, cls: Any, labels: torch.Tensor, size: int = 32) -> Builder:
        def build() -> tuple[torch.nn.Module, Any]:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                return cls(config), {"pixel_values": torch.randn(2, 3, size, size), "labels": labels}

        return build

    small = {"vocab_size": 256, "pad_token_id": 0}
    decoder = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 2, **small}  # fmt: skip
    gpt2 = t.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, **small)
    bert = t.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, **small
    )
    t5 = t.T5Config(num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16,
                    decoder_start_token_id=0, **small)  # fmt: skip
    opt = t.OPTConfig(num_hidden_layers=2, hidden_size=64, ffn_dim=128, num_attention_heads=4,
                      word_embed_proj_dim=64, **small)  # fmt: skip
    mixtral = t.MixtralConfig(
        **{**decoder, "num_hidden_layers": 1}, num_local_experts=4, num_experts_per_tok=2
    )
    qwen_moe = t.Qwen2MoeConfig(**{**decoder, "num_hidden_layers": 1}, moe_intermediate_size=64,
                                shared_expert_intermediate_size=64, num_experts=4,
                                num_experts_per_tok=2)  # fmt: skip
    whisper = t.WhisperConfig(attn_implementation="sdpa", d_model=64, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32,
                              max_target_positions=64, decoder_start_token_id=1, **small)  # fmt: skip
    audio = {"input_features": torch.randn(2, 16, 64), "labels": torch.ones(2, 16, dtype=torch.long)}
    vit = t.ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                      image_size=32, patch_size=8)  # fmt: skip
    classes = torch.tensor([0, 1])
    stages = {"hidden_sizes": [16, 32], "depths": [1, 1]}
    images: dict[str, tuple[Any, Any, torch.Tensor]] = {
        "hf-vit": (vit, t.ViTForImageClassification, classes),
        "hf-convnext": (t.ConvNextConfig(num_stages=2, num_labels=2, **stages),
                        t.ConvNextForImageClassification, classes),
        "hf-swin": (t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                 window_size=4, num_labels=2), t.SwinForImageClassification, classes),
        "hf-segformer": (t.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                           hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                           decoder_hidden_size=32, num_labels=3),
                         t.SegformerForSemanticSegmentation, torch.randint(0, 3, (2, 32, 32))),
    }  # fmt: skip
    if full:  # more of the same kernels (the built-in ResNet-50 and fcn, mobilenet_v3)
        images.update({
            "hf-efficientnet": (t.EfficientNetConfig(image_size=32, width_coefficient=0.25,
                                                     depth_coefficient=0.25, hidden_dim=320, num_labels=2),
                                t.EfficientNetForImageClassification, classes),
            "hf-mobilenet-v2": (t.MobileNetV2Config(depth_multiplier=0.35, image_size=32, num_labels=2),
                                t.MobileNetV2ForImageClassification, classes),
        })  # fmt: skip
        resnet = t.ResNetConfig(embedding_size=16, layer_type="bottleneck", num_labels=2, **stages)
        images["hf-resnet"] = (resnet, t.ResNetForImageClassification, classes)
    return {
        "hf-gpt2": lm(gpt2, t.GPT2LMHeadModel),
        "hf-bert": lm(bert, t.BertForMaskedLM),
        "hf-t5": lm(t5, t.T5ForConditionalGeneration),
        "hf-llama": lm(t.LlamaConfig(**decoder), t.LlamaForCausalLM),
        "hf-opt": lm(opt, t.OPTForCausalLM),
        "hf-mixtral-moe": lm(mixtral, t.MixtralForCausalLM),
        "hf-qwen2-sdpa": lm(t.Qwen2Config(**decoder), t.Qwen2ForCausalLM, "sdpa"),
        "hf-qwen2-moe-sdpa": lm(qwen_moe, t.Qwen2MoeForCausalLM, "sdpa"),
        "hf-whisper-sdpa": lambda: (t.WhisperForConditionalGeneration(whisper), audio),
        **{name: vision_model(*spec) for name, spec in images.items()},
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
