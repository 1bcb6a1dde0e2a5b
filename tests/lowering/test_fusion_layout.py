"""Inductor's layout optimization read from node records (fxcost.lowering.fusion_layout)."""

from __future__ import annotations

from fxcost.lowering.fusion_layout import channels_last, layout_transpose_ms
from fxcost.records import KernelRecord, NodeCost


def _conv(weight: list[int], groups: int = 1, phase: str = "fw", graph: int = 0) -> NodeCost:
    x = [8, weight[1] * groups, 32, 32]
    return NodeCost(f"conv{weight}{groups}", "aten.convolution.default", phase, graph=graph,  # type: ignore[arg-type]
                    in_shapes=[x, weight], in_dtypes=["bfloat16"] * 2, out_shapes=[[8, weight[0], 32, 32]],
                    out_dtypes=["bfloat16"], args={"groups": groups}, flops=1000)  # fmt: skip


def _backward() -> NodeCost:
    return NodeCost("bw", "aten.convolution_backward.default", "bw", graph=1)


def test_a_resnet_like_training_step_runs_channels_last() -> None:
    nodes = [_conv([64, 3, 7, 7]), _conv([128, 64, 3, 3]), _conv([256, 128, 1, 1]), _backward()]
    assert channels_last(nodes)


def test_inductor_skips_layouts_its_rules_name() -> None:
    assert not channels_last([_backward()])  # no convolution
    assert not channels_last([_conv([64, 32, 3, 3]), _conv([32, 16, 3, 3]), _backward()])  # all small
    grouped = [_conv([256, 128, 3, 3]), _conv([256, 8, 3, 3], groups=32), _backward()]
    assert not channels_last(grouped)  # grouped with more than one input channel per group
    depthwise = [_conv([256, 128, 1, 1]), _conv([256, 1, 3, 3], groups=256), _backward()]
    assert channels_last(depthwise)  # depthwise convolutions keep it
    assert not channels_last([_conv([128, 256, 3, 3]), _backward()])  # twice as many inputs, 3x3
    assert channels_last([_conv([128, 256, 1, 1]), _backward()])  # ... but a 1x1 is fine
    sparse = [_conv([128, 64, 3, 3])] + [NodeCost(f"v{i}", "aten.view.default", "fw") for i in range(300)]
    assert not channels_last([*sparse, _backward()])  # few convolutions among many nodes


def test_inference_weighs_convolutions_by_flops() -> None:
    assert channels_last([_conv([128, 64, 3, 3])])  # a default convolution is faster channels-last
    assert not channels_last([_conv([256, 8, 3, 3], groups=32)])  # a grouped one is slower


def test_layout_transposes_are_the_conversion_kernels_only() -> None:
    node = _conv([128, 64, 3, 3])
    node.kernels = [KernelRecord("void cudnn::engines_precompiled::nchwToNhwcKernel<bf16>", 0.3),
                    KernelRecord("sm90_xmma_fprop_implicit_gemm_bf16_nhwc", 1.0),
                    KernelRecord("void cudnn::engines_precompiled::nhwcToNchwKernel<bf16>", 0.2)]  # fmt: skip
    assert layout_transpose_ms(node) == 0.5
    assert layout_transpose_ms(_conv([128, 64, 3, 3])) == 0
