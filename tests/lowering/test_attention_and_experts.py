"""Fused attention and grouped MoE GEMMs: FLOPs counted, lowered to the GEMMs they run, priced by the
GEMM heads (never faster than the FLOPs allow at the GPU's fp32 peak)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fxcost
from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import LOWERED, Heads, head_of
from fxcost.gpus import get_device
from fxcost.lowering import count_flops, is_matmul_class
from fxcost.lowering.attention import ATTENTION_OPS, attention_flops, lower_attention
from fxcost.lowering.experts import grouped_mm_flops, lower_grouped_mm
from fxcost.records import NodeCost

aten = torch.ops.aten
B, H, SQ, SK, D = 2, 3, 10, 12, 8


def _sdpa_node(op: str, causal: bool, dtype: str = "float32") -> NodeCost:
    q, kv = (B, H, SQ, D), (B, H, SK, D)
    shapes = [(B, H, SQ, D), q, kv, kv] if op.endswith("backward.default") else [q, kv, kv]
    return NodeCost(name="sdpa", op=op, phase="fw", in_shapes=shapes, in_dtypes=[dtype] * len(shapes),
                    out_shapes=[q], out_dtypes=[dtype], args={"is_causal": causal})  # fmt: skip


def test_attention_flops_are_two_gemms_forward_and_five_backward() -> None:
    q, k = torch.empty(B, H, SQ, D), torch.empty(B, H, SK, D)
    out = (torch.empty(B, H, SQ, D), torch.empty(B, H, SQ))
    forward = aten._scaled_dot_product_flash_attention_for_cpu.default
    assert count_flops(forward, (q, k, k), {}, out) == 4 * B * H * SQ * SK * D
    assert count_flops(forward, (q, k, k, 0.0, True), {}, out) == 2 * B * H * SQ * SK * D  # causal: half
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    grads = (q, k, k)
    args = (q, q, k, k, q, out[1], 0.0, False)
    assert count_flops(backward, args, {}, grads) == 10 * B * H * SQ * SK * D  # 2.5x the forward
    # PyTorch's own formula of the GPU kernels ignores the causal mask; fxcost's replaces it.
    efficient = aten._scaled_dot_product_efficient_attention.default
    assert count_flops(efficient, (q, k, k, None, False), {"is_causal": True}, out) == 2 * B * H * SQ * SK * D
    # Values of another width: 2·Sq·Sk·D for the scores, 2·Sq·Sk·Dv for the output.
    assert attention_flops((1, 1, 4, 8), (1, 1, 6, 8), (1, 1, 6, 16), False, False) == 2 * 4 * 6 * (8 + 16)


@pytest.mark.parametrize("op", sorted(ATTENTION_OPS))
def test_every_attention_op_is_matmul_class_and_lowered(op: str) -> None:
    assert is_matmul_class(op)
    node = _sdpa_node(op, causal=False)
    assert head_of(node) == LOWERED
    work = lower_attention(node)
    assert all(n.op == "aten.bmm.default" and count == 1 for n, count in work)
    flops = sum(n.flops or 0 for n, _ in work)
    backward = op.endswith("backward.default")
    assert len(work) == (5 if backward else 2)
    assert flops == attention_flops((B, H, SQ, D), (B, H, SK, D), (B, H, SK, D), False, backward)


def test_causal_attention_runs_the_gemms_over_half_the_keys() -> None:
    op = "aten._scaled_dot_product_flash_attention.default"
    full, causal = lower_attention(_sdpa_node(op, False)), lower_attention(_sdpa_node(op, True))
    assert [n.in_shapes for n, _ in full] == [[(6, 10, 8), (6, 8, 12)], [(6, 10, 12), (6, 12, 8)]]
    assert [n.in_shapes for n, _ in causal] == [[(6, 10, 8), (6, 8, 6)], [(6, 10, 6), (6, 6, 8)]]
    # At a size where GEMM work shows (GPT-2 small's attention at 1,024 tokens), a causal mask saves.
    q = (8, 12, 1024, 64)
    nodes = [NodeCost(name="sdpa", op=op, phase="fw", in_shapes=[q, q, q], in_dtypes=["float32"] * 3,
                      out_shapes=[q], out_dtypes=["float32"], args={"is_causal": causal})
             for causal in (False, True)]  # fmt: skip
    fw_full, fw_causal = Heads().predict(NodeBatch.of(nodes), get_device("T4"))
    assert 0 < fw_causal < fw_full


def test_attention_keeps_its_dtype_in_the_gemms() -> None:
    work = lower_attention(_sdpa_node("aten._scaled_dot_product_flash_attention.default", False, "bfloat16"))
    assert {d for n, _ in work for d in (*n.in_dtypes, *n.out_dtypes)} == {"bfloat16"}


def test_captured_sdpa_is_priced_as_its_gemms() -> None:
    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(D * H, 3 * D * H)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).view(B, SQ, 3, H, D).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    report = fxcost.profile(Attention(), (torch.randn(B, SQ, D * H),), devices=["H100-SXM"], measure=False)
    sdpa = [n for n in report.nodes if n.op in ATTENTION_OPS]
    assert {n.phase for n in sdpa} == {"fw", "bw"}
    for node in sdpa:
        backward = node.phase == "bw"
        full = attention_flops((B, H, SQ, D), (B, H, SQ, D), (B, H, SQ, D), False, backward)
        assert node.flops == full // 2
        assert node.pred_source["H100-SXM"] == "mlp" and node.pred_ms["H100-SXM"] > 0


# -- grouped GEMMs of mixture-of-experts layers ----------------------------------------------------


def _grouped(op: str, rows: int, k: int, n: int, experts: int) -> NodeCost:
    x, w, offs = (rows, k), (experts, k, n), (experts,)
    backward = op.endswith("backward.default")
    ins = [x, w, offs, (rows, n)] if backward else [x, w, offs]
    outs = [x, w] if backward else [(rows, n)]
    dtypes = ["float32", "float32", "int64", "float32"][: len(ins)]
    flops = grouped_mm_flops(rows, k, n, backward)
    read = sum(math.prod(s) * 4 for s in ins)
    return NodeCost(name="experts", op=op, phase="bw" if backward else "fw", in_shapes=ins, in_dtypes=dtypes,
                    out_shapes=outs, out_dtypes=["float32"] * len(outs), flops=flops, bytes_read=read,
                    bytes_written=sum(math.prod(s) * 4 for s in outs))  # fmt: skip


def test_grouped_mm_is_one_gemm_per_expert_on_balanced_rows() -> None:
    forward = _grouped("transformers.grouped_mm_fallback.default", rows=40, k=16, n=24, experts=4)
    fill, (gemm, count) = lower_grouped_mm(forward)
    assert gemm.in_shapes == [(10, 16), (16, 24)] and count == 4
    assert fill[0].bytes == 40 * 24 * 4  # the zero-filled output
    assert gemm.flops * count == forward.flops == 2 * 40 * 16 * 24
    backward = _grouped("transformers.grouped_mm_fallback_backward.default", rows=40, k=16, n=24, experts=4)
    _, (grad_input, n1), (grad_weight, n2) = lower_grouped_mm(backward)
    assert grad_input.in_shapes == [(10, 24), (24, 16)] and grad_weight.in_shapes == [(16, 10), (10, 24)]
    assert grad_input.flops * n1 + grad_weight.flops * n2 == backward.flops == 4 * 40 * 16 * 24


def test_mixtral_style_layer_is_no_faster_than_its_flops_at_the_fp32_peak() -> None:
    """8 experts, 2,048 tokens routed to 2 each, hidden 1,024, intermediate 3,584: 90 GFLOP forward."""
    rows, hidden, inter = 2 * 2048, 1024, 3584
    op = "transformers.grouped_mm_fallback.default"
    gate_up, down = _grouped(op, rows, hidden, 2 * inter, 8), _grouped(op, rows, inter, hidden, 8)
    flops = gate_up.flops + down.flops
    assert flops == pytest.approx(90.2e9, rel=1e-3)
    h100 = get_device("H100-SXM")
    fxcost.cost_models.predict([gate_up, down], [h100])
    assert {gate_up.pred_source[h100.name], down.pred_source[h100.name]} == {"mlp"}
    ms = gate_up.pred_ms[h100.name] + down.pred_ms[h100.name]
    assert ms >= flops / (h100.fp32_tflops * 1e12) * 1e3  # 1.35 ms: the old roofline said 0.17


def test_grouped_mm_of_an_unknown_layout_is_not_lowered() -> None:
    odd = _grouped("aten._grouped_mm.default", rows=8, k=4, n=4, experts=2)
    odd.in_shapes[0] = (2, 4, 4)  # 3-D by 3-D: a batched layout the lowering does not read
    assert lower_grouped_mm(odd) == []
