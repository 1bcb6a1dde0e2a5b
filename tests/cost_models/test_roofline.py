"""The roofline baseline and the cost-model registry."""

from __future__ import annotations

import numpy as np
import pytest

from fxcost import cost_models
from fxcost.cost_models import NodeBatch
from fxcost.cost_models.roofline import Roofline
from fxcost.gpus import get_device
from fxcost.records import NodeCost


def _node(
    op: str, flops: int | None, bytes_read: int | None, dtype: str = "float32", kernel: bool = True
) -> NodeCost:
    return NodeCost(name=op, op=op, phase="fw", flops=flops, bytes_read=bytes_read, bytes_written=0,
                    has_kernel=kernel, out_dtypes=[dtype])  # fmt: skip


def test_roofline_hand_computed() -> None:
    t4 = get_device("T4")  # 8.1 TFLOPS fp32, 65 TFLOPS fp16 tensor, 320 GB/s
    nodes = [
        _node("aten.mm.default", flops=8_100_000_000, bytes_read=1000),  # compute bound: 1 ms
        _node("aten.add.Tensor", flops=1000, bytes_read=320_000_000),  # memory bound: 1 ms
        _node("aten.mm.default", flops=65_000_000_000, bytes_read=1000, dtype="float16"),  # tensor cores
        _node("aten.view.default", flops=0, bytes_read=0, kernel=False),
        _node("aten.sort.default", flops=None, bytes_read=320_000_000),  # flops unknown: bytes bound
        _node("aten.foo.default", flops=10, bytes_read=None),  # unknown traffic: no prediction
    ]
    model = Roofline(launch_floor_ms=0.003)
    ms = model.predict(NodeBatch.of(nodes), t4)
    np.testing.assert_allclose(ms[:5], [1.003, 1.003, 1.003, 0.0, 1.003])
    assert np.isnan(ms[5])


def test_achieved_bandwidth_bounds_memory_traffic_at_what_the_gpu_reaches() -> None:
    t4 = get_device("T4")  # calibrated: 241 of its 320 GB/s
    batch = NodeBatch.of([_node("aten.add.Tensor", flops=1000, bytes_read=241_000_000)])
    spec, achieved = (Roofline(0.0, achieved_bandwidth=a).predict(batch, t4)[0] for a in (False, True))
    assert spec == pytest.approx(241 / 320)
    assert achieved == pytest.approx(1.0)


def test_predict_fills_records_and_marks_unknowns() -> None:
    nodes = [_node("aten.add.Tensor", 10, 4000), _node("aten.foo.default", 10, None)]
    cost_models.predict(nodes, ["T4", "NVIDIA H100 80GB HBM3"], "roofline")
    assert set(nodes[0].pred_ms) == {"T4", "H100-SXM"}
    assert nodes[0].pred_source == {"T4": "roofline", "H100-SXM": "roofline"}
    assert nodes[1].pred_ms["T4"] is None and nodes[1].pred_source["T4"] == "unsupported"


def test_faster_gpu_predicts_less_time() -> None:
    nodes = [_node("aten.mm.default", 10**11, 10**8), _node("aten.add.Tensor", 10**6, 10**9)]
    batch = NodeBatch.of(nodes)
    slow = Roofline().predict(batch, get_device("T4"))
    fast = Roofline().predict(batch, get_device("H100-SXM"))
    assert np.all(fast < slow)


def test_registry_refuses_duplicates_and_unknown_names() -> None:
    assert "roofline" in cost_models.model_names()
    with pytest.raises(ValueError, match="already registered"):
        cost_models.register("roofline")(Roofline)
    with pytest.raises(ValueError, match="unknown cost model 'nope'"):
        cost_models.get_model("nope")
    assert isinstance(cost_models.get_model("roofline"), cost_models.CostModel)


def test_tf32_matmuls_use_tensor_core_peaks_where_the_gpu_has_them() -> None:
    import torch
    from torch import nn

    import fxcost

    lin, x = nn.Linear(2048, 2048), torch.randn(2048, 2048)
    gpus = ["A100-PCIE-40GB", "V100-PCIE-32GB"]
    saved = torch.backends.cuda.matmul.allow_tf32  # a settings object monkeypatch cannot patch
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32 = fxcost.profile(lin, (x,), devices=gpus, measure=False, cost_model="roofline")
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = fxcost.profile(lin, (x,), devices=gpus, measure=False, cost_model="roofline")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert all(n.tf32 for n in tf32.nodes if n.op == "aten.addmm.default")
    assert not any(n.tf32 for n in fp32.nodes)
    assert tf32.total_ms("A100-PCIE-40GB") < fp32.total_ms("A100-PCIE-40GB") / 4  # 156 vs 19.5 TFLOPS
    assert tf32.total_ms("V100-PCIE-32GB") == pytest.approx(fp32.total_ms("V100-PCIE-32GB"))  # no TF32
    assert fxcost.Report.from_json(tf32.to_json()).nodes[0].tf32 == tf32.nodes[0].tf32


def test_convolutions_follow_cudnn_tf32_setting() -> None:
    import torch
    from torch import nn

    import fxcost

    saved = torch.backends.cudnn.allow_tf32
    try:
        for allowed in (True, False):
            torch.backends.cudnn.allow_tf32 = allowed
            report = fxcost.profile(
                nn.Conv2d(3, 8, 3), (torch.randn(2, 3, 16, 16),), devices=["T4"], measure=False
            )
            convs = [n for n in report.nodes if n.op.startswith("aten.convolution")]
            assert len(convs) == 2 and all(n.tf32 is allowed for n in convs)  # forward and backward
    finally:
        torch.backends.cudnn.allow_tf32 = saved
