"""MLP cost heads: op classes, features, inference, shipped weights, and the training pipeline."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import fxcost
from fxcost.cost_models import NodeBatch
from fxcost.cost_models.eager import MIN_KERNEL_MS, hidden_overhead_ms
from fxcost.cost_models.heads import (
    HEADS,
    TILED_HEADS,
    Heads,
    feature_matrix,
    head_of,
    load_heads,
    shipped_manifest,
)
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import HELD_OUT_DEVICES, Device, get_device
from fxcost.lowering.nodes import conv_node, gemm_node
from fxcost.records import KernelRecord, NodeCost

WEIGHTS = Path(fxcost.__file__).parent / "cost_models" / "weights"


def test_op_classes() -> None:
    assert head_of(gemm_node("linear", 1, 64, 32, 16)) == "linear"
    assert head_of(gemm_node("bmm", 4, 64, 32, 16)) == "bmm"
    assert head_of(conv_node(2, 3, 8, 3, 32, 1, 1)) == "conv"
    assert head_of(kernel_alike_node("gelu", 8, 8)) == "ew"
    assert head_of(kernel_alike_node("ln", 8, 8)) == "ln"
    assert head_of(kernel_alike_node("softmax", 8, 8)) == "softmax"
    assert head_of(NodeCost(name="v", op="aten.view.default", phase="fw", has_kernel=False)) is None
    assert head_of(NodeCost(name="k", op="aten.kthvalue.default", phase="fw", out_shapes=[(4,)])) is None


def test_features_are_finite_for_every_head() -> None:
    nodes = {
        "linear": gemm_node("linear", 1, 1, 1, 1),
        "bmm": gemm_node("bmm", 7, 65, 3, 1025),
        "conv": conv_node(1, 3, 2048, 3, 252, 1, 1),
        "ew": kernel_alike_node("powu", 16384, 768),
        "ln": kernel_alike_node("ln", 1, 16384),
        "softmax": kernel_alike_node("softmax", 8, 1),
    }
    for head, node in nodes.items():
        x = feature_matrix(head, [node], get_device("H100-SXM"))
        assert x.shape[0] == 1 and np.isfinite(x).all(), head


def test_shipped_heads_are_small_and_fit_only_on_training_gpus() -> None:
    assert (WEIGHTS / "heads.npz").stat().st_size < 5 * 2**20
    heads = load_heads()
    assert set(heads) == set(HEADS) - TILED_HEADS  # GEMMs: the tiled model's gemm.json
    manifest = shipped_manifest()
    assert set(manifest["excluded_devices"]) >= {"H100-SXM", "L4", "A100-PCIE-80GB"}
    for head, facts in manifest["heads"].items():
        assert not set(facts["devices"]) & HELD_OUT_DEVICES, head
        assert facts["train_rows"] > 0 and "all" in facts["train_mape"]
    assert all(len(f["sha256"]) == 64 for f in manifest["data"])


def test_heads_predict_captured_graph_nodes() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128))
    report = fxcost.profile(model, torch.randn(32, 64), devices=["T4"], measure=False)
    predicted = report.predict(["H100-SXM", "T4"], cost_model="mlp,roofline")
    sources = {n.pred_source["T4"] for n in predicted.nodes if n.has_kernel}
    assert "mlp" in sources
    mlp_nodes = [n for n in predicted.nodes if n.pred_source["T4"] == "mlp" and n.has_kernel]
    assert all(n.pred_ms["T4"] > 0 and np.isfinite(n.pred_ms["T4"]) for n in mlp_nodes)
    assert {n.op for n in mlp_nodes} >= {"aten.addmm.default", "aten.native_layer_norm.default"}
    assert predicted.total_ms("T4") > predicted.total_ms("H100-SXM")


def test_heads_leave_unknown_devices_and_ops_unpredicted() -> None:
    node = NodeCost(name="s", op="aten.sort.default", phase="fw", out_shapes=[(4,)], flops=1, bytes_read=4,
                    bytes_written=4)  # fmt: skip
    out = Heads().predict(NodeBatch.of([node, gemm_node("linear", 1, 8, 8, 8)]), get_device("MI300X"))
    assert np.isnan(out[0])


def test_memory_bound_ops_are_priced_as_the_elementwise_passes_they_lower_to() -> None:
    """No data measures batch norm: its two kernels are priced as relu passes moving their bytes, the
    per-channel statistics kernel no faster than memory latency allows."""
    from fxcost.cost_models.heads import LOWERED
    from fxcost.cost_models.latency import latency_floor_ms
    from fxcost.lowering.batch_norm import _batch_norm
    from fxcost.lowering.nodes import memory_pass

    x, c = (32, 64, 56, 56), (64,)
    bn = NodeCost(name="bn", op="aten._native_batch_norm_legit_functional.default", phase="fw",
                  in_shapes=[x, c, c, c, c], in_dtypes=["float32"] * 5, out_shapes=[x, c, c, c, c],
                  out_dtypes=["float32"] * 5, args={"training": True}, bytes_read=25_690_624,
                  bytes_written=25_690_624)  # fmt: skip
    assert head_of(bn) == LOWERED
    t4 = get_device("T4")
    read = 4 * math.prod(x)
    passes = Heads().predict(
        NodeBatch.of([memory_pass(read, "float32"), memory_pass(2 * read, "float32")]), t4
    )
    (predicted,) = Heads().predict(NodeBatch.of([bn]), t4)
    # the statistics kernel, one block per channel, is never below its memory-latency floor
    stats = next(spec for spec in _batch_norm(bn) if spec.round_trips)
    assert predicted == pytest.approx(max(passes[0], latency_floor_ms(stats, t4)) + passes[1])
    assert predicted >= passes.sum()
    # Heads without the elementwise one cannot price the passes: no prediction rather than a guess.
    (without,) = Heads({"conv": load_heads()["conv"]}).predict(NodeBatch.of([bn]), t4)
    assert np.isnan(without)


def test_the_math_paths_safe_softmax_is_a_softmax_and_the_passes_zeroing_masked_rows() -> None:
    """PyTorch runs ``_safe_softmax`` as softmax, ``eq(x, -inf)``, ``all`` over each row, a scalar zero
    and ``where``: five kernels, each through memory (the recorded H100 steps show them)."""
    from fxcost.cost_models.heads import LOWERED
    from fxcost.lowering.row_ops import lower_safe_softmax

    x, rows = [8, 12, 512, 512], [8, 12, 512, 1]
    numel = math.prod(x)
    safe = NodeCost(name="s", op="aten._safe_softmax.default", phase="fw", in_shapes=[x],
                    in_dtypes=["float32"], out_shapes=[x], out_dtypes=["float32"], args={"dim": -1},
                    flops=5 * numel, bytes_read=4 * numel, bytes_written=4 * numel)  # fmt: skip
    assert head_of(safe) == LOWERED
    work = lower_safe_softmax(safe)
    ops = [sub.op.split(".")[1] for sub, _ in work]
    assert ops == ["_softmax", "eq", "all", "scalar_tensor", "where"] and {c for _, c in work} == {1}
    (softmax, _), (eq, _), (reduce, _), (_, _), (where, _) = work
    assert (eq.bytes_read, eq.bytes_written) == (4 * numel, numel)  # fp32 in, bool out
    assert [list(s) for s in reduce.out_shapes] == [rows]
    assert (reduce.bytes_read, reduce.bytes_written) == (numel, math.prod(rows))
    assert (where.bytes_read, where.bytes_written) == (math.prod(rows) + 4 + 4 * numel, 4 * numel)
    measured = dataclasses.replace(safe, origin_ms=2.0, kernels=[KernelRecord("eq", 0.4)])
    assert (lambda sub: (sub.origin_ms, sub.kernels))(lower_safe_softmax(measured)[0][0]) == (None, [])
    h100 = get_device("H100-SXM")
    safe_ms, softmax_ms = Heads().predict(NodeBatch.of([safe, softmax]), h100)
    parts = Heads().predict(NodeBatch.of([sub for sub, _ in work]), h100)
    assert safe_ms == pytest.approx(_one_op(parts, h100)) and safe_ms > 1.5 * softmax_ms


def test_the_softmax_backward_multiplies_the_gradient_by_the_output_in_a_kernel_of_its_own() -> None:
    """ATen's CUDA softmax backward runs ``tmp = grad * output``, then the backward kernel on ``tmp``."""
    from fxcost.cost_models.heads import LOWERED
    from fxcost.lowering.row_ops import PREMULTIPLIED, lower_softmax_backward

    x = [8, 12, 512, 512]
    numel = math.prod(x)
    backward = NodeCost(name="b", op="aten._softmax_backward_data.default", phase="bw", in_shapes=[x, x],
                        in_dtypes=["float32"] * 2, out_shapes=[x], out_dtypes=["float32"],
                        args={"dim": -1}, flops=4 * numel, bytes_read=8 * numel, bytes_written=4 * numel,
                        origin_ms=1.0)  # fmt: skip
    assert head_of(backward) == LOWERED
    (product, _), (kernel, _) = lower_softmax_backward(backward)
    assert product.op == "aten.mul.Tensor" and (product.bytes_read, product.bytes_written) == (
        8 * numel,
        4 * numel,
    )
    assert kernel.args[PREMULTIPLIED] and kernel.origin_ms is None and head_of(kernel) == "softmax"
    assert lower_softmax_backward(kernel) == []  # the kernel's own node is not lowered again
    t4 = get_device("T4")
    (whole,) = Heads().predict(NodeBatch.of([backward]), t4)
    assert whole == pytest.approx(_one_op(Heads().predict(NodeBatch.of([product, kernel]), t4), t4))


