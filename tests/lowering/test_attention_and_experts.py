"""Fused attention and grouped MoE GEMMs: FLOPs counted; attention priced as the kernel PyTorch picks on
the target GPU (its tiles and waves, or the math path's GEMMs), MoE experts as the GEMMs they run."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import fxcost
from fxcost.cost_models import NodeBatch
from fxcost.cost_models.attention import (
    INT32_PER_CLOCK,
    MMA_SYNC_SHARE_SM90,
    _blocks_per_sm,
    attention_kind,
    fused_attention_ms,
)
from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads import LOWERED, Heads, default_heads, head_of
from fxcost.gpus import get_device
from fxcost.gpus.power import tensor_clock
from fxcost.lowering import count_flops, is_matmul_class
from fxcost.lowering.attention import (
    ATTENTION_BACKWARD_OPS,
    ATTENTION_OPS,
    AttentionCall,
    Backend,
    attention_call,
    attention_flops,
    choose_backend,
    lower_attention,
    priority,
)
from fxcost.lowering.attention_kernels import attention_work, fused_attention, kernel_head_dim, math_work
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
    backward = op in ATTENTION_BACKWARD_OPS
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


# -- the kernel the target GPU runs ------------------------------------------------------------------


def _call(dtype: str = "bfloat16", d: int = 64, masked: bool = False, causal: bool = False, s: int = 512,
          kv_heads: int = 8, backward: bool = False, recorded: Backend | None = None, batch: int = 2,
          dropout: float = 0.0) -> AttentionCall:  # fmt: skip
    return AttentionCall(batch, 8, kv_heads, s, s, d, d, dtype, causal, masked, dropout, backward, recorded)


@pytest.mark.parametrize(
    ("device", "call", "backend"),
    [
        ("H100-SXM", _call(), "flash"),
        ("A100-SXM4-40GB", _call("float16", d=128, causal=True), "flash"),
        ("H100-SXM", _call(d=256), "flash"),
        ("H100-SXM", _call(d=512), "efficient"),  # flash stops at head dim 256
        ("H100-SXM", _call(masked=True), "efficient"),  # flash takes no attention mask
        ("H100-SXM", _call("float32"), "efficient"),  # flash wants 16-bit inputs
        ("H100-SXM", _call("float32", kv_heads=2), "math"),  # efficient wants as many key heads as queries
        ("H100-SXM", _call(kv_heads=2), "flash"),  # flash runs grouped-query attention
        ("H100-SXM", _call(d=36), "flash"),  # flash pads the head dim to a multiple of 8
        ("V100-SXM2-16GB", _call("float16"), "efficient"),  # flash wants sm80
        ("V100-SXM2-16GB", _call("bfloat16"), "math"),  # no bf16 kernels before sm80
        ("T4", _call("float32", masked=True), "efficient"),
        ("RTX4090", _call(d=256, backward=True), "efficient"),  # sm89 flash backward stops at 192
        ("RTX4090", _call(d=256), "flash"),
        ("H100-SXM", _call(recorded="efficient"), "efficient"),  # a GPU capture's kernel is kept
        ("H100-SXM", _call(recorded="cudnn"), "cudnn"),
        ("V100-SXM2-16GB", _call("float16", recorded="flash"), "efficient"),  # unless the target can't run it
    ],
)
def test_backend_follows_pytorchs_selection(device: str, call: AttentionCall, backend: str) -> None:
    assert choose_backend(call, get_device(device), "2.7.1") == backend  # the default order


@pytest.mark.parametrize(
    ("device", "call", "version", "backend"),
    [
        ("H100-SXM", _call(), "2.11.0+cu130", "cudnn"),  # cuDNN first on sm90 from 2.8
        ("H100-SXM", _call(masked=True, dropout=0.1), "2.8.0", "cudnn"),  # HF's masked calls
        ("H100-SXM", _call(masked=True), "2.7.1", "efficient"),
        ("H100-SXM", _call(), "2.5.0", "cudnn"),  # 2.5.0 preferred it, 2.5.1 made it opt-in
        ("H100-SXM", _call(), "2.5.1", "flash"),
        ("H100-SXM", _call(d=256), "2.11.0", "flash"),  # cuDNN stops at head dim 128
        ("H100-SXM", _call("float32"), "2.11.0", "efficient"),  # cuDNN wants 16-bit inputs
        ("B200", _call(), "2.11.0", "cudnn"),
        ("A100-SXM4-40GB", _call(), "2.11.0", "flash"),  # only sm90 and sm100 prefer it
        ("H100-SXM", _call(recorded="flash"), "2.11.0", "flash"),  # a GPU capture's kernel is kept
    ],
)
def test_backend_follows_the_capture_torchs_order(
    device: str, call: AttentionCall, version: str, backend: str
) -> None:
    assert choose_backend(call, get_device(device), version) == backend


def test_priority_reads_the_running_torch_by_default() -> None:
    h100 = get_device("H100-SXM")
    assert priority(h100) == priority(h100, torch.__version__)
    assert priority(h100, "2.11.0")[0] == "cudnn" and priority(h100, "2.6.0")[-1] == "cudnn"


def _cudnn_backward_node(mask: bool) -> NodeCost:
    """A cuDNN backward as a GPU capture records it: the None nested-tensor offsets take no place."""
    qkv, lse = (4, 16, 256, 64), (4, 16, 256, 1)
    shapes = [qkv] * 5 + [lse, (), ()] + ([(4, 1, 256, 256)] if mask else [])
    dtypes = ["bfloat16"] * 5 + ["float32", "int64", "int64"] + (["bfloat16"] if mask else [])
    op = "aten._scaled_dot_product_cudnn_attention_backward.default"
    args = {"cum_seq_q": None, "cum_seq_k": None, "dropout_p": 0.0, "is_causal": False}
    return NodeCost(name="sdpa_bw", op=op, phase="bw", in_shapes=shapes, in_dtypes=dtypes,
                    out_shapes=[qkv] * 3, out_dtypes=["bfloat16"] * 3, args=args)  # fmt: skip


def test_the_cudnn_backward_reads_its_attention_bias() -> None:
    masked, plain = (attention_call(_cudnn_backward_node(m)) for m in (True, False))
    assert masked is not None and masked.masked and masked.backward and masked.recorded == "cudnn"
    assert masked.mask_bytes == 4 * 256 * 256 * 2  # broadcast over the heads: read once
    assert plain is not None and not plain.masked and plain.mask_bytes == 0


def test_an_additive_mask_costs_its_bytes_and_its_per_score_work() -> None:
    h100 = get_device("H100-SXM")
    for backward in (False, True):
        plain = _call(s=2048, backward=backward)
        masked = replace(plain, masked=True, mask_bytes=plain.batch * plain.sq * plain.sk * 2)
        for backend in ("cudnn", "efficient"):
            a, b = fused_attention(plain, backend), fused_attention(masked, backend)
            assert b.bytes_main == a.bytes_main + masked.mask_bytes
            ms_a, ms_b = fused_attention_ms(plain, a, h100), fused_attention_ms(masked, b, h100)
            assert ms_a is not None and ms_b is not None and ms_b > ms_a


def test_dropout_draws_its_keep_decisions_from_philox_on_the_integer_units() -> None:
    """Per score, the memory-efficient kernel's curand call (ten Philox rounds of eight integer
    instructions for four floats) and its float conversion, as cuDNN's are read; FlashAttention-2's
    seven rounds shared by sixteen byte-wide decisions: with nothing overlapped, each score the
    busiest SM walks adds that, forward and backward (which draws the same decisions again)."""
    device = _compute_bound()
    assert device.num_sms and device.boost_clock_mhz and device.fp32_tflops
    fp32 = device.fp32_tflops * 1e12 / (2 * device.num_sms * device.boost_clock_mhz * 1e6)  # per SM per clock
    capped = tensor_clock(device)
    clock = (capped.mhz if capped else device.boost_clock_mhz) * 1e6  # what a tensor-core kernel holds
    rounds_of_eight = 8
    curand = 10 * rounds_of_eight / 4 / INT32_PER_CLOCK + 1 / 16 + 4 / fp32  # + conversion, fp32 ops
    flash = (7 * rounds_of_eight / 16 + 1) / INT32_PER_CLOCK + 2 / fp32  # + byte compare, fp32 ops
    for backend, cycles in (("efficient", curand), ("cudnn", curand), ("flash", flash)):
        for backward in (False, True):
            call = _call(s=1024, backward=backward)
            fused = fused_attention(call, backend)
            plain, dropped = (fused_attention_ms(c, fused, device, serial=True)
                              for c in (call, replace(call, dropout=0.1)))  # fmt: skip
            slots = _blocks_per_sm(fused, device) * device.num_sms
            walked = fused.tiles_per_block
            busiest = max(math.ceil(fused.blocks / slots) * sum(walked) / len(walked), max(walked))
            added_ms = busiest * fused.scores_per_tile * cycles * slots / (device.num_sms * clock) * 1e3
            assert plain is not None and dropped is not None
            assert dropped - plain == pytest.approx(added_ms, rel=1e-9), (backend, backward)


def test_fused_attention_runs_at_the_sustained_tensor_rate() -> None:
    """cuDNN's wgmma at the rate the tensor-core GEMMs are priced at: a long call's time follows it."""
    h100 = get_device("H100-SXM")
    call = _call(s=4096, d=128)
    fused = fused_attention(call, "cudnn")
    peak = fused_attention_ms(call, fused, h100)  # no rate given: the spec peak (sustained at 700 W)
    half = fused_attention_ms(call, fused, h100, h100.bf16_tflops / 2)
    assert peak is not None and half is not None
    assert half == pytest.approx(2 * peak, rel=0.05)
    assert fused_attention_ms(call, fused, h100, h100.bf16_tflops) == pytest.approx(peak)
    capped = get_device("H100-SXM-96GB-HBM2e")  # 500 W: 0.71 of the peak, every unit at 1.31 GHz
    assert fused_attention_ms(call, fused, capped) == pytest.approx(peak / (500 / 700), rel=0.05)


def test_fp32_memory_efficient_attention_runs_three_tf32_products_per_product() -> None:
    """PyTorch's fp32 CUTLASS kernel (fmha_cutlassF_f32_aligned_64x128_rf_sm80 at head dim 128) issues
    3xTF32 mma.sync whatever allow_tf32 says: no faster than a third of Hopper's mma.sync TF32 rate."""
    h100 = get_device("H100-SXM")
    call = _call("float32", d=128, s=2048)
    fused = fused_attention(call, "efficient")
    assert (fused.block_rows, fused.tile, fused.warps) == (64, 128, 8)
    ms = fused_attention_ms(call, fused, h100)
    q = (call.batch, call.heads, call.sq, call.d)
    assert ms is not None and h100.tf32_tflops is not None
    assert ms >= attention_flops(q, q, q, False, False) / (h100.tf32_tflops * MMA_SYNC_SHARE_SM90 / 3 * 1e9)
    half = fused_attention_ms(_call("bfloat16", d=128, s=2048), fused_attention(_call(d=128, s=2048),
                              "efficient"), h100)  # fmt: skip
    # Products six times the bf16 kernel's (three TF32 products, TF32 at half the bf16 rate), the
    # softmax alike: the bf16 kernel's softmax share (at the 1.83 GHz tensor clock) keeps it under 6x.
    assert half is not None and ms > 3.5 * half


