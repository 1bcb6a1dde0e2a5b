"""``benchmarks/attention_nodes.py`` on a CPU-captured SDPA trace: the kernel chosen per GPU, the
per-node and summed errors against recorded kernel times."""

from __future__ import annotations

import csv

import torch
import torch.nn.functional as F

import fxcost
from fxcost.cost_models.attention import fused_attention_ms
from fxcost.cost_models.eager import kernel_ms
from fxcost.cost_models.heads import default_heads
from fxcost.gpus import get_device
from fxcost.lowering.attention import ATTENTION_OPS
from fxcost.lowering.attention_kernels import fused_attention
from fxcost.records import KernelRecord


class _Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_attention_nodes_compares_sdpa_nodes_with_their_kernels(load_script, tmp_path, capsys) -> None:
    inputs = [torch.randn(2, 4, 256, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    report = fxcost.profile(_Attention(), inputs, devices=["H100-SXM"], measure=False)
    report.save(tmp_path / "cpu" / "sdpa.json.gz")
    script = load_script("benchmarks/attention_nodes.py")
    assert script.main(["--fixtures", str(tmp_path / "cpu"), "--device", "H100-SXM"]) == 0
    out = capsys.readouterr().out
    assert "flash" in out and out.strip().splitlines()[-1].endswith("sdpa_nodes=0")
    # As if recorded on an H100: every SDPA node's kernels timed at twice the predicted kernel time.
    h100 = get_device("H100-SXM")
    for node, guess in zip(report.nodes, report.predict([h100]).nodes, strict=True):
        if node.op in ATTENTION_OPS:
            ms = kernel_ms(guess.pred_ms[h100.name], guess.pred_source[h100.name], h100)
            node.kernels = [KernelRecord(name="flash_fwd_kernel", duration_ms=2 * ms)]
    report.origin = "NVIDIA H100 80GB HBM3"
    report.save(tmp_path / "gpu" / "sdpa.json.gz")
    assert script.main(["--fixtures", str(tmp_path / "gpu")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(item.split("=") for item in last.split())
    assert fields["sdpa_nodes"] == "2"
    assert float(fields["sdpa_node_median_err"]) == 50.0
    assert float(fields["sdpa_sum_err"]) == -50.0
    # Recorded at the predicted kernel time, every node lies inside both intervals; at 100 times it,
    # inside neither.
    for factor, covered in ((1.0, "1.00"), (100.0, "0.00")):
        for node, guess in zip(report.nodes, report.predict([h100]).nodes, strict=True):
            if node.op in ATTENTION_OPS:
                ms = kernel_ms(guess.pred_ms[h100.name], guess.pred_source[h100.name], h100)
                node.kernels = [KernelRecord(name="flash_fwd_kernel", duration_ms=factor * ms)]
        report.save(tmp_path / "gpu" / "sdpa.json.gz")
        assert script.main(["--fixtures", str(tmp_path / "gpu")]) == 0
        last = capsys.readouterr().out.strip().splitlines()[-1]
        fields = dict(item.split("=") for item in last.split())
        assert fields["sdpa_interval_coverage"] == fields["sdpa_bmm_interval_coverage"] == covered


def test_attention_nodes_reads_the_collect_sweeps(load_script, tmp_path, capsys) -> None:
    """A sweep row is priced as the kernel it ran (cuDNN here), the error against its latency."""
    script = load_script("benchmarks/attention_nodes.py")
    h100 = get_device("H100-SXM")
    row = {"OPName": "sdpa", "Device": "NVIDIA H100 80GB HBM3", "Torch Version": "p2.11.0",
           "Kernel Name": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "Kernels": "",
           "B": "4", "H": "16", "S_q": "1024", "S_k": "1024", "D": "128", "causal": "0",
           "Precision": "bf16"}  # fmt: skip
    call = script.sweep_call(row)
    assert call.recorded == "cudnn" and call.dtype == "bfloat16" and not call.causal and not call.backward
    sustained = default_heads().tiled.sustained_tflops(h100, "bfloat16")
    ms = fused_attention_ms(call, fused_attention(call, "cudnn"), h100, sustained)
    assert ms is not None
    folder = tmp_path / "NVIDIA_H100_80GB_HBM3" / "collect" / "bf16" / "ops" / "sdpa"
    folder.mkdir(parents=True)
    with (folder / "NVIDIA_H100_80GB_HBM3.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*row, "Latency"])
        writer.writeheader()
        writer.writerow({**row, "Latency": str(ms / 2)})  # recorded twice as fast as predicted
        fp32 = {**row, "Precision": "", "Kernel Name": "fmha_cutlassF_f32_aligned_64x128_rf_sm80"}
        assert script.sweep_call(fp32).dtype == "float32" and script.sweep_call(fp32).recorded == "efficient"
    assert script.main(["--fixtures", str(tmp_path), "--sweeps"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    fields = dict(item.split("=") for item in lines[-2].split())
    # Below the low end (x0.73 of the price, the bmm class's) of either interval.
    assert fields == {"sweep_median_err": "100.0", "sweep_sum_err": "100.0",
                      "sweep_interval_coverage": "0.00", "sweep_bmm_interval_coverage": "0.00",
                      "sweep_rows": "1"}  # fmt: skip