def test_the_layer_norm_backward_reduces_the_parameters_gradients_in_a_kernel_of_its_own() -> None:
    """``layer_norm_kernel.cu``: the input's gradient, then ``GammaBetaBackwardCUDAKernel`` reading the
    output gradient, the input and the statistics again."""
    from fxcost.cost_models.heads import LOWERED
    from fxcost.lowering.row_ops import lower_layer_norm_backward

    x, stats, w = (32, 512, 1024), (32, 512, 1), (1024,)
    backward = NodeCost(name="b", op="aten.native_layer_norm_backward.default", phase="bw",
                        in_shapes=[x, x, stats, stats, w, w], in_dtypes=["float32"] * 6,
                        out_shapes=[x, w, w], out_dtypes=["float32"] * 3,
                        args={"normalized_shape": [1024], "output_mask": [True, True, True]},
                        flops=8 * math.prod(x), bytes_written=4 * (math.prod(x) + 2048),
                        bytes_read=4 * (2 * math.prod(x) + 2 * math.prod(stats) + 2048))  # fmt: skip
    assert head_of(backward) == LOWERED
    (grad_input, _), (reduce, _) = lower_layer_norm_backward(backward)
    assert head_of(grad_input) == "ln" and grad_input.out_shapes == [x]
    assert grad_input.bytes_written == 4 * math.prod(x)
    assert reduce.bytes == 4 * (2 * math.prod(x) + 2 * math.prod(stats) + 2 * 1024)
    only_input = dataclasses.replace(backward, args={**backward.args, "output_mask": [True, False, False]})
    assert head_of(only_input) == "ln" and lower_layer_norm_backward(only_input) == []
    h100 = get_device("H100-SXM")
    (whole,) = Heads().predict(NodeBatch.of([backward]), h100)
    assert whole == pytest.approx(_one_op(Heads().predict(NodeBatch.of([grad_input, reduce]), h100), h100))


