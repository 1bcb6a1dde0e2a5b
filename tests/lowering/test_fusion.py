"""Inductor's fusion on captured records (fxcost.lowering.fusion): which nodes share a kernel, and
the bytes a fused kernel moves."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from torch import nn

import fxcost
from fxcost.lowering.fusion import FusedKernel, fuse
from fxcost.records import NodeCost


class _Block(nn.Module):
    """A transformer-style MLP block: pointwise chains, a residual add and a layer norm."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(64, 256), nn.Linear(256, 64), nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.up(x)) * 2.0 + 1.0
        return self.norm(x + self.down(h))


class _Attention(nn.Module):
    """Attention written out op by op, as Hugging Face's eager attention does."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2)) / 8.0
        return torch.matmul(scores.softmax(dim=-1), v)


def _report(model: nn.Module, inputs: tuple[torch.Tensor, ...], train: bool) -> fxcost.Report:
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fxcost.profile(model, inputs, devices=["A100-PCIE-40GB"], measure=False, train=train)


@pytest.fixture(scope="module")
def block() -> fxcost.Report:
    return _report(_Block(), (torch.randn(32, 64),), train=False)


def _ops(report: fxcost.Report, kernel: FusedKernel) -> list[str]:
    return [report.nodes[i].op.removeprefix("aten.") for i in kernel.members]


def test_an_mlp_block_fuses_as_inductor_does(block) -> None:
    kernels = block.fused_kernels()
    groups = [(k.kind, _ops(block, k)) for k in kernels]
    # The GEMMs stay library calls, one node each; gelu, the scale and the shift share one kernel;
    # the residual add joins the layer norm's reduction.
    assert groups == [
        ("extern", ["addmm.default"]),
        ("pointwise", ["gelu.default", "mul.Tensor", "add.Tensor"]),
        ("extern", ["addmm.default"]),
        ("reduction", ["add.Tensor", "native_layer_norm.default"]),
    ]
    # Every node that launches a kernel is in exactly one kernel; views are in none.
    members = sorted(i for k in kernels for i in k.members)
    assert members == [i for i, n in enumerate(block.nodes) if n.has_kernel]


def test_a_fused_kernel_moves_fewer_bytes_than_its_members_apart(block) -> None:
    for kernel in block.fused_kernels():
        nodes = kernel.nodes(block.nodes)
        apart = sum(n.bytes or 0 for n in nodes)
        fused = kernel.bytes_read(block.nodes) + kernel.bytes_written(block.nodes)
        if len(nodes) > 1:
            assert 0 < fused < apart
        else:
            assert fused == apart
    pointwise = next(k for k in block.fused_kernels() if k.kind == "pointwise")
    # gelu -> mul -> add over 32x256 fp32: the chain reads the GEMM's output once and writes once.
    assert pointwise.bytes_read(block.nodes) == pointwise.bytes_written(block.nodes) == 32 * 256 * 4


def test_a_gemm_is_never_fused() -> None:
    report = _report(_Block(), (torch.randn(8, 64),), train=True)
    for kernel in report.fused_kernels():
        ops = _ops(report, kernel)
        if any(op.startswith(("mm.", "addmm.", "bmm.")) for op in ops):
            assert kernel.kind == "extern" and len(ops) == 1


def test_ranges_that_differ_do_not_fuse() -> None:
    def node(name: str, op: str, shape: tuple[int, ...], inputs: list[str], out: tuple[int, ...]) -> NodeCost:
        return NodeCost(name, op, "fw", in_shapes=[shape], in_dtypes=["float32"], out_shapes=[out],
                        out_dtypes=["float32"], inputs=inputs, bytes_read=0, bytes_written=0)  # fmt: skip

    nodes = [
        node("relu", "aten.relu.default", (8, 16), [], (8, 16)),
        node("rows", "aten.sum.dim_IntList", (8, 16), ["relu"], (8, 1)),  # over the relu's elements
        node("cols", "aten.sum.dim_IntList", (8, 16), ["relu"], (1, 16)),  # other reduction ranges
        node("other", "aten.exp.default", (4, 4), [], (4, 4)),  # independent, other size
    ]
    groups = [[nodes[i].name for i in k.members] for k in fuse(nodes)]
    assert groups == [["relu", "rows"], ["cols"], ["other"]]


def test_attention_written_out_becomes_one_kernel_in_inference_only() -> None:
    q = k = v = torch.randn(2, 4, 32, 16)
    inference = _report(_Attention(), (q, k, v), train=False)
    attention = [k for k in inference.fused_kernels() if k.kind == "attention"]
    assert len(attention) == 1
    ops = _ops(inference, attention[0])
    assert ops[0] == ops[-1] == "bmm.default" and "_softmax.default" in ops
    fused = attention[0].stands_for(inference.nodes)
    assert fused.in_shapes == [(8, 32, 16)] * 3 and fused.flops == 4 * 8 * 32 * 32 * 16
    training = _report(_Attention(), (q.requires_grad_(), k, v), train=True)
    assert not [k for k in training.fused_kernels() if k.kind == "attention"]


def test_fusion_is_a_function_of_the_records(block, tmp_path) -> None:
    block.save(tmp_path / "t.json")
    assert fxcost.Report.load(tmp_path / "t.json").fused_kernels() == block.fused_kernels()


def _node(name: str, op: str, shape: tuple[int, ...], inputs: list[str], out: str = "float32") -> NodeCost:
    return NodeCost(name, op, "fw", in_shapes=[shape], in_dtypes=["float32"], out_shapes=[shape],
                    out_dtypes=[out], inputs=inputs, has_kernel=op != "aten.view.default", bytes_read=0,
                    bytes_written=0)  # fmt: skip


def test_a_view_between_two_pointwise_ops_does_not_split_their_kernel() -> None:
    # gelu computed in fp32 under autocast, viewed to 2-d and cast to bf16 for the next GEMM: one
    # kernel (Inductor's loops read through views), which writes only the bf16 cast.
    nodes = [
        _node("x", "aten.relu.default", (4, 8, 16), []),
        _node("tanh", "aten.tanh.default", (4, 8, 16), ["x"]),
        _node("flat", "aten.view.default", (32, 16), ["tanh"]),
        _node("cast", "aten._to_copy.default", (32, 16), ["flat"], out="bfloat16"),
    ]
    (kernel,) = fuse(nodes)
    assert kernel.members == (0, 1, 3)
    assert kernel.bytes_written(nodes) == 32 * 16 * 2


def _conv_bn_relu(batch: int, size: int) -> fxcost.Report:
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())
    return _report(model, (torch.randn(batch, 3, size, size),), train=True)


def test_a_batch_norm_over_many_elements_splits_and_rereads_its_input() -> None:
    """Inductor splits a batch norm's reduction over 8 x 30 x 30 elements per channel; its
    normalization (with the relu) then reads the input again in a kernel of its own. Over 2 x 4 x 4
    it does not: one kernel, one read."""

    from fxcost.lowering.fusion_rules import split_reduction

    for batch, size, splits in ((8, 32, True), (2, 6, False)):
        report = _conv_bn_relu(batch, size)
        bn = next(i for i, n in enumerate(report.nodes) if "batch_norm" in n.op and n.phase == "fw")
        assert split_reduction(report.nodes[bn]) is splits
        kernel = next(k for k in report.fused_kernels() if bn in k.members)
        assert kernel.kind == "reduction" and "relu.default" in _ops(report, kernel)
        if not splits:
            assert kernel.splits(report.nodes) == [] and kernel.launches(report.nodes) == 1
            continue
        split = kernel.splits(report.nodes)
        assert [kernel.members[k] for k in split] == [bn] and kernel.launches(report.nodes) == 3
        x = batch * 16 * (size - 2) ** 2 * 4  # the convolution's fp32 output, the batch norm's input
        whole = kernel.bytes_read(_unsplit(report.nodes, [bn]))
        assert whole + x <= kernel.bytes_read(report.nodes) <= whole + x + 1024  # + its 16-channel parameters
    evaluated = NodeCost("bn", "aten.native_batch_norm.default", "fw", in_shapes=[[8, 16, 30, 30]],
                         args={"training": False})  # fmt: skip
    assert not split_reduction(evaluated)
    layer_norm = next(n for n in _report(_Block(), (torch.randn(32, 64),), train=True).nodes
                      if "layer_norm" in n.op)  # fmt: skip
    assert not split_reduction(layer_norm)  # a row reduction to many rows: one loop


def test_the_safe_softmax_of_sdpas_math_path_is_a_generated_reduction() -> None:
    """Inductor generates ``_safe_softmax`` (``triton_per_fused__safe_softmax_add_..._native_dropout``
    in the BERT-large H100 step), so it fuses with the mask's add and the dropout like ``_softmax``."""
    from fxcost.lowering.fusion_rules import node_ranges

    shape = [2, 4, 8, 8]
    node = NodeCost("s", "aten._safe_softmax.default", "fw", in_shapes=[shape], in_dtypes=["float32"],
                    out_shapes=[shape], out_dtypes=["float32"], args={"dim": -1})  # fmt: skip
    assert node_ranges(node) == ((2 * 4 * 8, 8), True)


