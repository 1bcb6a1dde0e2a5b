"""The compiled step's pricing rules (fxcost.propagate.compiled): host launches, channels-last layouts."""

from __future__ import annotations

import numpy as np
import pytest

from fxcost.cost_models.eager import HOST_MS, MIN_KERNEL_MS
from fxcost.gpus import get_device
from fxcost.lowering.fusion import FusedKernel
from fxcost.propagate import Pipeline, compiled_timeline, fused_kernel_ms, node_kernel_ms
from fxcost.propagate.compiled import compiled_host_ms
from fxcost.records import KernelRecord, NodeCost

DEVICE = get_device("H100-SXM")


def _relu(i: int) -> NodeCost:
    return NodeCost(f"r{i}", "aten.relu.default", "fw", in_shapes=[[4]], in_dtypes=["float32"],
                    out_shapes=[[4]], out_dtypes=["float32"])  # fmt: skip


def test_a_compiled_kernel_costs_the_host_one_launch_not_an_eager_op() -> None:
    nodes = [_relu(i) for i in range(100)]
    kernels = [FusedKernel("pointwise", (i,), ((0,),), ((True,),)) for i in range(100)]
    tiny = np.full(100, 1e-4)
    slow_host = Pipeline(host_ms=0.05, fitted=True)  # an eager step's host time: Python and dispatch
    assert compiled_host_ms(slow_host) == HOST_MS
    end = compiled_timeline(nodes, kernels, tiny, slow_host)[-1].end_ms
    assert end == pytest.approx(100 * HOST_MS + 1e-4)  # the last kernel runs after the last launch
    fast_host = Pipeline(host_ms=0.004, fitted=True)  # the eager host was faster still: keep it
    end = compiled_timeline(nodes, kernels, tiny, fast_host)[-1].end_ms
    assert end == pytest.approx(100 * 0.004 + 1e-4)
    assert compiled_timeline(nodes, kernels, tiny, slow_host, host_ms=0.0)[-1].end_ms == pytest.approx(0.01)


def _conv() -> NodeCost:
    node = NodeCost("c", "aten.convolution.default", "fw", in_shapes=[[64, 64, 56, 56], [64, 64, 3, 3]],
                    in_dtypes=["bfloat16"] * 2, out_shapes=[[64, 64, 56, 56]], out_dtypes=["bfloat16"],
                    args={"groups": 1})  # fmt: skip
    node.kernels = [KernelRecord("void cudnn::engines_precompiled::nchwToNhwcKernel<bf16>", 0.2),
                    KernelRecord("sm90_xmma_fprop_implicit_gemm_bf16_nhwc", 0.5),
                    KernelRecord("void cudnn::engines_precompiled::nhwcToNchwKernel<bf16>", 0.1)]  # fmt: skip
    return node


def test_a_channels_last_convolution_drops_its_recorded_transposes_on_its_origin() -> None:
    nodes = [_conv()]
    assert node_kernel_ms(nodes, DEVICE, on_origin=True)[0] == pytest.approx(0.8)
    assert node_kernel_ms(nodes, DEVICE, on_origin=True, channels_last=True)[0] == pytest.approx(0.5)
    nodes[0].pred_ms[DEVICE.name] = 1.0
    off_origin = node_kernel_ms(nodes, DEVICE, on_origin=False)[0]
    # A prediction of a model not known to hold the transposes is kept.
    assert node_kernel_ms(nodes, DEVICE, on_origin=False, channels_last=True)[0] == off_origin


def test_a_channels_last_convolution_drops_its_transposes_on_another_gpu() -> None:
    conv = _conv()
    conv.pred_ms[DEVICE.name] = 1.0
    conv.pred_source[DEVICE.name] = "mlp_ratio"  # the recording scaled: it keeps the non-transpose share
    nchw = node_kernel_ms([conv], DEVICE)[0]
    assert node_kernel_ms([conv], DEVICE, channels_last=True)[0] == pytest.approx(nchw * 0.5 / 0.8)
    # Origin-free, the tensor-core model charges a 3x3 convolution's transposes; channels-last drops them.
    free = _conv()
    free.kernels, free.bytes_read, free.bytes_written = [], 2 * 64 * 64 * 56 * 56 * 2, 64 * 64 * 56 * 56 * 2
    free.pred_ms[DEVICE.name] = 1.0
    free.pred_source[DEVICE.name] = "mlp"
    moved = 2 * (2 * 64 * 64 * 56 * 56 + 64 * 64 * 3 * 3) * 2  # read and write x, y and the weight (bf16)
    expected = node_kernel_ms([free], DEVICE)[0] - moved / (DEVICE.bandwidth_gbps * 1e6)
    assert node_kernel_ms([free], DEVICE, channels_last=True)[0] == pytest.approx(expected, rel=0.01)


def test_a_batch_norm_is_not_held_to_its_nchw_kernel_when_channels_last() -> None:
    x = [256, 64, 56, 56]
    bn = NodeCost("bn", "aten._native_batch_norm_legit_functional.default", "fw",
                  in_shapes=[x, [64], [64], [64], [64]], in_dtypes=["bfloat16"] * 5,
                  out_shapes=[x, [64], [64], [64], [64]], out_dtypes=["bfloat16"] * 5,
                  flops=10 * 256 * 64 * 3136)  # fmt: skip
    kernel = FusedKernel("reduction", (0,), ((0,) * 5,), ((True,) * 5,))
    eager = np.array([50.0])  # ATen's NCHW batch-norm kernel, far slower than a pass over the data
    nchw = fused_kernel_ms([bn], [kernel], eager, DEVICE)[0]
    nhwc = fused_kernel_ms([bn], [kernel], eager, DEVICE, channels_last=True)[0]
    assert nchw == pytest.approx(50.0 + MIN_KERNEL_MS)  # and, split, its final reduction's kernel
    assert 0 < nhwc < 50.0


