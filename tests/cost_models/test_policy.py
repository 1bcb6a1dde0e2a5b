"""The prediction policy: which cost model predicts which node, with and without an origin GPU."""

from __future__ import annotations

import dataclasses

import pytest

from fxcost import cost_models
from fxcost.data.datasets import kernel_alike_node
from fxcost.lowering.nodes import gemm_node
from fxcost.records import NodeCost


def _graph(origin_ms: float | None = None) -> list[NodeCost]:
    """A matmul, a softmax, a GELU, an op no head covers, and a view (no kernel)."""
    nodes = [
        gemm_node("linear", 1, 512, 512, 512),
        kernel_alike_node("softmax", 512, 512),
        kernel_alike_node("gelu", 512, 2048),
        NodeCost(
            name="kthvalue",
            op="aten.kthvalue.default",
            phase="fw",
            in_shapes=[(512, 512)],
            in_dtypes=["float32"],
            out_shapes=[(512,), (512,)],
            out_dtypes=["float32", "int64"],
            bytes_read=4 * 512 * 512,
            bytes_written=12 * 512,
        ),
        NodeCost(name="view", op="aten.view.default", phase="fw", has_kernel=False),
    ]
    return [dataclasses.replace(n, origin_ms=origin_ms if n.has_kernel else None) for n in nodes]


def _sources(nodes: list[NodeCost], device: str) -> list[str]:
    return [n.pred_source[device] for n in nodes]


def test_origin_free_policy_uses_the_heads_then_the_roofline() -> None:
    nodes = _graph()
    cost_models.predict(nodes, ["T4"])  # the default policy, "auto"
    assert _sources(nodes, "T4") == ["mlp", "mlp", "mlp", "roofline", "mlp"]
    assert nodes[-1].pred_ms["T4"] == 0.0  # a view costs nothing
    assert all(n.pred_ms["T4"] > 0 for n in nodes[:-1])


def test_runtime_based_policy_scales_kernel_alike_ops_and_predicts_matmuls_with_heads() -> None:
    nodes = _graph(origin_ms=0.25)
    cost_models.predict(nodes, ["T4"], origin="V100-PCIE-32GB")
    # Kernel-alike nodes are wave-scaled from their V100 time; the matmul picks other kernels on
    # another GPU, so the heads' T4/V100 ratio scales its measured time.
    assert _sources(nodes, "T4") == [
        "mlp_ratio",
        "wave_scaling",
        "wave_scaling",
        "wave_scaling",
        "wave_scaling",
    ]
    heads_alone = _graph(origin_ms=0.25)
    cost_models.predict(heads_alone, ["T4", "V100-PCIE-32GB"], "mlp")
    ratio = heads_alone[0].pred_ms["T4"] / heads_alone[0].pred_ms["V100-PCIE-32GB"]
    assert nodes[0].pred_ms["T4"] == pytest.approx(0.25 * ratio)
    on_origin = _graph(origin_ms=0.25)
    cost_models.predict(on_origin, ["V100-PCIE-32GB"], origin="V100-PCIE-32GB")
    assert all(n.pred_ms["V100-PCIE-32GB"] == pytest.approx(0.25) for n in on_origin[:4])  # the measurement
    measured_on_cpu = _graph(origin_ms=0.25)
    cost_models.predict(measured_on_cpu, ["T4"], origin="cpu")  # a CPU time is no origin
    assert _sources(measured_on_cpu, "T4")[:3] == ["mlp", "mlp", "mlp"]


def test_overrides_give_single_ops_their_own_chain() -> None:
    nodes = _graph()
    cost_models.predict(nodes, ["T4"], overrides={"aten.mm.default": "roofline"})
    assert _sources(nodes, "T4")[:3] == ["roofline", "mlp", "mlp"]
    with pytest.raises(ValueError, match="unknown cost model 'nope'"):
        cost_models.predict(_graph(), ["T4"], overrides={"aten.mm.default": "nope"})


def test_autocast_bf16_matmuls_are_predicted_against_tensor_core_peaks() -> None:
    import torch
    from torch import nn

    import fxcost

    mlp = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024))

    class Autocast(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return mlp(x)

    x = torch.randn(2048, 1024)
    fp32 = fxcost.profile(mlp, (x,), devices=["H100-SXM"], measure=False)
    bf16 = fxcost.profile(Autocast(), (x,), devices=["H100-SXM"], measure=False)
    matmuls = [n for n in bf16.nodes if n.op in ("aten.addmm.default", "aten.mm.default")]
    assert matmuls and all(n.in_dtypes[-1] == "bfloat16" for n in matmuls)
    fw32 = sum(n.pred_ms["H100-SXM"] for n in fp32.nodes if n.op == "aten.addmm.default")
    fw16 = sum(n.pred_ms["H100-SXM"] for n in matmuls if n.op == "aten.addmm.default")
    # At this size an isolated op's fixed cost (launch, timing) is much of its time: faster, not 14x.
    assert fw16 < fw32 / 2
    # Where the work dominates, the tensor cores show: ~990 dense bf16 TFLOP/s against 67 fp32.
    big32 = gemm_node("linear", 1, 8192, 8192, 8192)
    big16 = dataclasses.replace(big32, in_dtypes=["bfloat16"] * 2, out_dtypes=["bfloat16"],
                                bytes_read=big32.bytes_read // 2, bytes_written=big32.bytes_written // 2,
                                pred_ms={}, pred_source={})  # fmt: skip
    cost_models.predict([big32, big16], ["H100-SXM"])
    assert big16.pred_ms["H100-SXM"] < big32.pred_ms["H100-SXM"] / 5