def test_causal_fused_attention_skips_the_tiles_above_the_diagonal() -> None:
    full, causal = (fused_attention(_call(s=4096, causal=c), "flash") for c in (False, True))
    assert sum(causal.tiles_per_block) / sum(full.tiles_per_block) == pytest.approx(0.5, abs=0.02)
    assert max(causal.tiles_per_block) == max(full.tiles_per_block)  # the last query block sees every key
    backward = fused_attention(_call(s=4096, causal=True, backward=True), "flash")
    assert backward.tiles_per_block[0] == max(backward.tiles_per_block)  # the first keys meet every query
    h100 = get_device("H100-SXM")
    times = [fused_attention_ms(c, fused_attention(c, "flash"), h100) for c in (_call(s=4096), _call(s=4096,
             causal=True))]  # fmt: skip
    assert 0.45 < times[1] / times[0] < 0.65  # half the work, the diagonal tiles in full


@pytest.mark.parametrize(
    ("backend", "dims"),
    [("flash", {64: 64, 72: 96, 80: 96, 96: 96, 100: 128, 256: 256}),
     ("cudnn", {32: 64, 64: 64, 80: 128, 96: 128, 128: 128, 192: 256}),
     ("efficient", {80: 80, 96: 96})],
)  # fmt: skip
def test_a_kernel_runs_its_products_over_the_head_dim_it_was_built_for(
    backend: Backend, dims: dict[int, int]
) -> None:
    for d, width in dims.items():
        assert kernel_head_dim(backend, d) == width
        padded, exact = (fused_attention(_call("bfloat16", d=x), backend) for x in (d, width))
        assert padded.flops_per_tile == exact.flops_per_tile  # the padded columns are multiplied too
        assert padded.bytes_main <= exact.bytes_main  # but only the head's own are read
    h100 = get_device("H100-SXM")
    calls = [_call("bfloat16", d=d) for d in (64, 80, 96, 128)]
    times = [fused_attention_ms(c, fused_attention(c, "cudnn"), h100) for c in calls]
    assert times[0] < times[1] and times[1:] == sorted(times[1:])  # never faster with a wider head


