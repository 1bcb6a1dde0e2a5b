"""The tensor-core model: bf16/fp16/TF32 GEMMs and convolutions priced by tiles, waves and rates."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads import Heads, default_heads
from fxcost.cost_models.heads.sustained import shipped_gemm_fit
from fxcost.cost_models.heads.tensor_core import TiledGemms, tensor_peak_tflops
from fxcost.cost_models.heads.tensor_work import (
    load_share,
    tensor_kind,
    tensor_work,
    work_kind,
)
from fxcost.cost_models.heads.tiling import pass_ms
from fxcost.cost_models.interface import NodeBatch
from fxcost.cost_models.roofline import LAUNCH_FLOOR_MS
from fxcost.gpus import get_device
from fxcost.gpus.order import comparable, stronger_than, weaker_than
from fxcost.lowering.nodes import conv_node, gemm_node
from fxcost.records import NodeCost


def _typed(node: NodeCost, dtype: str) -> NodeCost:
    """``node`` with its tensors in ``dtype`` (bytes scaled to the element size)."""
    scale = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    return dataclasses.replace(
        node, in_dtypes=[dtype] * len(node.in_dtypes), out_dtypes=[dtype] * len(node.out_dtypes),
        bytes_read=(node.bytes_read or 0) * scale // 4, bytes_written=(node.bytes_written or 0) * scale // 4,
    )  # fmt: skip


def _gemm(m: int, n: int, k: int, dtype: str = "bfloat16", batch: int = 1) -> NodeCost:
    return _typed(gemm_node("bmm" if batch > 1 else "linear", batch, m, n, k), dtype)


def _kernel_ms(nodes: list[NodeCost], device: str) -> np.ndarray:
    """The heads' isolated predictions less the per-op overhead an eager step hides: kernel times."""
    gpu = get_device(device)
    return default_heads().predict(NodeBatch.of(nodes), gpu) - hidden_overhead_ms(gpu)


def test_which_nodes_run_on_tensor_cores() -> None:
    assert tensor_kind(_gemm(64, 64, 64)) == "bfloat16"
    assert tensor_kind(_gemm(64, 64, 64, "float16")) == "float16"
    fp32 = _gemm(64, 64, 64, "float32")
    assert tensor_kind(fp32) is None
    assert work_kind(fp32) == "float32"  # CUDA cores: the fp32 tiles
    assert tensor_kind(dataclasses.replace(fp32, tf32=True)) == "tf32"
    assert work_kind(conv_node(8, 64, 64, 3, 28, 1, 1)) is None  # an fp32 convolution: the conv head
    relu = NodeCost(name="relu", op="aten.relu.default", phase="fw", in_shapes=[(4,)], in_dtypes=["bfloat16"])
    assert tensor_kind(relu) is None


def test_a_bf16_gemm_is_never_faster_than_its_bound() -> None:
    h100 = get_device("H100-SXM")
    nodes = [_gemm(m, n, k) for m in (8, 1000, 4096, 16384) for n in (64, 768, 8192) for k in (64, 3072)]
    ms = _kernel_ms(nodes, "H100-SXM")
    flops = np.array([n.flops for n in nodes], dtype=float)
    nbytes = np.array([n.bytes for n in nodes], dtype=float)
    bound = np.maximum(flops / (h100.bf16_tflops * 1e9), nbytes / (h100.mem_bandwidth_gbps * 1e6))
    assert np.all(ms >= bound)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_monotone_in_each_dim(axis: int) -> None:
    sizes = [8 * s for s in range(1, 200, 7)] + [4096, 8192, 16384]
    for other in (64, 1024, 4096):
        nodes = []
        for s in sizes:
            dims = [other, other, other]
            dims[axis] = s
            nodes.append(_gemm(*dims))
        for gpu in ("H100-SXM", "A100-SXM4-40GB", "L4"):
            ms = _kernel_ms(nodes, gpu)
            assert np.all(np.diff(ms) >= -1e-12), (axis, other, gpu)