def _one_op(parts: np.ndarray, device: Device) -> float:
    """An op's time from its kernels' times each timed alone: their kernels back to back and the
    per-op overhead once."""
    hidden = hidden_overhead_ms(device)
    return float(np.maximum(parts - hidden, MIN_KERNEL_MS).sum() + hidden)


def test_a_lowered_op_that_launches_nothing_costs_nothing() -> None:
    empty = NodeCost(name="cat", op="aten.cat.default", phase="fw", in_shapes=[(0, 4), (0, 4)],
                     in_dtypes=["float32"] * 2, out_shapes=[(0, 4)], out_dtypes=["float32"], bytes_read=0,
                     bytes_written=0)  # fmt: skip
    assert Heads().predict(NodeBatch.of([empty]), get_device("T4"))[0] == 0.0


def test_elementwise_tables_follow_the_device_not_its_name() -> None:
    """A device file may change a known GPU's specs under the same name: its tables are its own."""
    a100 = get_device("A100-SXM4-40GB")
    faster = dataclasses.replace(a100, mem_bandwidth_gbps=4 * a100.mem_bandwidth_gbps)
    relu = NodeBatch.of([kernel_alike_node("relu", 4096, 4096)])
    (before,) = Heads().predict(relu, a100)
    (after,) = Heads().predict(NodeBatch.of(relu.nodes), faster)
    assert after < before / 2