def _unsplit(nodes: list[NodeCost], batch_norms: list[int]) -> list[NodeCost]:
    """``nodes`` with the given batch norms (and their backwards) on running statistics: nothing to
    reduce, so nothing splits."""
    out = list(nodes)
    for i in batch_norms:
        out[i] = replace(nodes[i], args={**nodes[i].args, "training": False, "train": False})
    return out


class _Downsample(nn.Module):
    """ResNet's downsampling block end: two batch norms, one per branch, added, then a relu."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(3, 16, 1)
        self.bn_a, self.bn_b = nn.BatchNorm2d(16), nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn_a(self.a(x)) + self.bn_b(self.b(x)))


def test_two_split_batch_norms_in_one_kernel_each_reduce_apart_and_are_read_again() -> None:
    """Both branches' batch norms join the add and relu in one kernel: two partial and two final
    reductions, one pointwise pass that reads both inputs again; in the backward too, with the
    relu's gradient the pointwise pass recomputes from its inputs."""
    report = _report(_Downsample(), (torch.randn(8, 3, 16, 16),), train=True)
    x = 8 * 16 * 16 * 16 * 4  # each convolution's fp32 output
    for phase in ("fw", "bw"):
        kernel = next(k for k in report.fused_kernels() if k.kind == "reduction"
                      and sum("batch_norm" in report.nodes[m].op for m in k.members) == 2
                      and report.nodes[k.members[0]].phase == phase)  # fmt: skip
        splits = kernel.splits(report.nodes)
        assert len(splits) == 2 and kernel.launches(report.nodes) == 5
        unsplit = _unsplit(report.nodes, [kernel.members[k] for k in splits])
        reread = kernel.bytes_read(report.nodes) - kernel.bytes_read(unsplit)
        assert reread >= 2 * x, phase  # both inputs (and, backward, the gradients) read again