def test_doubling_any_dim_never_predicts_faster() -> None:
    """Alignment may make a padded dim faster than an odd one, but never a doubled one."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        m, n, k = (int(x) for x in rng.integers(1, 5000, size=3))
        axis = int(rng.integers(0, 3))
        doubled = [m, n, k]
        doubled[axis] *= 2
        ms = _kernel_ms([_gemm(m, n, k), _gemm(*doubled)], "H100-SXM")
        assert ms[1] >= ms[0] * (1 - 1e-9), (m, n, k, axis)


def test_a_stronger_gpu_is_never_predicted_slower() -> None:
    """Kernel times (what an eager step runs) keep GPU order; see ``eager.hidden_overhead_ms``."""
    nodes = [_gemm(m, n, k) for m in (7, 512, 4096) for n in (64, 768, 50257) for k in (64, 3072)]
    nodes += [_typed(conv_node(b, c, 64, 3, 28, 1, 1), "bfloat16") for b in (1, 32) for c in (3, 64)]
    batch = NodeBatch.of(nodes)
    heads = default_heads()
    for name in ("H100-SXM", "A100-SXM4-80GB", "L40S"):
        strong = get_device(name)
        ms = heads.predict(batch, strong) - hidden_overhead_ms(strong)
        for weak in weaker_than(strong):
            theirs = heads.predict(batch, weak) - hidden_overhead_ms(weak)
            ok = ~np.isfinite(theirs) | (ms <= theirs * (1 + 1e-9))
            assert ok.all(), (strong.name, weak.name)


def test_bf16_beats_fp32_on_a_large_gemm_but_not_by_more_than_the_peaks() -> None:
    for name in ("H100-SXM", "A100-SXM4-40GB", "L4", "RTX4090"):
        gpu = get_device(name)
        bf16, fp32 = _kernel_ms([_gemm(8192, 8192, 8192), _gemm(8192, 8192, 8192, "float32")], name)
        assert bf16 < fp32 / 1.5, name
        # At most the peaks' ratio (both run at the GPU's sustained share of their peak), give or take
        # the 1% the fp32 tiles spend outside their main loop on a K of 8192.
        assert fp32 / bf16 < 1.01 * gpu.bf16_tflops / gpu.fp32_tflops, name


def test_tiny_gemms_take_the_launch_floor() -> None:
    tiny = [_gemm(8, 8, 8), _gemm(16, 64, 32), _gemm(1, 128, 64, batch=4)]
    cores = default_heads().tiled
    works = [tensor_work(n) for n in tiny]
    assert all(w is not None for w in works)
    ms = cores.kernel_ms(works, get_device("H100-SXM"))  # type: ignore[arg-type]
    assert np.allclose(ms, LAUNCH_FLOOR_MS)


def test_tf32_follows_the_flag() -> None:
    fp32 = _gemm(4096, 4096, 4096, "float32")
    tf32 = dataclasses.replace(fp32, tf32=True)
    on_a100 = _kernel_ms([fp32, tf32], "A100-SXM4-40GB")
    assert on_a100[1] < on_a100[0] / 2  # TF32 tensor cores: 156 against 19.5 TFLOP/s at peak
    on_v100 = _kernel_ms([fp32, tf32], "V100-SXM2-16GB")  # no TF32: CUDA cores either way
    assert on_v100[1] == pytest.approx(on_v100[0])


def test_fp32_gemms_run_the_cuda_core_tiles_and_fp32_convolutions_the_conv_head() -> None:
    gemm, conv = _gemm(1000, 768, 3072, "float32"), conv_node(8, 64, 64, 3, 28, 1, 1)
    heads = default_heads()
    for name in ("H100-SXM", "T4"):
        gpu = get_device(name)
        ms = heads.predict(NodeBatch.of([gemm, conv]), gpu)
        work = tensor_work(gemm)
        assert work is not None and work.kind == "float32"
        assert ms[0] == pytest.approx(heads.tiled.predict([work], gpu)[0])
        assert ms[1] == heads._predict_heads(NodeBatch.of([conv]), gpu)[0]
        assert np.isnan(heads._predict_heads(NodeBatch.of([gemm]), gpu)[0])  # no MLP for GEMMs


def test_a_gpu_without_bf16_tensor_cores_runs_it_at_its_fp32_rate() -> None:
    v100 = get_device("V100-SXM2-16GB")
    assert tensor_peak_tflops(v100, "bfloat16") == v100.fp32_tflops
    assert tensor_peak_tflops(v100, "float16") == v100.fp16_tflops
    assert tensor_peak_tflops(v100, "tf32") is None
    bf16, fp16 = _kernel_ms([_gemm(4096, 4096, 4096), _gemm(4096, 4096, 4096, "float16")], "V100-SXM2-16GB")
    assert bf16 > 4 * fp16


def test_a_calibrated_dot_rate_sets_the_sustained_rate(tmp_path, fresh_database) -> None:
    node = _gemm(8192, 8192, 8192)
    before = Heads(default_heads().heads).predict(NodeBatch.of([node]), get_device("H100-SXM"))[0]
    path = tmp_path / "h100.yaml"
    path.write_text("H100-SXM:\n  dot_bf16_tflops: 250.0\n")
    fresh_database.load_devices(path)
    h100 = get_device("H100-SXM")
    assert h100.dot_bf16_tflops == 250.0
    assert TiledGemms(shipped_gemm_fit()).sustained_tflops(h100, "bfloat16") == 250.0
    after = Heads(default_heads().heads).predict(NodeBatch.of([node]), h100)[0]
    flops = 2 * 8192**3
    assert after > before
    assert after - hidden_overhead_ms(h100) == pytest.approx(flops / 250e9, rel=0.05)


def test_misaligned_dims_load_narrower_and_run_slower() -> None:
    assert load_share(768, 2) == 1.0
    assert load_share(30522, 2) == pytest.approx(4 / 16)  # even, not a multiple of 4: 4-byte loads
    assert load_share(50257, 2) == pytest.approx(2 / 16)  # odd: one element per load
    odd, padded = _kernel_ms([_gemm(4096, 50257, 768), _gemm(4096, 50304, 768)], "H100-SXM")
    assert odd > 4 * padded


def test_convolutions_run_as_implicit_gemms_with_layout_transposes() -> None:
    three = tensor_work(_typed(conv_node(32, 64, 64, 3, 56, 1, 1), "bfloat16"))
    assert three is not None
    assert three.gemms == ((1, 32 * 56 * 56, 64, 64 * 9),)
    assert len(three.passes) == 3  # input and filter to NHWC, output back to NCHW
    one = tensor_work(_typed(conv_node(32, 64, 256, 1, 56, 1, 0), "bfloat16"))
    assert one is not None
    assert one.gemms == () and one.passes == ()  # its one GEMM the faster of two ways, below
    assert one.choices[0][0].gemms == ((32, 256, 56 * 56, 64),)  # per image, the pixels leading
    padded = tensor_work(_typed(conv_node(32, 3, 64, 7, 224, 2, 3), "bfloat16"))
    assert padded is not None and padded.gemms[0][3] == 8 * 49  # 3 channels padded to 16 bytes
    convs = [_typed(conv_node(32, 64, 64, 3, 56, 1, 1), t) for t in ("bfloat16", "float32")]
    ms = _kernel_ms(convs, "H100-SXM")
    assert ms[0] < ms[1]


def test_a_1x1_convolution_runs_per_image_or_transposed_whichever_is_faster() -> None:
    """ResNet-50's last stage (7x7 maps: 49 pixels, one-element loads per image) ran on the H100 as the
    implicit GEMM on transposed tensors, its 14x14 maps (196 pixels) and 56x56 ones per image. Each
    gradient is priced at its fastest way."""
    h100 = get_device("H100-SXM")
    cores = default_heads().tiled
    for size, transposed in ((7, True), (14, False), (56, False)):
        work = tensor_work(_typed(conv_node(256, 512, 2048, 1, size, 1, 0), "bfloat16"))
        assert work is not None and work.gemms == () and len(work.choices) == 1
        per_image, implicit = work.choices[0]
        assert per_image.passes == () and len(implicit.passes) == 2  # x in, y out; a 1x1 filter as it is
        ways = cores.kernel_ms([per_image, implicit], h100)
        assert cores.kernel_ms([work], h100)[0] == pytest.approx(ways.min())
        assert (ways[1] < ways[0]) == transposed
    works = [tensor_work(_conv_backward(64, 1024, 256, size)) for size in (7, 14, 28)]
    assert [len(w.choices) for w in works if w is not None] == [2, 2, 2]  # each gradient either way
    assert works[0] is not None and works[0].passes == (64 * 256 * 49 * 2,)  # the bias gradient's pass
    together = cores.kernel_ms(works, h100)  # several works' ways in one table
    for work, ms in zip(works, together, strict=True):
        assert work is not None
        fastest = sum(cores.kernel_ms(list(ways), h100).min() for ways in work.choices)
        bias = cores.kernel_ms([replace(work, choices=())], h100)[0]
        assert ms == pytest.approx(bias + fastest)


def _conv_backward(batch: int, c_in: int, c_out: int, size: int) -> NodeCost:
    """A bf16 1x1 convolution's backward, every gradient asked for."""
    return replace(
        _typed(conv_node(batch, c_in, c_out, 1, size, 1, 0), "bfloat16"),
        op="aten.convolution_backward.default",
        in_shapes=[(batch, c_out, size, size), (batch, c_in, size, size), (c_out, c_in, 1, 1)],
        args={"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "transposed": False, "groups": 1,
              "output_mask": [True, True, True]},
    )  # fmt: skip