def test_isotonic_pools_a_dip_with_the_values_before_it() -> None:
    from fxcost.cost_models.heads.elementwise import _isotonic

    np.testing.assert_allclose(_isotonic(np.array([1.0, 3.0, 2.0, 4.0])), [1.0, 2.5, 2.5, 4.0])
    np.testing.assert_allclose(_isotonic(np.array([3.0, 2.0, 1.0])), [2.0, 2.0, 2.0])
    rising = np.array([0.0, 1.0, 1.0, 5.0])
    np.testing.assert_array_equal(_isotonic(rising), rising)


def test_convolution_backward_is_its_forward_once_per_gradient() -> None:
    forward = conv_node(8, 64, 64, 3, 56, 1, 1)
    backward = NodeCost(
        name="cb", op="aten.convolution_backward.default", phase="bw",
        in_shapes=[forward.out_shapes[0], forward.in_shapes[0], forward.in_shapes[1]],
        in_dtypes=["float32"] * 3, out_shapes=[forward.in_shapes[0], forward.in_shapes[1]],
        out_dtypes=["float32"] * 2,
        args={"stride": [1, 1], "padding": [1, 1], "output_mask": [True, True, False]},
        flops=2 * forward.flops, bytes_read=1, bytes_written=1,
    )  # fmt: skip
    weight_only = NodeCost.from_json(
        {**backward.to_json(), "args": {**backward.args, "output_mask": [False, True, False]}}
    )
    fw, bw, bw_weight = Heads().predict(
        NodeBatch.of([forward, backward, weight_only]), get_device("V100-PCIE-32GB")
    )
    assert bw == pytest.approx(2 * fw) and bw_weight == pytest.approx(fw)


def test_cudnn_lstm_is_lowered_to_gemms_and_pointwise_work() -> None:
    from fxcost.lowering.rnn import lower_rnn

    lstm = NodeCost(
        name="rnn", op="aten._cudnn_rnn.default", phase="fw",
        in_shapes=[(32, 16, 256)], in_dtypes=["float32"], out_shapes=[(32, 16, 512)], out_dtypes=["float32"],
        args={"mode": 2, "hidden_size": 512, "num_layers": 2, "batch_first": False, "bidirectional": False},
    )  # fmt: skip
    work = lower_rnn(lstm)
    gemms = [(n.in_shapes, count) for n, count in work if n.op == "aten.mm.default"]
    assert gemms == [
        ([(512, 256), (256, 2048)], 1),  # layer 0: the input sequence onto the four gates
        ([(16, 512), (512, 2048)], 32),  # a recurrent step, 32 times
        ([(512, 512), (512, 2048)], 1),  # layer 1 reads layer 0's hidden states
        ([(16, 512), (512, 2048)], 32),
    ]
    backward = NodeCost.from_json({**lstm.to_json(), "op": "aten._cudnn_rnn_backward.default"})
    fw, bw = Heads().predict(NodeBatch.of([lstm, backward]), get_device("T4"))
    assert 0 < fw < bw == pytest.approx(2 * fw)


def test_nodes_with_unexpected_shapes_stay_unpredicted() -> None:
    odd = NodeCost(name="mm", op="aten.mm.default", phase="fw", in_shapes=[(4,)], in_dtypes=["float32"],
                   out_shapes=[(4,)], out_dtypes=["float32"], flops=8, bytes_read=16)  # fmt: skip
    good = gemm_node("linear", 1, 64, 64, 64)
    out = Heads().predict(NodeBatch.of([odd, good]), get_device("T4"))
    assert np.isnan(out[0]) and out[1] > 0


def test_heads_of_other_features_are_refused_with_a_retrain_hint(tmp_path) -> None:
    from fxcost.cost_models.heads import FEATURE_VERSION

    with np.load(WEIGHTS / "heads.npz") as shipped:
        arrays = dict(shipped)
    assert int(arrays["feature_version"]) == FEATURE_VERSION
    np.savez(tmp_path / "heads.npz", **{**arrays, "feature_version": np.array(FEATURE_VERSION - 1)})
    with pytest.raises(ValueError, match=r"feature version .* retrain them with `fxcost train`"):
        load_heads(tmp_path)


