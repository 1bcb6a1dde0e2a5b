"""``benchmarks/layout_transposes.py``: cuDNN's layout transposes matched to their tensors by grid,
and their rate read off the recorded kernels."""

from __future__ import annotations

import dataclasses

from fxcost.lowering.nodes import conv_node
from fxcost.records import KernelRecord


def test_transposes_are_matched_to_their_tensors_by_grid(load_script) -> None:
    script = load_script("benchmarks/layout_transposes.py")
    node = dataclasses.replace(
        conv_node(256, 256, 256, 3, 14, 1, 1), in_dtypes=["bfloat16"] * 2, out_dtypes=["bfloat16"]
    )
    x_bytes = 2 * 256 * 256 * 196 * 2  # read and written
    node.kernels = [
        KernelRecord("void cudnn::engines_precompiled::nchwToNhwcKernel<bf16>", 0.0265, (7, 8, 256)),
        KernelRecord("void cudnn::engines_precompiled::nchwToNhwcKernel<bf16>", 0.0048, (1, 8, 256)),
        KernelRecord("sm90_xmma_fprop_implicit_gemm_bf16", 0.0769, (132, 1, 1)),
        KernelRecord("void cudnn::engines_precompiled::nhwcToNchwKernel<bf16>", 0.0323, (7, 8, 256)),
        KernelRecord("void cudnn::engines_precompiled::nchwToNhwcKernel<bf16>", 0.01, (9, 9, 9)),  # no tensor
    ]
    found = script.transposes(node)
    # x and y (same shape here) by their grid (7, 8, 256); w [256, 256, 3, 3] by (1, 8, 256)
    assert found == [(x_bytes, 0.0265), (2 * 256 * 256 * 9 * 2, 0.0048), (x_bytes, 0.0323)]
    assert script.transposes(conv_node(8, 3, 8, 3, 8, 1, 1)) == []  # nothing recorded
    # 48 and 64 channels share a grid, (7, 2, 256): which tensor moved is not known, so neither counts
    ambiguous = dataclasses.replace(
        conv_node(256, 48, 64, 1, 14, 1, 0), in_dtypes=["bfloat16"] * 2, out_dtypes=["bfloat16"]
    )
    ambiguous.kernels = [KernelRecord("void cudnn::engines_precompiled::nchwToNhwcKernel", 0.01, (7, 2, 256))]
    assert script.transposes(ambiguous) == []


def test_the_script_reads_the_recorded_traces(load_script, capsys) -> None:
    script = load_script("benchmarks/layout_transposes.py")
    assert script.main([]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "transpose_tbps_h100_bfloat16=" in last and "model_tbps_h100=" in last