def test_channels_last_saves_the_transposes_and_prices_a_1x1_convolution_as_one_gemm() -> None:
    h100, p4 = get_device("H100-SXM"), get_device("P4")
    cores = default_heads().tiled
    three = _typed(conv_node(64, 128, 128, 3, 28, 1, 1), "bfloat16")
    nchw, nhwc = tensor_work(three), tensor_work(three, channels_last=True)
    assert nchw is not None and nhwc is not None
    assert nhwc.gemms == nchw.gemms and nhwc.passes == () and len(nchw.passes) == 3
    passes_ms = pass_ms(np.array([nchw.passes]), np.array([[h100.bandwidth_gbps]])).sum()
    one = _typed(conv_node(64, 512, 2048, 1, 7, 1, 0), "bfloat16")
    nhwc = tensor_work(one, channels_last=True)
    assert nhwc is not None and nhwc.gemms == ((1, 64 * 49, 2048, 512),) and nhwc.choices == ()
    tf32 = replace(_typed(three, "float32"), tf32=True)
    saved = cores.layout_savings_ms([three, one, _gemm(256, 256, 256)], h100)
    assert saved[0] == pytest.approx(passes_ms)
    assert saved[1] > 0  # its transposes, where the NCHW price took them
    assert saved[2] == 0.0
    assert cores.layout_savings_ms([tf32], p4)[0] == 0.0  # no TF32 tensor cores: nothing priced here


