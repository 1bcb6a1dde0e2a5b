"""Inductor's layout optimization: a conv net's activations channels-last in a compiled step.

PyTorch tensors are NCHW; cuDNN's tensor-core convolutions run on NHWC data, so in eager mode each
convolution (and its gradients) transposes what it reads and writes (``nchwToNhwcKernel``,
``nhwcToNchwKernel`` in the recorded H100 traces). Inductor instead picks channels-last strides for
the convolutions' inputs and outputs (``torch._inductor.config.layout_optimization``, on by default
on CUDA; ``GraphLowering.decide_layout_opt``), and the backward's convolutions follow the layouts
the forward saved: the compiled ResNet-50 on the H100 ran no transpose kernel at all. The
normalizations between convolutions then reduce channels-last data, in Inductor's own kernels
(batch norm is decomposed into reductions and pointwise ops, ``torch/_inductor/decomposition.py``),
not in ATen's NCHW batch-norm kernels.

:func:`channels_last` applies ``decide_layout_opt``'s rules to node records: a forward graph with
convolutions, no grouped convolution with more than one input channel per group, none with at least
twice as many input as output channels and a kernel wider than 1 (in training steps, the rules
Inductor applies to training graphs), not all convolutions with at most 64 channels each side, and
fewer than 300 nodes per convolution. Inference graphs are decided by the same FLOP-weighted
benchmark table Inductor uses. :func:`layout_transpose_ms` is the time a node's recorded eager
kernels spent transposing layouts: what a compiled, channels-last step does not run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from fxcost.records import NodeCost

__all__ = ["CONVOLUTION", "LAYOUT_KERNELS", "channels_last", "layout_transpose_ms"]

CONVOLUTION = "aten.convolution.default"

# cuDNN's layout conversion kernels around an NHWC tensor-core convolution of NCHW tensors.
LAYOUT_KERNELS = ("nchwToNhwcKernel", "nhwcToNchwKernel")

# decide_layout_opt's inference table: a convolution class's channels-last time over NCHW's.
_INFERENCE_MULTIPLIERS = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}
_NODES_PER_CONV = 300  # graphs with more nodes per convolution are skipped ("only a few conv")
_SMALL_CHANNELS = 64


def channels_last(nodes: Sequence[NodeCost]) -> bool:
    """Whether Inductor runs the step's convolutions channels-last (see the module docstring); the
    decision of the first forward graph holding convolutions (the backward follows it)."""
    training = any(n.phase == "bw" for n in nodes)
    graphs: dict[int, list[NodeCost]] = defaultdict(list)
    for n in nodes:
        graphs[n.graph].append(n)
    for graph in graphs.values():
        convs = [n for n in graph if n.op == CONVOLUTION and n.phase == "fw" and _weight(n) is not None]
        if convs:
            return _decide(graph, convs, training)
    return False


def layout_transpose_ms(node: NodeCost) -> float:
    """The recorded time of ``node``'s kernels that convert between NCHW and NHWC (0 without any)."""
    return sum(k.duration_ms for k in node.kernels if any(name in k.name for name in LAYOUT_KERNELS))


def _decide(graph: Sequence[NodeCost], convs: Sequence[NodeCost], training: bool) -> bool:
    if len(graph) >= _NODES_PER_CONV * len(convs):
        return False
    if not training:
        flops: dict[str, float] = defaultdict(float)
        for n in convs:
            flops[_kind(n)] += n.flops or 0
        total = sum(flops.values())
        return sum(flops[k] * m for k, m in _INFERENCE_MULTIPLIERS.items()) <= total
    kinds = [_kind(n) for n in convs]
    if "grouped" in kinds or any(_in_out(n) for n in convs):
        return False
    return not all(_small(n) for n in convs)


def _weight(node: NodeCost) -> tuple[int, ...] | None:
    """The weight shape of a 2-d convolution (out channels, in channels per group, kh, kw), or None."""
    if len(node.in_shapes) < 2 or len(node.in_shapes[1]) != 4:
        return None
    return tuple(node.in_shapes[1])


def _kind(node: NodeCost) -> str:
    weight = _weight(node) or (0, 0, 0, 0)
    if int(node.args.get("groups") or 1) > 1 and weight[1] > 1:
        return "grouped"
    if _small(node):
        return "small"
    if _in_out(node):
        return "in_out"
    return "default"


def _small(node: NodeCost) -> bool:
    weight = _weight(node) or (math.inf, math.inf)
    return weight[0] <= _SMALL_CHANNELS and weight[1] <= _SMALL_CHANNELS


def _in_out(node: NodeCost) -> bool:
    weight = _weight(node)
    return weight is not None and weight[0] * 2 <= weight[1] and weight[2] > 1
