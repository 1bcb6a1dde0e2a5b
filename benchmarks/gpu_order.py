"""Does a GPU at least as strong in every relevant spec ever get a slower origin-free prediction?

For every pair of GPUs in the database where one is at least as strong as the other in each spec that
sets speed (fp32, TF32, fp16 and bf16 peaks, DRAM bandwidth, SMs, L2, boost clock, power), a grid of GEMM,
batched-GEMM (attention's score and value products), convolution, layer-norm, softmax and
elementwise shapes (fp32; GEMMs, batched GEMMs and convolutions also in bf16, GEMMs in TF32), bf16
fused attention (SDPA forward and backward, each GPU's own kernel) and training batch norm (fp32 and
bf16, forward and backward: its per-channel kernels are bound by memory latency) and max pooling is
predicted on both with the default origin-free policy: the time each node is priced at (the op
timed alone). Printed per op class: the pairs and shapes
compared, the share where the stronger GPU is predicted slower (more than 0.1%), and the worst ratio.

    python benchmarks/gpu_order.py [--heads DIR]

Last line: ``<class>_order_violation_pct=..`` per class, then ``comparisons=N gpu_pairs=P``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import numpy as np

from fxcost.cost_models import NodeBatch, predict_batch
from fxcost.cost_models.heads import Heads
from fxcost.cost_models.roofline import Roofline
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import Device
from fxcost.gpus.order import comparable, weaker_than
from fxcost.lowering.nodes import batch_norm_node, conv_node, gemm_node, synthetic_node
from fxcost.records import NodeCost

SIZES = (1, 7, 64, 333, 1024, 4096)


def shapes() -> dict[str, list[NodeCost]]:
    """The grid: every op class at small, odd and large sizes."""
    return {
        "linear": [gemm_node("linear", 1, m, n, k) for m in SIZES for n in SIZES[1:] for k in SIZES[1:]],
        "attention_bmm": [gemm_node("bmm", b, s, s, d) for b in (1, 12, 96) for s in (64, 128, 512, 2048)
                          for d in (64, 128)] + [gemm_node("bmm", b, s, d, s) for b in (1, 12, 96)
                                                 for s in (64, 128, 512, 2048) for d in (64, 128)],
        "conv": [conv_node(b, c, o, 3, s, 1, 1) for b in (1, 8, 32) for c in (3, 64, 256)
                 for o in (64, 256) for s in (7, 28, 56)],
        "ln": [kernel_alike_node("ln", r, w) for r in SIZES for w in (64, 768, 4096)],
        "softmax": [kernel_alike_node("softmax", r, w) for r in SIZES for w in (64, 1024, 8192)],
        "linear_bf16": [_bf16(gemm_node("linear", 1, m, n, k)) for m in SIZES for n in SIZES[2:]
                        for k in SIZES[2:]],
        "elementwise": [kernel_alike_node(op, r, w) for op in ("add", "gelu") for r in SIZES
                        for w in (64, 1024, 8192)],
        "bmm_bf16": [_bf16(gemm_node("bmm", b, s, s, d)) for b in (1, 12, 96) for s in (64, 128, 512, 2048)
                     for d in (64, 128)],
        "conv_bf16": [_bf16(conv_node(b, c, o, 3, s, 1, 1)) for b in (1, 8, 32) for c in (3, 64, 256)
                      for o in (64, 256) for s in (7, 28, 56)],
        "linear_tf32": [dataclasses.replace(gemm_node("linear", 1, m, n, k), tf32=True) for m in SIZES
                        for n in SIZES[2:] for k in SIZES[2:]],
        "sdpa_bf16": [_sdpa(b, s, d, causal, backward) for b in (1, 8, 64) for s in (128, 1024, 8192)
                      for d in (64, 128) for causal in (False, True) for backward in (False, True)],
        "batch_norm": [batch_norm_node((b, c, s, s), dtype, backward) for b in (1, 32, 256)
                       for c in (64, 512, 2048) for s in (7, 28, 112) if b * c * s * s < 2**31
                       for dtype in ("float32", "bfloat16") for backward in (False, True)],
        "max_pool": [_max_pool((b, c, s, s)) for b in (1, 32, 256) for c in (3, 64, 512)
                     for s in (7, 56, 224)],
    }  # fmt: skip


def _max_pool(x: tuple[int, int, int, int]) -> NodeCost:
    """ResNet's stem pooling (3 x 3 windows, stride 2, padding 1) over an fp32 input of shape ``x``."""
    out = (*x[:2], (x[2] - 1) // 2 + 1, (x[3] - 1) // 2 + 1)
    args = {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
            "ceil_mode": False}  # fmt: skip
    op = "aten.max_pool2d_with_indices.default"
    return synthetic_node(op, [x], [out, out], args, flops=9 * math.prod(out))


def _sdpa(batch: int, s: int, d: int, causal: bool, backward: bool, heads: int = 16) -> NodeCost:
    """A bf16 SDPA node as a CPU capture records it: each target prices the kernel it would run."""
    qkv = (batch, heads, s, d)
    op = "aten._scaled_dot_product_flash_attention_for_cpu" + ("_backward" if backward else "") + ".default"
    shapes = [qkv] * 5 + [qkv[:3]] if backward else [qkv] * 3  # grad, q, k, v, out, logsumexp
    dtypes = ["bfloat16"] * (len(shapes) - 1) + (["float32"] if backward else ["bfloat16"])
    out = [qkv] * (3 if backward else 1)
    return NodeCost(
        name="sdpa",
        op=op,
        phase="bw" if backward else "fw",
        in_shapes=shapes,
        in_dtypes=dtypes,
        out_shapes=out,
        out_dtypes=["bfloat16"] * len(out),
        args={"is_causal": causal},
    )


def _bf16(node: NodeCost) -> NodeCost:
    """``node`` with its tensors in bf16 (half the bytes)."""
    return dataclasses.replace(
        node, in_dtypes=["bfloat16"] * len(node.in_dtypes), out_dtypes=["bfloat16"] * len(node.out_dtypes),
        bytes_read=(node.bytes_read or 0) // 2, bytes_written=(node.bytes_written or 0) // 2,
        pred_ms={}, pred_source={},
    )  # fmt: skip


def stronger_pairs(devices: list[Device]) -> list[tuple[Device, Device]]:
    """(strong, weak) pairs of ``devices``: the first at least as strong as the second in every spec
    (:func:`fxcost.gpus.order.weaker_than`), not equal."""
    names = {d.name for d in devices}
    return [(a, b) for a in devices for b in weaker_than(a) if b.name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", help="directory of trained heads (default: the shipped ones)")
    args = parser.parse_args(argv)
    devices = comparable()
    pairs = stronger_pairs(devices)
    heads = Heads.load(args.heads) if args.heads else Heads()
    chain = [heads, Roofline()]
    print(f"{len(devices)} GPUs with every spec, {len(pairs)} (stronger, weaker) pairs")
    print(f"{'class':14s} {'comparisons':>11s} {'stronger slower':>15s} {'worst ratio':>11s}  worst pair")
    summary, total = [], 0
    for name, nodes in shapes().items():
        batch = NodeBatch.of(nodes)
        ms = {d.name: predict_batch(batch, chain, d)[0] for d in devices}
        ratios, worst = [], (1.0, "")
        for strong, weak in pairs:
            r = ms[strong.name] / ms[weak.name]
            r = r[np.isfinite(r)]
            ratios.append(r)
            if len(r) and r.max() > worst[0]:
                worst = (float(r.max()), f"{strong.name} vs {weak.name}")
        every = np.concatenate(ratios) if ratios else np.array([])
        pct = 100 * float((every > 1.001).mean()) if len(every) else 0.0
        total += len(every)
        print(f"{name:14s} {len(every):11d} {pct:14.2f}% {worst[0]:11.3f}  {worst[1]}")
        summary.append(f"{name}_order_violation_pct={pct:.2f}")
    print(" ".join(summary) + f" comparisons={total} gpu_pairs={len(pairs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