def test_a_fused_safe_softmax_is_held_to_its_softmax_not_its_eager_passes() -> None:
    """Eager runs SDPA's math-path softmax as five kernels; Inductor fuses the passes that zero masked
    rows into the softmax's, so the fused kernel's floor is the softmax alone."""
    from fxcost.lowering.row_ops import lower_safe_softmax

    x = [32, 16, 512, 512]
    safe = NodeCost("s", "aten._safe_softmax.default", "fw", in_shapes=[x], in_dtypes=["float32"],
                    out_shapes=[x], out_dtypes=["float32"], args={"dim": -1}, flops=5 * 32 * 16 * 512**2,
                    bytes_read=4 * 32 * 16 * 512**2, bytes_written=4 * 32 * 16 * 512**2)  # fmt: skip
    kernel = FusedKernel("reduction", (0,), ((0,),), ((True,),))
    eager = np.array([50.0])  # the five eager kernels, far slower than one pass
    fused = fused_kernel_ms([safe], [kernel], eager, DEVICE)[0]
    softmax = lower_safe_softmax(safe)[0][0]
    alone = fused_kernel_ms([softmax], [kernel], np.array([0.0]), DEVICE)[0]
    assert alone < fused < 50.0


def test_the_eager_kernel_scale_applies_only_where_l2_explains_it() -> None:
    nodes = [_relu(i) for i in range(2)]
    kernels = [FusedKernel("pointwise", (i,), ((0,),), ((True,),)) for i in range(2)]
    times = np.array([1.0, 1.0])
    explained = Pipeline(host_ms=0.0, kernel_scale=0.9, fitted=True)
    assert compiled_timeline(nodes, kernels, times, explained)[-1].end_ms == pytest.approx(1.8)
    other_graph = Pipeline(host_ms=0.0, kernel_scale=0.44, fitted=True, l2_explained=False)
    assert compiled_timeline(nodes, kernels, times, other_graph)[-1].end_ms == pytest.approx(2.0)


def test_repeated_kernels_are_priced_once_and_as_if_each_alone() -> None:
    from fxcost.propagate.compiled import kernel_work

    sizes = [4096, 1 << 24, 4096, 1 << 24, 4096]  # layers repeat their kernels
    nodes = [NodeCost(f"r{i}", "aten.relu.default", "fw", in_shapes=[[n]], in_dtypes=["float32"],
                      out_shapes=[[n]], out_dtypes=["float32"]) for i, n in enumerate(sizes)]  # fmt: skip
    kernels = [FusedKernel("pointwise", (i,), ((0,),), ((True,),)) for i in range(len(nodes))]
    eager = node_kernel_ms(nodes, DEVICE)
    work = kernel_work(nodes, kernels)
    assert len(work.distinct) == 2 and work.slot.tolist() == [0, 1, 0, 1, 0]
    together = fused_kernel_ms(nodes, kernels, eager, DEVICE, work=work)
    one = [FusedKernel("pointwise", (0,), ((0,),), ((True,),))]
    alone = [fused_kernel_ms([n], one, eager[i : i + 1], DEVICE)[0] for i, n in enumerate(nodes)]
    assert together.tolist() == pytest.approx(alone)
    assert together[1] > together[0]


def _batch_norm(training: bool) -> NodeCost:
    x = [256, 64, 56, 56]
    return NodeCost("bn", "aten._native_batch_norm_legit_functional.default", "fw",
                    in_shapes=[x, [64], [64], [64], [64]], in_dtypes=["bfloat16"] * 5,
                    out_shapes=[x, [64], [64], [64], [64]], out_dtypes=["bfloat16"] * 5,
                    args={"training": training})  # fmt: skip


def test_a_split_reduction_costs_the_host_three_launches_and_the_gpu_its_final_kernel() -> None:
    kernels = [FusedKernel("pointwise", (0,), ((0,),), ((True,),)),
               FusedKernel("reduction", (1,), ((0,) * 5,), ((True,) * 5,)),
               FusedKernel("pointwise", (2,), ((0,),), ((True,),))]  # fmt: skip
    nodes = [_relu(0), _batch_norm(True), _relu(2)]
    host = Pipeline(host_ms=1.0, fitted=True)
    spans = compiled_timeline(nodes, kernels, np.full(3, 1e-4), host, host_ms=1.0)
    assert [s.issued_ms for s in spans] == pytest.approx([1.0, 4.0, 5.0])
    assert [s.launches for s in spans] == [1, 3, 1]
    assert spans[-1].end_ms == pytest.approx(5.0 + 1e-4)
    # Its input read twice, and the final reduction's kernel: slower than the same batch norm unsplit.
    alone = [FusedKernel("reduction", (0,), ((0,) * 5,), ((True,) * 5,))]
    split, whole = (fused_kernel_ms([bn], alone, np.array([0.0]), DEVICE, channels_last=True)[0]
                    for bn in (nodes[1], _batch_norm(False)))  # fmt: skip
    assert split > 1.4 * whole


def test_replay_with_a_host_time_per_kernel_issues_each_after_the_host_spent_the_ones_before() -> None:
    from fxcost.propagate import replay_ends

    kernels = np.array([1.0, 0.1, 0.1])
    assert replay_ends(kernels, 0.5).tolist() == pytest.approx(replay_ends(kernels, np.full(3, 0.5)).tolist())
    assert replay_ends(kernels, np.array([0.5, 3.0, 0.5])).tolist() == pytest.approx([1.5, 3.6, 4.1])