def test_fused_attention_is_never_faster_than_its_flops_or_bytes_allow() -> None:
    for name in ("H100-SXM", "A100-SXM4-40GB", "L4", "V100-SXM2-16GB"):
        device = get_device(name)
        for call in (_call(s=2048), _call(s=2048, backward=True), _call("float16", d=128, s=128),
                     _call(s=8192, causal=True, batch=1)):  # fmt: skip
            backend = choose_backend(call, device)
            if backend == "math":
                continue
            fused = fused_attention(call, backend)
            ms = fused_attention_ms(call, fused, device)
            peak = device.bf16_tflops if call.dtype == "bfloat16" else device.fp16_tflops
            q = (call.batch, call.heads, call.sq, call.d)
            flops = attention_flops(q, q, q, call.causal, call.backward)
            assert ms is not None and ms >= flops / (peak * 1e9)
            assert ms >= fused.bytes_main / (device.mem_bandwidth_gbps * 1e6)


def test_nothing_overlapped_is_the_slow_end_of_a_fused_kernel() -> None:
    """``serial``: every tile's GEMMs then its softmax, the main kernel's traffic (re-reads too) after
    its compute. Never faster than the overlapped price; for cuDNN's pipelined kernel, slower by about
    the softmax hidden under its GEMMs."""
    h100 = get_device("H100-SXM")
    masked = replace(_call(s=2048, d=128), masked=True, mask_bytes=4 * 2048 * 2048 * 2)
    for call in (_call(s=2048), _call(s=2048, backward=True), masked, _call("float32", s=1024)):
        for backend in ("cudnn", "efficient", "flash"):
            fused = fused_attention(call, backend)
            overlapped = fused_attention_ms(call, fused, h100)
            serial = fused_attention_ms(call, fused, h100, serial=True)
            assert overlapped is not None and serial is not None and serial >= overlapped, (call, backend)
            # The traffic adds to the compute: above the time of the bytes alone, re-reads included.
            assert serial > (fused.bytes_main + fused.reread_bytes) / (h100.mem_bandwidth_gbps * 1e6)
    fused = fused_attention(masked, "cudnn")
    overlapped, serial = (fused_attention_ms(masked, fused, h100, serial=s) for s in (False, True))
    assert overlapped is not None and serial is not None and serial > 1.5 * overlapped
    # Every re-read comes from DRAM, after the compute.
    unread = fused_attention_ms(masked, replace(fused, reread_bytes=0), h100, serial=True)
    assert fused.reread_bytes > 0 and unread is not None
    assert serial - unread == pytest.approx(fused.reread_bytes / (h100.mem_bandwidth_gbps * 1e6))