def test_isolated_times_keep_gpu_order_without_cutting_kernels() -> None:
    """The time a node is priced at (the op timed alone, kernel plus the overhead an eager step hides)
    is never longer on a GPU that beats another, and the kernel time the step takes back is never
    below the GPU's own (its kernel, or a weaker GPU's where that is shorter). A floor-bound GEMM was
    priced 1.44x slower on an RTX 4090 than on an A10: the same 3 us kernel, plus the 27 us overhead
    the 4090 hides (it beats a P100) against the A10's 18 us."""
    nodes = [_gemm(m, n, k, dtype) for m in (1, 64, 4096) for n in (64, 333, 4096) for k in (64, 4096)
             for dtype in ("bfloat16", "float16")]  # fmt: skip
    nodes += [_typed(conv_node(b, c, 64, 3, 28, 1, 1), "bfloat16") for b in (1, 32) for c in (3, 64)]
    nodes.append(dataclasses.replace(_gemm(4096, 4096, 4096, "float32"), tf32=True))
    batch = NodeBatch.of(nodes)
    heads = Heads(default_heads().heads)
    works = [tensor_work(n) for n in nodes]
    assert all(w is not None for w in works)
    gpus = comparable()
    ms = {gpu: heads.predict(batch, gpu) for gpu in gpus}
    own = dict(zip(gpus, heads.tiled.kernel_table(works, gpus), strict=True))  # type: ignore[arg-type]
    for gpu in gpus:
        for weak in weaker_than(gpu):
            ok = ~np.isfinite(ms[weak]) | ~np.isfinite(ms[gpu]) | (ms[gpu] <= ms[weak] * (1 + 1e-12))
            assert ok.all(), (gpu.name, weak.name)
        if np.isfinite(own[gpu]).any():
            floor = np.fmin.reduce([own[gpu], *(own[w] for w in weaker_than(gpu))])
            kernel = ms[gpu] - hidden_overhead_ms(gpu)
            assert np.all(~np.isfinite(own[gpu]) | (kernel >= floor * (1 - 1e-9))), gpu.name
    a10, rtx4090 = get_device("A10"), get_device("RTX4090")
    assert a10 in weaker_than(rtx4090) and rtx4090 in stronger_than(a10)
    assert ms[rtx4090][0] <= ms[a10][0]  # the 1x64x64 GEMM: floor-bound on both
    assert ms[rtx4090][0] - hidden_overhead_ms(rtx4090) == pytest.approx(LAUNCH_FLOOR_MS)


def test_a_batch_priced_on_many_gpus_matches_each_gpu_priced_alone() -> None:
    """The kernel times kept with a batch for every GPU give what a fresh batch gives on each."""
    nodes = [
        _gemm(7, 768, 3072),
        _gemm(4096, 50257, 768),
        _typed(conv_node(8, 64, 64, 3, 28, 1, 1), "bfloat16"),
    ]
    heads = Heads(default_heads().heads)
    shared = NodeBatch.of(nodes)
    for name in ("T4", "H100-SXM", "L4", "A10"):
        gpu = get_device(name)
        alone = Heads(default_heads().heads).predict(NodeBatch.of(nodes), gpu)
        np.testing.assert_array_equal(heads.predict(shared, gpu), alone)