def test_copies_and_casts_are_elementwise_passes() -> None:
    from fxcost.records import NodeCost

    cast = NodeCost(name="c", op="aten._to_copy.default", phase="fw", in_shapes=[(1024, 1024)],
                    in_dtypes=["float32"], out_shapes=[(1024, 1024)], out_dtypes=["bfloat16"],
                    flops=0, bytes_read=4 * 2**20, bytes_written=2 * 2**20)  # fmt: skip
    assert head_of(cast) == "ew"
    ms = Heads().predict(NodeBatch.of([cast]), get_device("A100-PCIE-40GB"))
    assert np.isfinite(ms[0]) and ms[0] > 0


def test_heads_with_different_op_classes_share_a_batch_without_interfering() -> None:
    nodes = [conv_node(8, 64, 64, 3, 28, 1, 1), kernel_alike_node("gelu", 64, 1024)]
    batch, t4 = NodeBatch.of(nodes), get_device("T4")
    only_conv = Heads({"conv": load_heads()["conv"]}).predict(batch, t4)
    everything = Heads().predict(batch, t4)  # the derived node groups must not be the first model's
    assert np.isfinite(only_conv[0]) and np.isnan(only_conv[1])
    assert np.all(np.isfinite(everything)) and everything[0] == only_conv[0]


def test_the_fp32_traffic_of_a_half_node_widens_only_its_half_tensors() -> None:
    """A bf16 dropout backward reads a bf16 gradient and a bool mask: the heads' features see the
    traffic of an fp32 dropout backward (the mask stays one byte per element; it was doubled too)."""
    from fxcost.cost_models.heads import fp32_traffic

    def dropout_backward(dtype: str, itemsize: int) -> NodeCost:
        return NodeCost(name="d", op="aten.native_dropout_backward.default", phase="bw", graph=0,
                        in_shapes=[(4, 1024), (4, 1024)], in_dtypes=[dtype, "bool"],
                        out_shapes=[(4, 1024)], out_dtypes=[dtype], flops=4096,
                        bytes_read=4096 * (itemsize + 1), bytes_written=4096 * itemsize)  # fmt: skip

    fp32 = dropout_backward("float32", 4)
    assert fp32_traffic(dropout_backward("bfloat16", 2)) == (fp32.bytes_read, fp32.bytes_written)
    assert fp32_traffic(fp32) == (fp32.bytes_read, fp32.bytes_written)


def test_each_heads_model_keeps_its_own_size_tables() -> None:
    """The elementwise tables belong to a heads model, not to the process; the registered ``mlp``
    and ``mlp_ratio`` models share the one default instance."""
    from fxcost.cost_models import get_model
    from fxcost.cost_models.heads import default_heads

    relu = NodeBatch.of([kernel_alike_node("relu", 4096, 4096)])
    first, second = Heads(), Heads()
    first.predict(relu, get_device("T4"))
    assert len(first.size_tables) == 1 and len(second.size_tables) == 0
    assert get_model("mlp") is default_heads() and get_model("mlp_ratio").heads is default_heads()


def test_a_convolutions_bound_runs_at_the_power_capped_clock_and_nothing_elses() -> None:
    """Given the GEMM fit's watts, a convolution's compute bound on a power-capped T4 is its boost-clock
    bound over the clock share the T4 sustains; a GEMM's and an elementwise op's bound are unchanged,
    and so is every bound on a V100, which the cap does not reach."""
    from fxcost.cost_models.heads.features import REFERENCE, roofline_ms
    from fxcost.cost_models.heads.sustained import clock_share

    conv = conv_node(64, 256, 256, 3, 56, 1, 1)  # 236 GFLOP: compute bound on both
    batch = NodeBatch.of(
        [conv, gemm_node("linear", 1, 4096, 4096, 4096), kernel_alike_node("gelu", 4096, 4096)]
    )
    t4, v100, watts = get_device("T4"), get_device("V100-PCIE-32GB"), 19.42
    share = clock_share(t4, watts)
    assert 0.4 < share < 0.8
    boost, capped = roofline_ms(batch, t4), roofline_ms(batch, t4, watts)
    floor = REFERENCE.launch_floor_ms  # added to every bound
    assert capped[0] - floor == pytest.approx((boost[0] - floor) / share)
    np.testing.assert_array_equal(capped[1:], boost[1:])
    np.testing.assert_array_equal(roofline_ms(batch, v100, watts), roofline_ms(batch, v100))


