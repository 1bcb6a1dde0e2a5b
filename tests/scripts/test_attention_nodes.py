"""``benchmarks/attention_nodes.py`` on a CPU-captured SDPA trace: the kernel chosen per GPU, the
per-node and summed errors against recorded kernel times."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fxcost
from fxcost.cost_models.eager import kernel_ms
from fxcost.gpus import get_device
from fxcost.lowering.attention import ATTENTION_OPS
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