def test_a_grid_smaller_than_the_gpu_takes_one_blocks_time() -> None:
    """Waves: 1 to 8 sequences of 8 heads x 4 query blocks fill at most 256 of an H100's 264 slots."""
    h100 = get_device("H100-SXM")
    calls = [_call(batch=b) for b in (1, 8, 9)]
    ms = [fused_attention_ms(c, fused_attention(c, "flash"), h100) for c in calls]
    assert ms[0] == pytest.approx(ms[1], rel=0.01)
    assert ms[2] > 1.5 * ms[1]  # one block more than the slots: a second wave


def test_memory_efficient_backward_is_slower_than_flash() -> None:
    h100 = get_device("H100-SXM")
    call = _call(s=2048, backward=True)
    flash, efficient = (
        fused_attention_ms(call, fused_attention(call, b), h100) for b in ("flash", "efficient")
    )
    assert efficient > 1.3 * flash
    forward = _call(s=2048)
    hopper = fused_attention_ms(forward, fused_attention(forward, "cudnn"), h100)
    assert hopper < fused_attention_ms(forward, fused_attention(forward, "flash"), h100)  # wgmma, overlap


def test_cpu_captured_sdpa_is_priced_as_the_kernel_the_gpu_runs() -> None:
    """A CPU records its own flash kernel; an H100 runs FlashAttention-2 on bf16, a V100 the math path."""

    class Attention(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    shape = (4, 8, 1024, 64)
    inputs = [torch.randn(shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    report = fxcost.profile(Attention(), inputs, devices=["H100-SXM", "V100-SXM2-16GB"], measure=False)
    sdpa = [n for n in report.nodes if n.op in ATTENTION_OPS]
    assert {n.op.split(".")[1] for n in sdpa} == {
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
    h100, v100 = get_device("H100-SXM"), get_device("V100-SXM2-16GB")
    for node in sdpa:
        call = attention_call(node)
        assert call is not None and call.causal and not call.masked and call.dtype == "bfloat16"
        assert choose_backend(call, h100, "2.7.1") == "flash" and choose_backend(call, v100) == "math"
        backend = choose_backend(call, h100)  # the running torch's choice, which the prediction prices
        assert backend == priority(h100)[0]
        assert node.flops and node.flops > 0
        assert node.pred_source[h100.name] == "mlp" and node.pred_source[v100.name] == "mlp"
        ms = node.pred_ms[h100.name]
        assert ms is not None and ms >= node.flops / (h100.bf16_tflops * 1e9)
        sustained = default_heads().tiled.sustained_tflops(h100, attention_kind(call))
        kernel = fused_attention_ms(call, fused_attention(call, backend), h100, sustained)
        assert ms == pytest.approx(kernel + hidden_overhead_ms(h100))  # timed alone, as the heads predict
        # The math path writes S through memory: far slower than the fused kernel on the faster GPU.
        assert node.pred_ms[v100.name] > 3 * ms


def test_a_masked_call_reads_its_mask_and_runs_the_efficient_kernel() -> None:
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    q = torch.randn(2, 4, 64, 32, dtype=torch.float16)
    # The CPU kernel's mask follows its query, key and value among the tensor inputs.
    node = NodeCost(name="sdpa", op="aten._scaled_dot_product_flash_attention_for_cpu.default", phase="fw",
                    in_shapes=[tuple(q.shape)] * 3 + [tuple(mask.shape)],
                    in_dtypes=["float16"] * 3 + ["bool"],
                    args={"is_causal": False, "dropout_p": 0.0})  # fmt: skip
    call = attention_call(node)
    assert call is not None and call.masked
    assert choose_backend(call, get_device("A100-SXM4-40GB")) == "efficient"
    work = attention_work(node, get_device("V100-SXM2-16GB"))
    assert work is not None and work[0] == "efficient"
    math_path = math_work(replace(call, causal=False))
    assert sum(n.flops or 0 for n, _ in math_path if n.op == "aten.bmm.default") == attention_flops(
        (2, 4, 64, 32), (2, 4, 64, 32), (2, 4, 64, 32), False, False)  # fmt: skip


# -- cuDNN's persistent, pipelined kernel and the tiles' re-reads --------------------------------------


def _compute_bound(name: str = "H100-SXM") -> fxcost.gpus.Device:
    """The GPU with DRAM out of play, so that the tiles' schedule sets the time."""
    return replace(get_device(name), mem_bandwidth_gbps=1e9)


def test_a_cudnn_block_adds_its_pipelines_fill_once() -> None:
    """One query block per head, eight on every SM: n key tiles take n overlapped tiles plus one fill,
    so eight tiles cost less than eight times one, and no less than (8 + 1) / 2 times."""
    device = _compute_bound()
    assert device.num_sms is not None
    batch = device.num_sms  # 8 heads, one block each: eight blocks per SM
    one, eight = (replace(_call(s=128, batch=batch), sk=sk) for sk in (128, 1024))
    t_one, t_eight = (fused_attention_ms(c, fused_attention(c, "cudnn"), device) for c in (one, eight))
    assert t_one is not None and t_eight is not None
    assert 4.5 <= t_eight / t_one < 7.9  # (8 max + min) / (max + min), min <= max
    flash = [fused_attention_ms(c, fused_attention(c, "flash"), device) for c in (one, eight)]
    assert flash[0] is not None and flash[1] == pytest.approx(8 * flash[0], rel=0.01)  # no overlap, no fill


def test_only_the_cudnn_forward_hides_its_softmax_under_its_gemms() -> None:
    """FlashAttention-3's scheduled overlap is the forward pass's: with DRAM out of play, cuDNN's
    backward takes its GEMMs and softmax one after the other (its serial time), its forward less."""
    device = _compute_bound()
    for backward in (False, True):
        call = _call(s=2048, backward=backward)
        fused = fused_attention(call, "cudnn")
        overlapped, serial = (fused_attention_ms(call, fused, device, serial=s) for s in (False, True))
        assert overlapped is not None and serial is not None
        if backward:
            assert overlapped == pytest.approx(serial, rel=1e-4)  # serial adds its DRAM time, tiny here
        else:
            assert overlapped < 0.9 * serial


def test_the_cudnn_kernel_runs_one_block_per_sm() -> None:
    """Its launches are as many 384-thread blocks as SMs: one block beyond them is a second round."""
    device = _compute_bound()
    assert device.num_sms is not None
    calls = [replace(_call(s=128, batch=1), sk=8192, heads=h, kv_heads=h) for h in (device.num_sms,
             device.num_sms + 1)]  # one query block per head, each walking 64 key tiles  # fmt: skip
    full, over = (fused_attention_ms(c, fused_attention(c, "cudnn"), device) for c in calls)
    assert full is not None and over == pytest.approx(2 * full, rel=0.01)


def test_each_block_rereads_the_tiles_it_walks() -> None:
    forward = _call(s=2048, d=128, kv_heads=8)
    fused = fused_attention(forward, "cudnn")
    bh, blocks_per_head = forward.batch * forward.heads, len(fused.tiles_per_block)
    kv_head = forward.sk * (forward.d + forward.dv) * 2
    assert fused.reread_bytes == bh * (blocks_per_head - 1) * kv_head and fused.head_bytes == kv_head
    grouped = fused_attention(replace(forward, kv_heads=2), "cudnn")  # four query heads share a key head
    assert grouped.reread_bytes == bh * blocks_per_head * kv_head - forward.batch * 2 * kv_head
    causal = fused_attention(replace(forward, causal=True), "cudnn")
    assert causal.reread_bytes < 0.6 * fused.reread_bytes  # the skipped tiles are not loaded
    backward = fused_attention(replace(forward, backward=True), "cudnn")
    per_query = (forward.d + forward.dv) * 2 + 8 + forward.d * 4  # Q, dO, LSE, D; dQ's fp32 adds
    assert backward.reread_bytes == bh * (len(backward.tiles_per_block) - 1) * forward.sq * per_query


def test_a_mask_broadcast_over_the_heads_is_read_by_each() -> None:
    plain = _call(s=1024)
    mask = plain.batch * plain.sq * plain.sk * 2
    shared = replace(plain, masked=True, mask_bytes=mask)
    own = replace(plain, masked=True, mask_bytes=plain.heads * mask, mask_heads=plain.heads)
    base, a, b = (fused_attention(c, "cudnn") for c in (plain, shared, own))
    assert a.reread_bytes - base.reread_bytes == (plain.heads - 1) * mask
    assert b.reread_bytes == base.reread_bytes  # each head reads its own slice once
    assert a.batch_bytes == mask // plain.batch and b.batch_bytes == 0
    assert b.head_bytes == base.head_bytes + mask // plain.batch


def test_rereads_come_from_dram_once_the_resident_heads_overflow_l2() -> None:
    """Two heads of 64k keys at head dim 128 walk 32 MiB of K and V each: more than an H100's 50 MB L2
    holds, so every further query block loads its keys from DRAM; with an L2 that holds them, not."""
    h100 = get_device("H100-SXM")
    call = replace(_call(s=65536, d=128, batch=1), heads=2, kv_heads=2)
    fused = fused_attention(call, "cudnn")
    ms = fused_attention_ms(call, fused, h100)
    assert ms is not None and ms >= (fused.bytes_main + fused.reread_bytes) / (h100.mem_bandwidth_gbps * 1e6)
    for l2_mb in (None, 1e6):
        other = fused_attention_ms(call, fused, replace(h100, l2_cache_mb=l2_mb))
        assert other is not None and other < 0.8 * ms
    short = _call(s=2048, d=128)  # a few MB per head: re-read from L2, not priced
    short_fused = fused_attention(short, "cudnn")
    assert fused_attention_ms(short, short_fused, h100) == fused_attention_ms(
        short, short_fused, replace(h100, l2_cache_mb=None)
    )


def test_fused_attention_is_priced_in_gpu_order(load_script) -> None:
    """A GPU that beats another on every spec never prices a fused attention node slower, alone or as
    kernel time (small shapes, where the per-op overhead decides, included)."""
    import numpy as np

    from fxcost.cost_models.eager import hidden_overhead_ms
    from fxcost.cost_models.heads.model import Heads
    from fxcost.cost_models.interface import NodeBatch
    from fxcost.gpus.order import comparable, weaker_than

    sdpa = load_script("benchmarks/gpu_order.py")._sdpa
    nodes = [sdpa(b, s, 64, causal, backward) for b in (1, 8) for s in (128, 2048)
             for causal in (False, True) for backward in (False, True)]  # fmt: skip
    heads, batch = Heads(), NodeBatch.of(nodes)
    alone = {d.name: heads.predict(batch, d) for d in comparable()}
    for strong in comparable():
        for weak in weaker_than(strong):
            a, b = alone[strong.name], alone[weak.name]
            known = np.isfinite(a) & np.isfinite(b)
            assert (a[known] <= b[known] * (1 + 1e-9)).all(), (strong.name, weak.name)
            kernel_a = a[known] - hidden_overhead_ms(strong)
            kernel_b = b[known] - hidden_overhead_ms(weak)
            assert (kernel_a <= kernel_b * (1 + 1e-9) + 1e-12).all(), (strong.name, weak.name)


def test_flex_attention_is_priced_as_the_flash_kernel_its_triton_kernel_follows() -> None:
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(2, 8, 512, 64, dtype=torch.bfloat16)
    flex, sdpa = (
        fxcost.profile(f, (q,), train=False, devices=["A100-SXM4-80GB"])
        for f in (lambda x: flex_attention(x, x, x), lambda x: F.scaled_dot_product_attention(x, x, x))
    )
    (node,) = [n for n in flex.nodes if n.op == "torch.ops.higher_order.flex_attention"]
    assert node.has_kernel and is_matmul_class(node.op)
    assert node.flops == attention_flops(q.shape, q.shape, q.shape, causal=False, backward=False)  # dense
    (fused,) = [n for n in sdpa.nodes if n.op in ATTENTION_OPS]
    assert node.pred_ms["A100-SXM4-80GB"] == pytest.approx(fused.pred_ms["A100-SXM4-80GB"])  # both flash
    assert flex.coverage("A100-SXM4-80GB") == 1.0
    backward = NodeCost("bw", "torch.ops.higher_order.flex_attention_backward", "bw",
                        in_shapes=[(2, 8, 512, 64)] * 3 + [(2, 8, 512, 64), (2, 8, 512)],
                        in_dtypes=["bfloat16"] * 5)  # fmt: skip
    call = attention_call(backward)
    assert call is not None and (call.backward, call.recorded, call.sq, call.d) == (True, "flash", 512, 64)