def test_the_shipped_conv_head_was_trained_against_the_shipped_gemm_fit() -> None:
    from fxcost.cost_models.heads.sustained import shipped_gemm_fit
    from fxcost.cost_models.heads.weights import clocked_watts

    assert clocked_watts() == shipped_gemm_fit().watts == shipped_manifest()["heads"]["conv"]["watts"]


def test_the_heads_price_convolutions_with_their_gemm_fits_watts() -> None:
    """A heads model reads its convolutions' bound with its own GEMM fit's watts: fewer watts per
    TFLOP/s free the power-capped T4's clock (a faster convolution) and leave the V100, capped by
    neither, as it was."""
    heads = Heads()
    freer = Heads(heads.heads, dataclasses.replace(heads.gemm, watts=heads.gemm.watts * 0.8))
    batch = NodeBatch.of([conv_node(64, 256, 256, 3, 56, 1, 1)])
    t4, v100 = get_device("T4"), get_device("V100-PCIE-32GB")
    assert freer.predict(batch, t4)[0] < heads.predict(batch, t4)[0] * 0.9
    assert freer.predict(batch, v100)[0] == pytest.approx(heads.predict(batch, v100)[0], rel=1e-12)


def test_the_convolution_head_sees_the_problem_and_the_ridge_not_the_gpu() -> None:
    """Three GPUs train the conv head in a fold that leaves one out: it reads no spec features, only
    the problem's and its intensity over the GPU's ridge point (the last column)."""
    node = conv_node(8, 64, 128, 3, 56, 1, 1)
    t4, v100 = (feature_matrix("conv", [node], get_device(name)) for name in ("T4", "V100-PCIE-32GB"))
    np.testing.assert_array_equal(t4[:, :-1], v100[:, :-1])
    assert t4[0, -1] != v100[0, -1]
    gemm = gemm_node("linear", 1, 64, 64, 64)
    t4_gemm, v100_gemm = (feature_matrix("linear", [gemm], get_device(n)) for n in ("T4", "V100-PCIE-32GB"))
    assert not np.array_equal(t4_gemm[:, :-3], v100_gemm[:, :-3])  # the other heads do see the GPU


@pytest.mark.parametrize("head", ["ln", "softmax"])
def test_the_row_heads_see_the_problem_against_the_gpu_not_its_spec_sheet(head: str) -> None:
    """Layer norm and softmax read the GPU only as the time the node's bytes take at its achieved
    bandwidth and its rows per SM (the last two columns), beside the ridge point: a GPU of other
    spec-sheet facts but the same bandwidth, SMs and ridge gets the same features."""
    node = kernel_alike_node(head, 4096, 2048)
    t4 = get_device("T4")
    other = dataclasses.replace(t4, l2_cache_mb=40.0, boost_clock_mhz=2000, memory_gb=80)
    np.testing.assert_array_equal(feature_matrix(head, [node], t4), feature_matrix(head, [node], other))
    v100 = get_device("V100-PCIE-32GB")
    x_t4, x_v100 = (feature_matrix(head, [node], d)[0] for d in (t4, v100))
    np.testing.assert_array_equal(x_t4[:-3], x_v100[:-3])  # the problem's own features
    assert x_t4[-2] - x_v100[-2] == pytest.approx(math.log(v100.bandwidth_gbps / t4.bandwidth_gbps))
    assert x_t4[-1] - x_v100[-1] == pytest.approx(math.log(v100.num_sms / t4.num_sms))
    assert math.exp(x_t4[-2]) == pytest.approx(node.bytes / (t4.bandwidth_gbps * 1e6))  # ms at the bandwidth
    assert math.exp(x_t4[-1]) == pytest.approx(4096 / t4.num_sms)  # rows per SM
    ridge = math.log(t4.fp32_tflops * 1e12 / (t4.mem_bandwidth_gbps * 1e9))
    assert x_t4[-3] == pytest.approx(x_t4[4] - ridge)  # intensity over the ridge point
