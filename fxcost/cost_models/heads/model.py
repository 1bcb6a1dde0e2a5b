"""The MLP heads as cost models: origin-free (``mlp``) and scaling an origin's measurement (``mlp_ratio``).

One small MLP per op class, in the spirit of Habitat §3.4 but built to generalize to GPUs never seen
in training (:mod:`~fxcost.cost_models.heads.features`). Inference is numpy, vectorized over all
nodes of a class at once; the elementwise head is read as a curve that never falls as tensors grow
(:mod:`~fxcost.cost_models.heads.elementwise`). Work the heads have no measurements of is priced as
the work it lowers to: a cuDNN RNN as its GEMMs and gate math, a memory-bound op as elementwise
passes moving the bytes its kernels move, a kernel bound by memory latency (batch norm's per-channel
kernels) never below its latency-bound time (:mod:`~fxcost.cost_models.latency`). Weights ship in
``fxcost/cost_models/weights`` (trained by ``fxcost train`` on the shared training data only).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np

from fxcost.cost_models.attention import attention_kind, fused_attention_ms
from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads.axis import AxisTables
from fxcost.cost_models.heads.elementwise import SizeTables
from fxcost.cost_models.heads.features import (
    CLOCKED_HEADS,
    LOWERED,
    Group,
    device_features,
    fp32_bytes,
    head_of,
    node_features,
)
from fxcost.cost_models.heads.lowered import Lowered, lowered_ms, lowered_work
from fxcost.cost_models.heads.sustained import GemmFit, load_gemm_fit, shipped_gemm_fit
from fxcost.cost_models.heads.tensor_core import TiledGemms
from fxcost.cost_models.heads.tensor_work import TensorWork, tensor_work
from fxcost.cost_models.heads.weights import load_trained, shipped_heads
from fxcost.cost_models.interface import NodeBatch, register
from fxcost.cost_models.mlp import MLP
from fxcost.gpus import Device
from fxcost.gpus.order import stronger_than, weaker_than
from fxcost.lowering import KernelSpec
from fxcost.lowering.attention import ATTENTION_OPS, attention_call
from fxcost.lowering.attention_kernels import FusedAttention, attention_work
from fxcost.lowering.composite import ROW_OPS
from fxcost.lowering.nodes import conv_gradients, forward_conv, is_conv_backward
from fxcost.records import NodeCost

__all__ = ["TILED_HEADS", "Heads", "HeadsRatio", "default_heads"]

TILED_HEADS = frozenset({"linear", "bmm"})
"""Op classes whose nodes the tiled GEMM model prices (:class:`Heads`), not an MLP."""


class Heads:
    """Origin-free cost model: each node predicted by the model of its op class.

    GEMMs are priced by their tiles and waves at the GPU's sustained rate
    (:mod:`~fxcost.cost_models.heads.tensor_core`): fp32 ones on CUDA cores, with the tiles and
    sustained shares fit to the measurements (``gemm``, :class:`~fxcost.cost_models.heads.sustained.GemmFit`);
    bf16, fp16 and TF32 ones, and convolutions in those precisions, on tensor cores. A TF32 node on a
    GPU without TF32 tensor cores runs its fp32 twin (a GEMM on CUDA cores, a convolution by the
    ``conv`` head), and a GPU that beats such a GPU is never priced slower than it. The MLP heads
    predict the rest: fp32 convolutions, elementwise ops, layer norm and softmax. A GEMM of another
    dtype (float64) has no model here (NaN: the next model of the chain prices it).

    Each instance keeps its own size tables (elementwise) and axis tables (the other heads);
    :func:`default_heads` is the instance the registered ``mlp`` and ``mlp_ratio`` models share.
    """

    name = "mlp"

    def __init__(self, heads: dict[str, MLP] | None = None, gemm: GemmFit | None = None) -> None:
        self.heads = shipped_heads() if heads is None else heads
        self.gemm = shipped_gemm_fit() if gemm is None else gemm
        self.size_tables = SizeTables()
        self.axis_tables = AxisTables(watts=self.gemm.watts)
        self.tiled = TiledGemms(self.gemm)

    @classmethod
    def load(cls, directory: str | Path) -> Heads:
        """The heads and GEMM fit ``fxcost train --out directory`` wrote.

        Raises:
            FileNotFoundError: the directory holds no trained heads or GEMM fit.
            ValueError: its clocked heads were trained against another GEMM fit than its ``gemm.json``
                (files of two trainings mixed): their efficiencies would read a bound they never saw.
        """
        (heads, watts), gemm = load_trained(directory), load_gemm_fit(directory)
        clocked = sorted(CLOCKED_HEADS & set(heads))
        if clocked and watts is not None and not math.isclose(watts, gemm.watts):
            raise ValueError(
                f"{directory}: heads.npz's {', '.join(clocked)} head was trained against a GEMM fit of "
                f"{watts:g} W per TFLOP/s and gemm.json holds {gemm.watts:g}: the files come from two "
                f"trainings; run `fxcost train --out {directory}` again"
            )
        return cls(heads, gemm)

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        # The same heads on the same batch and device give the same answer: computed once, whether
        # ``mlp`` or ``mlp_ratio`` (which shares the shipped instance) asks.
        key = ("heads.ms", id(self.heads), id(self.gemm), device)  # the Device, not its name: one changed
        # in place (fxcost.gpus.holdout.uncalibrated) is priced anew
        return batch.derived(key, lambda: self._predict(batch, device))

    def _predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        out = self._predict_heads(batch, device)
        tiled = batch.derived("heads.tensor", lambda: _tensor_works(batch))
        if tiled is not None:
            index, works = tiled
            # Kept with the batch: pricing it on another GPU reuses every GPU's kernel times.
            kept = batch.derived(f"heads.tensor.{id(self)}", dict)
            ms = self.tiled.predict(works, device, kept)
            tf32 = batch.derived("heads.tensor.tf32", lambda: np.array([w.kind == "tf32" for w in works]))
            lacking = tf32 & ~np.isfinite(ms)
            if lacking.any():  # a GPU without TF32 tensor cores runs the fp32 twin
                ms = np.where(lacking, self._twins_ms(batch, index, device), ms)
            if tf32.any():
                ms = self._below_untensored(batch, index, works, tf32, kept, ms, device)
            out[index] = np.where(np.isfinite(ms), ms, out[index])
        return out

    def _twins_ms(self, batch: NodeBatch, index: np.ndarray, device: Device) -> np.ndarray:
        """The times of ``batch``'s nodes at ``index`` as their fp32 twins on ``device`` (TF32 off: a
        GEMM on CUDA cores, a convolution by the ``conv`` head; a twin is never TF32, so this does not
        recurse)."""
        twins = batch.derived(
            "heads.tensor.twins",
            lambda: NodeBatch.of([dataclasses.replace(batch.nodes[i], tf32=False) for i in index]),
        )
        return self.predict(twins, device)

    def _below_untensored(
        self,
        batch: NodeBatch,
        index: np.ndarray,
        works: list[TensorWork],
        tf32: np.ndarray,
        kept: dict[object, object],
        ms: np.ndarray,
        device: Device,
    ) -> np.ndarray:
        """``ms`` (the tiled times of ``batch``'s nodes at ``index`` on ``device``) never above the time
        on a GPU it beats that has no TF32 tensor cores (a V100): that GPU runs the fp32 twin of a TF32
        node (``tf32``: which of ``works`` are), and a GPU that beats it is never slower."""
        for weaker in weaker_than(device):
            lacking = tf32 & np.isfinite(ms) & ~np.isfinite(self.tiled.predict(works, weaker, kept))
            if lacking.any():
                ms = np.where(lacking, np.fmin(ms, self._twins_ms(batch, index, weaker)), ms)
        return ms

    def _predict_heads(self, batch: NodeBatch, device: Device) -> np.ndarray:
        out = np.where(batch.has_kernel, np.nan, 0.0)
        try:
            device_features(device)
        except ValueError:  # a device without the spec values the heads need
            return out
        groups, lowered = batch.derived("heads", lambda: _groups(batch))
        for key, group in groups.items():
            head = key.partition(":")[0]
            if head not in self.heads:
                continue
            if key == "ew":
                out[group.index] = self.size_tables.ms(self.heads[head], group, device)
            else:
                along = self.axis_tables.ms(head, self.heads[head], group, device)
                out[group.index] = along * group.repeats
        if lowered is not None:  # a node's time is its work's; NaN if a head its work needs is missing
            work_ms = self.predict(lowered.work, device) if len(lowered.work) else np.zeros(0)
            out[lowered.nodes] = lowered_ms(work_ms, lowered, len(batch), device)[lowered.nodes]
        attention = batch.derived(
            "heads.attention",
            lambda: [i for i, n in enumerate(batch.nodes) if n.has_kernel and n.op in ATTENTION_OPS],
        )
        for i in attention:  # the kernel the target runs depends on the GPU
            out[i] = self._attention_ms(batch.nodes[i], device)
        return out

    def _attention_ms(self, node: NodeCost, device: Device) -> float:
        """A fused attention kernel's time from its structure, or the math backend's GEMMs and passes
        priced by the heads; NaN where neither applies. Like every head's, the time is that of the op
        timed alone: the kernel's plus the per-op overhead an eager step hides again.

        In GPU order by construction: a fused kernel's time is the largest of the GPU's own and that of
        every GPU that beats it (:func:`fxcost.gpus.order.stronger_than`) and runs a fused kernel too.
        A GPU that beats another has fewer GPUs above it, so it is never priced slower; and since the
        overhead taken back off grows with the GPUs a GPU beats, its kernel time is in order too."""
        own = self._attention_own_ms(node, device)
        if math.isnan(own[0]) or not own[1]:
            return own[0]
        above = (self._attention_own_ms(node, d) for d in stronger_than(device))
        return max([own[0], *(ms for ms, fused in above if fused and not math.isnan(ms))])

    def _attention_own_ms(self, node: NodeCost, device: Device) -> tuple[float, bool]:
        """:meth:`_attention_ms` on ``device`` alone, and whether it ran a fused kernel."""
        work = _attention_work(node, device)
        if work is None:
            return math.nan, False
        if isinstance(work, list):
            ms = self.predict(NodeBatch.of([w for w, _ in work]), device)
            return float(np.sum(ms * [c for _, c in work])), False
        fused_ms = self._fused_ms(node, work, device)
        return (math.nan, False) if fused_ms is None else (fused_ms + hidden_overhead_ms(device), True)

    def attention_spread_ms(self, node: NodeCost, device: Device) -> float:
        """How much longer than its own price a fused attention node may take on ``device``: its
        kernel's time with nothing overlapped (:func:`fused_attention_ms`'s ``serial``) less the
        overlapped one; 0 for other nodes, the math backend and what cannot be priced. (The node's
        price may be a stronger GPU's time, a hair above its own: :meth:`_attention_ms`.)"""
        work = _attention_work(node, device)
        if work is None or isinstance(work, list):
            return 0.0
        both = [self._fused_ms(node, work, device, serial) for serial in (False, True)]
        return 0.0 if None in both else max(both[1] - both[0], 0.0)  # type: ignore[operator]

    def _fused_ms(
        self, node: NodeCost, work: FusedAttention, device: Device, serial: bool = False
    ) -> float | None:
        """The fused kernel's time (:func:`fused_attention_ms`), at the rate the GEMMs are priced at."""
        call = attention_call(node)
        if call is None:
            return None
        sustained = self.tiled.sustained_tflops(device, attention_kind(call))
        return fused_attention_ms(call, work, device, sustained, serial)


def _attention_work(node: NodeCost, device: Device) -> FusedAttention | list[tuple[NodeCost, int]] | None:
    """The work of an attention node on ``device`` (:func:`attention_work`), None where it has none or
    lacks the arguments it is read from."""
    try:
        found = attention_work(node, device)
    except (IndexError, KeyError, TypeError, ValueError):  # a node without the arguments we read
        return None
    return None if found is None else found[1]


def _tensor_works(batch: NodeBatch) -> tuple[np.ndarray, list[TensorWork]] | None:
    """The positions and tiled work of the nodes the tiled GEMM model prices (None if none)."""
    found = [(i, tensor_work(n)) for i, n in enumerate(batch.nodes) if n.has_kernel]
    kept = [(i, w) for i, w in found if w is not None]
    if not kept:
        return None
    return np.array([i for i, _ in kept]), [w for _, w in kept]


def _broadcasts(node: NodeCost) -> bool:
    """Whether an elementwise node reads a tensor of another size than its output (a bias, a scalar
    tensor, an outer sum)."""
    if not node.out_shapes:
        return False
    numel = math.prod(node.out_shapes[0])
    return any(math.prod(s) != numel for s in node.in_shapes)


def _groups(batch: NodeBatch) -> tuple[dict[str, Group], Lowered | None]:
    """Nodes by head with their device-independent features, and the work of the lowered nodes (for
    every head, so the result does not depend on which heads a model holds)."""
    members: dict[str, list[tuple[int, NodeCost, float, list[float]]]] = {}
    work: list[tuple[int, NodeCost, int, KernelSpec | None]] = []
    lowered_nodes: list[int] = []
    for i, node in enumerate(batch.nodes):
        head = head_of(node) if node.has_kernel else None
        if head == LOWERED:
            runs = lowered_work(node)
            if runs is not None:  # an empty list: it launches nothing, and costs nothing
                lowered_nodes.append(i)
                work.extend((i, *run) for run in runs)
        elif head is not None and head not in TILED_HEADS:  # GEMMs: the tiled model's
            try:
                # The heads learned forward convolutions: a backward runs one per gradient.
                repeats = conv_gradients(node) if is_conv_backward(node) else 1
                node = forward_conv(node) if is_conv_backward(node) else node
                # A broadcast's bytes per element change as it grows: read along its rows instead.
                key = f"{head}:broadcast" if head == "ew" and _broadcasts(node) else head
                members.setdefault(key, []).append(
                    (i, node, repeats, node_features(head, node, fp32_bytes(node)))
                )
            except (IndexError, KeyError, TypeError, ValueError):
                pass  # shapes the head does not expect: left unpredicted, not a crash
    groups = {
        head: Group(
            index=[i for i, *_ in rows],
            batch=NodeBatch.of([n for _, n, *_ in rows]),
            repeats=np.array([r for *_, r, _ in rows], dtype=float),
            problem=[p for *_, p in rows],
        )
        for head, rows in members.items()
    }
    lowered = None
    if lowered_nodes:
        lowered = Lowered(
            nodes=np.array(lowered_nodes),
            owner=np.array([i for i, *_ in work], dtype=int),
            work=NodeBatch.of([sub for _, sub, *_ in work]),
            counts=np.array([count for _, _, count, _ in work], dtype=float),
            latency=[(j, spec) for j, (*_, spec) in enumerate(work) if spec is not None and spec.round_trips],
            row_op=np.array([batch.nodes[i].op in ROW_OPS for i, *_ in work], dtype=bool),
        )
    return groups, lowered


class HeadsRatio:
    """Runtime-based prediction for kernel-varying ops: the origin measurement scaled by the ratio of
    the heads' predictions on the target and on the origin GPU.

    The measurement carries what the heads miss about this exact shape on real hardware (a
    well-aligned GEMM's better kernel, a harness's overhead); the heads carry how the op's time
    changes from one GPU to another. Where the origin's profiler timed the node's kernels, the ratio
    scales that kernel time and the target's per-op overhead is added: the event-timed ``origin_ms``
    carries the origin machine's launch overhead, which is no part of the GPU's speed. On the origin
    itself it returns the measurement.
    """

    name = "mlp_ratio"

    def __init__(self, heads: Heads | None = None) -> None:
        self.heads = heads or default_heads()

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        origin = batch.origin
        if origin is None:
            return np.full(len(batch), np.nan)
        on_origin = batch.derived("mlp_ratio.origin", lambda: self.heads.predict(batch, origin))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = self.heads.predict(batch, device) / on_origin
        if device != origin:
            timed = np.isfinite(batch.kernel_ms)
            scaled = np.where(timed, device.overhead_ms + batch.kernel_ms * ratio, batch.origin_ms * ratio)
        else:
            scaled = batch.origin_ms
        out = np.where(on_origin > 0, scaled, np.nan)
        return np.where(batch.has_kernel, out, 0.0)


@functools.cache
def default_heads() -> Heads:
    """The shipped heads as one instance, shared by every default ``mlp`` and ``mlp_ratio`` model: one
    set of size tables, and their predictions on a batch computed once whichever model asks."""
    return Heads()


@register("mlp")
def _mlp() -> Heads:
    return default_heads()


@register("mlp_ratio")
def _mlp_ratio() -> HeadsRatio:
    return HeadsRatio()
