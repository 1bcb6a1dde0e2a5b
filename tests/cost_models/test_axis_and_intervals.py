"""The heads read along the batch-like axis (monotone by construction), and their intervals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import Heads
from fxcost.cost_models.heads.axis import AxisTables, axis_of
from fxcost.cost_models.heads.intervals import (
    LONG_REDUCTION,
    Intervals,
    interval_class,
    node_bounds,
    shipped_intervals,
    write_intervals,
)
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import get_device
from fxcost.lowering.nodes import conv_node, gemm_node
from fxcost.records import NodeCost

GPUS = ["T4", "V100-PCIE-32GB", "A100-PCIE-40GB", "L4", "H100-SXM", "MI250"]


def test_a_node_resized_to_its_own_size_is_itself() -> None:
    nodes = {
        "linear": gemm_node("linear", 1, 300, 768, 3072),
        "bmm": gemm_node("bmm", 12, 64, 64, 128),
        "conv": conv_node(8, 64, 128, 3, 28, 1, 1),
        "ln": kernel_alike_node("ln", 512, 768),
        "softmax": kernel_alike_node("softmax", 96, 1024),
    }
    for head, node in nodes.items():
        found = axis_of(head, node)
        assert found is not None, head
        axis, size = found
        again = axis.at(size)
        assert (again.flops, again.bytes_read, again.bytes_written) == (
            node.flops,
            node.bytes_read,
            node.bytes_written,
        )
        assert again.in_shapes == [tuple(s) for s in node.in_shapes]


def test_a_gemm_weight_does_not_grow_with_rows_even_when_square() -> None:
    axis, size = axis_of("linear", gemm_node("linear", 1, 512, 512, 512))  # type: ignore[misc]
    assert size == 512
    assert axis.carried_in == (True, False)
    bigger = axis.at(1024)
    assert bigger.in_shapes[1] == (512, 512) and bigger.in_shapes[0] == (1024, 512)


@pytest.mark.parametrize("gpu", GPUS)
def test_more_rows_or_batch_never_predict_less_time(gpu: str) -> None:
    rng = np.random.default_rng(0)
    heads, device = Heads(), get_device(gpu)
    pairs = []
    for _ in range(40):
        n, k, b = int(rng.integers(1, 4096)), int(rng.integers(1, 4096)), int(rng.integers(1, 64))
        m = int(rng.integers(1, 4096))
        pairs += [gemm_node("linear", 1, m, n, k), gemm_node("linear", 1, 2 * m, n, k)]
        pairs += [
            gemm_node("bmm", b, 64, n % 512 + 1, k % 512 + 1),
            gemm_node("bmm", 2 * b, 64, n % 512 + 1, k % 512 + 1),
        ]
        c, o, s = int(rng.integers(1, 256)), int(rng.integers(1, 256)), int(rng.integers(4, 64))
        pairs += [conv_node(b, c, o, 3, s, 1, 1), conv_node(2 * b, c, o, 3, s, 1, 1)]
        pairs += [kernel_alike_node("ln", m, n), kernel_alike_node("ln", 2 * m, n)]
        pairs += [kernel_alike_node("softmax", m, n), kernel_alike_node("softmax", 2 * m, n)]
        pairs += [_outer_add(m, n), _outer_add(2 * m, n)]
    ms = heads.predict(NodeBatch.of(pairs), device)
    small, large = ms[0::2], ms[1::2]
    known = np.isfinite(small) & np.isfinite(large)
    assert known.mean() > 0.9
    assert (large[known] >= small[known] * (1 - 1e-9)).all()


def _outer_add(rows: int, width: int) -> NodeCost:
    """``x + y`` of fp32 tensors [rows, 1] and [1, width]: a broadcast whose bytes per element change."""
    return NodeCost(
        name="add", op="aten.add.Tensor", phase="fw", in_shapes=[(rows, 1), (1, width)],
        in_dtypes=["float32"] * 2, out_shapes=[(rows, width)], out_dtypes=["float32"],
        flops=rows * width, bytes_read=4 * (rows + width), bytes_written=4 * rows * width,
    )  # fmt: skip


def test_asking_for_a_larger_size_later_leaves_smaller_answers_alone() -> None:
    heads, device = Heads(), get_device("T4")
    small = NodeBatch.of([gemm_node("linear", 1, 300, 1024, 1024)])
    before = heads.predict(small, device)[0]
    heads.predict(NodeBatch.of([gemm_node("linear", 1, 100_000, 1024, 1024)]), device)
    after = heads.predict(NodeBatch.of([gemm_node("linear", 1, 300, 1024, 1024)]), device)[0]
    assert before == pytest.approx(after, rel=1e-12)


def test_axis_tables_are_bounded() -> None:
    heads = Heads()
    tables = AxisTables(max_tables=3, watts=heads.gemm.watts)
    heads.axis_tables = tables
    nodes = [conv_node(b, 16, c, 3, 14, 1, 1) for b in (1, 2) for c in range(16, 20)]
    heads.predict(NodeBatch.of(nodes), get_device("T4"))
    assert len(tables) == 3


def test_intervals_are_the_central_share_of_the_errors(tmp_path) -> None:
    errors = {"bmm": np.linspace(-1.0, 1.0, 101)}
    intervals = Intervals.from_errors(errors, nominal=0.8)
    low, high = intervals.quantiles["bmm"]
    assert low == pytest.approx(-0.8) and high == pytest.approx(0.8)
    lo, hi = intervals.bounds("bmm", np.array([2.0]))
    assert lo[0] == pytest.approx(2 * math.exp(-0.8)) and hi[0] == pytest.approx(2 * math.exp(0.8))
    assert np.isnan(intervals.bounds("conv", 1.0)[0])
    path = write_intervals(intervals, tmp_path)
    assert Intervals.from_json(path.read_text()) == Intervals.from_json(intervals.to_json())
    assert json.loads(path.read_text())["rows"] == {"bmm": 101}
    with pytest.raises(ValueError, match="nominal"):
        Intervals.from_errors(errors, nominal=1.2)


def test_only_origin_free_head_predictions_get_an_interval() -> None:
    intervals = Intervals({"linear": (-0.5, 0.25), "ew": (-0.1, 0.1)})
    nodes = [gemm_node("linear", 1, 64, 64, 64)] * 2 + [kernel_alike_node("relu", 8, 8)]
    low, high = node_bounds(nodes, np.array([1.0, 1.0, 2.0]), ["mlp", "roofline", "mlp"], intervals)
    assert low.tolist() == pytest.approx([math.exp(-0.5), 1.0, 2 * math.exp(-0.1)])
    assert high.tolist() == pytest.approx([math.exp(0.25), 1.0, 2 * math.exp(0.1)])


def test_a_gemm_over_a_long_reduction_takes_its_own_interval() -> None:
    """``linear_long`` bounds a GEMM reducing over LONG_REDUCTION elements or more (where the file has
    it; an older file's ``linear`` otherwise); batched GEMMs and shorter reductions keep their head's."""
    short, long = (
        gemm_node("linear", 1, 1024, 768, LONG_REDUCTION - 1),
        gemm_node("linear", 1, 1024, 768, LONG_REDUCTION),
    )
    assert [interval_class(n, "linear") for n in (short, long)] == ["linear", "linear_long"]
    addmm = NodeCost(
        name="addmm",
        op="aten.addmm.default",
        phase="fw",
        in_shapes=[(768,), (1024, LONG_REDUCTION), (LONG_REDUCTION, 768)],
        out_shapes=[(1024, 768)],
    )
    assert interval_class(addmm, "linear") == "linear_long"  # the bias is no operand
    assert interval_class(gemm_node("bmm", 4, 64, 64, 2 * LONG_REDUCTION), "bmm") == "bmm"
    lstm = NodeCost(
        name="lstm",
        op="aten._cudnn_rnn.default",
        phase="fw",  # hx, cx last: no GEMM operands
        in_shapes=[(4, 8, 64), (1, 4, LONG_REDUCTION), (1, 4, LONG_REDUCTION)],
        out_shapes=[(4, 8, 64)],
    )
    assert interval_class(lstm, "linear") == "linear"
    split = Intervals({"linear": (-0.5, 0.25), "linear_long": (-0.2, 1.0)})
    low, high = node_bounds([short, long], np.array([1.0, 1.0]), ["mlp", "mlp"], split)
    assert low.tolist() == pytest.approx([math.exp(-0.5), math.exp(-0.2)])
    assert high.tolist() == pytest.approx([math.exp(0.25), math.exp(1.0)])
    older = Intervals({"linear": (-0.5, 0.25)})
    bounds = node_bounds([long], np.array([1.0]), ["mlp"], older)
    assert (bounds[0][0], bounds[1][0]) == pytest.approx((math.exp(-0.5), math.exp(0.25)))


def test_a_lowered_rnn_takes_the_gemm_interval() -> None:
    from fxcost.lowering.rnn import RNN_OPS

    intervals = Intervals({"linear": (-0.5, 0.25), "ew": (-0.1, 0.1)})
    rnn = NodeCost(
        name="lstm", op=sorted(RNN_OPS)[0], phase="fw", in_shapes=[(4, 8, 16)], out_shapes=[(4, 8, 16)]
    )
    low, high = node_bounds([rnn], np.array([1.0]), ["mlp"], intervals)
    assert (low[0], high[0]) == pytest.approx((math.exp(-0.5), math.exp(0.25)))


def test_fused_attention_reaches_up_to_its_kernel_with_nothing_overlapped() -> None:
    """The bmm class's interval, widened up to the serial structure's time on the GPU priced; without
    a GPU the class's interval alone, and a node another model priced gets none."""
    from fxcost.cost_models.attention import fused_attention_ms
    from fxcost.lowering.attention import attention_call
    from fxcost.lowering.attention_kernels import attention_work, fused_attention

    h100 = get_device("H100-SXM")
    q = (4, 16, 2048, 128)
    sdpa = NodeCost(name="sdpa", op="aten._scaled_dot_product_cudnn_attention.default", phase="fw",
                    in_shapes=[q, q, q, (4, 1, 2048, 2048)], in_dtypes=["bfloat16"] * 4, out_shapes=[q],
                    out_dtypes=["bfloat16"])  # fmt: skip
    call, found = attention_call(sdpa), attention_work(sdpa, h100)
    assert found is not None and found[0] == "cudnn" and call is not None and call.masked
    fused = fused_attention(call, "cudnn")
    heads = Heads()
    ms = heads.predict(NodeBatch.of([sdpa]), h100)
    intervals = Intervals({"bmm": (-0.3, 0.6)})
    low, high = node_bounds([sdpa], ms, ["mlp"], intervals, device=h100)
    rate = heads.tiled.sustained_tflops(h100, "bfloat16")
    serial = fused_attention_ms(call, fused, h100, rate, serial=True)
    overlapped = fused_attention_ms(call, fused, h100, rate)
    assert serial is not None and overlapped is not None
    assert low[0] == pytest.approx(ms[0] * math.exp(-0.3))
    assert high[0] == pytest.approx(ms[0] + serial - overlapped) and high[0] > ms[0] * math.exp(0.6)
    alone = node_bounds([sdpa], ms, ["mlp"], intervals)
    assert alone[1][0] == pytest.approx(ms[0] * math.exp(0.6))
    other = node_bounds([sdpa], ms, ["roofline"], intervals, device=h100)
    assert (other[0][0], other[1][0]) == (ms[0], ms[0])


def test_a_fused_kernels_high_end_is_the_later_of_its_class_and_its_serial_time() -> None:
    from fxcost.cost_models.heads.intervals import attention_high

    assert attention_high(1.8, 2.0, 0.5) == 1.8  # serial 2.5 ms, below the class's 3.6
    assert attention_high(1.8, 2.0, 4.0) == pytest.approx(3.0)  # serial 6 ms
    assert attention_high(1.8, 0.0, 4.0) == 1.8  # nothing priced: no factor to widen


def test_shipped_intervals_cover_every_head_and_widen_around_the_prediction() -> None:
    intervals = shipped_intervals()
    assert intervals is not None and intervals.nominal == 0.8
    for head in ("linear", "linear_long", "bmm", "conv", "ew", "ln", "softmax"):
        low, high = intervals.quantiles[head]
        assert low < 0 < high, head


def test_a_broadcast_operand_of_lower_rank_does_not_grow_with_the_batch() -> None:
    def add(b: int) -> NodeCost:  # x + position embedding
        return NodeCost(
            name="add", op="aten.add.Tensor", phase="fw", in_shapes=[(b, 64, 768), (64, 768)],
            in_dtypes=["float32"] * 2, out_shapes=[(b, 64, 768)], out_dtypes=["float32"],
            flops=b * 64 * 768, bytes_read=4 * (b + 1) * 64 * 768, bytes_written=4 * b * 64 * 768,
        )  # fmt: skip

    axis, _ = axis_of("ew", add(64))  # type: ignore[misc]
    assert axis.carried_in == (True, False)
    ms = Heads().predict(NodeBatch.of([add(b) for b in (63, 64, 65)]), get_device("H100-SXM"))
    assert ms[0] <= ms[1] <= ms[2]


def test_the_envelope_never_undercuts_a_gpus_own_bound_in_half_precision() -> None:
    import dataclasses

    from fxcost.cost_models.heads import roofline_ms

    big = gemm_node("linear", 1, 8192, 8192, 8192)
    half = dataclasses.replace(
        big, in_dtypes=["bfloat16"] * 2, out_dtypes=["bfloat16"],
        bytes_read=big.bytes_read // 2, bytes_written=big.bytes_written // 2,  # type: ignore[operator]
    )  # fmt: skip
    batch = NodeBatch.of([half])
    for gpu in ("RTX3090", "A10G", "H100-SXM", "T4"):
        device = get_device(gpu)
        assert Heads().predict(batch, device)[0] >= roofline_ms(batch, device)[0] * (1 - 1e-9), gpu


def test_the_envelope_never_undercuts_a_gpus_own_bound_on_memory_traffic() -> None:
    """The heads' bound counts the bandwidth a GPU achieves; the GPUs whose tables the envelope lends
    it achieve no more (an RTX 4090, 1,008 GB/s on paper, achieves less than a calibrated V100)."""
    from fxcost.cost_models.heads import roofline_ms

    batch = NodeBatch.of([kernel_alike_node("add", 16384, 8192), kernel_alike_node("ln", 16384, 8192)])
    for gpu in ("RTX4090", "V100-SXM2-16GB", "H100-SXM", "L4"):
        device = get_device(gpu)
        assert np.all(Heads().predict(batch, device) >= roofline_ms(batch, device) * (1 - 1e-9)), gpu


def test_the_envelope_never_undercuts_a_gpus_power_capped_convolution_bound() -> None:
    """A convolution's bound runs at the clock its GPU sustains under its power cap; the envelope may
    lend it the table of a weaker GPU that is capped less (a 250 W P100 to a 70 W T4), never below it."""
    import dataclasses

    from fxcost.cost_models.heads import roofline_ms

    heads = Heads()
    convs = [
        conv_node(b, c, c, 3, s, 1, 1) for b, c, s in ((1, 3, 224), (32, 64, 56), (64, 256, 28), (8, 512, 7))
    ]
    fp32 = NodeBatch.of([dataclasses.replace(n, tf32=False) for n in convs])
    for gpu in ("P4", "T4", "L4", "A10G", "V100-PCIE-32GB", "RTX4090"):
        device = get_device(gpu)
        bound = roofline_ms(fp32, device, heads.gemm.watts)
        assert np.all(heads.predict(fp32, device) >= bound * (1 - 1e-9)), gpu


def test_tables_enveloped_ahead_for_every_gpu_are_the_ones_it_would_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second GPU asking for a class has it read on every GPU and enveloped for each of them
    then; a GPU priced after finds its tables, equal to those it builds itself when nothing is
    enveloped ahead."""
    from fxcost.cost_models.heads.envelope import Envelope

    nodes = [gemm_node("linear", 1, 512, 768, 768), gemm_node("bmm", 12, 128, 64, 128), _outer_add(512, 768),
             kernel_alike_node("ln", 512, 768), kernel_alike_node("gelu", 512, 3072)]  # fmt: skip
    batch = NodeBatch.of(nodes)
    first, second, later = (get_device(g) for g in ("T4", "A10G", "H100-SXM"))
    ahead = Heads()
    for device in (first, second):
        ahead.predict(NodeBatch.of(nodes), device)
    assert len(ahead.axis_tables._envelope._tables[later]) > 0  # built before H100 was asked for
    assert len(ahead.size_tables._envelope._tables[later]) > 0
    monkeypatch.setattr(Envelope, "_envelope", lambda *args: None)
    lazy = Heads()
    for device in (first, second):
        lazy.predict(NodeBatch.of(nodes), device)
    assert later not in lazy.axis_tables._envelope._tables
    np.testing.assert_array_equal(ahead.predict(batch, later), lazy.predict(NodeBatch.of(nodes), later))


def test_the_classes_tables_are_read_as_np_interp_reads_each() -> None:
    """One gather for every class reads what interpolating each class's table alone did: exact grid
    points, sizes between them and past the top, tables unreadable below some size (NaN)."""
    from fxcost.cost_models.heads.axis import _LOG_GRID, _TOP, _on_grid

    rng = np.random.default_rng(0)
    classes = 5
    table = np.cumsum(rng.uniform(0, 0.5, (classes, len(_LOG_GRID))), axis=1)
    table[1, :7] = np.nan  # no prediction below the eighth grid size
    grid = np.exp(_LOG_GRID)
    sizes = [np.concatenate([np.rint(grid[:: 3 + c]), rng.uniform(1, 2 * _TOP, 20), [_TOP, _TOP + 1, 3e7]])
             for c in range(classes)]  # fmt: skip
    members = {c: (np.arange(len(s)) + 1000 * c, s.astype(np.float64)) for c, s in enumerate(sizes)}
    got = _on_grid(members).read(table)  # type: ignore[arg-type]
    beyond = [table[c, -1] + np.log(s) - _LOG_GRID[-1] for c, s in enumerate(sizes)]
    inside = [np.interp(np.log(s), _LOG_GRID, table[c]) for c, s in enumerate(sizes)]
    want = np.concatenate([np.where(s > _TOP, b, i) for s, b, i in zip(sizes, beyond, inside, strict=True)])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=0, atol=1e-12)
