"""A plan compiled from a few traced layers, deepened to the whole model's layers.

A model of hundreds of layers need not be traced whole: its layers are a few modules repeated, so
tracing a few and repeating them gives the deep model's stages (:func:`deepen`): two layers of a
model whose layers are alike, two dense and one sparse of a DeepSeek (:func:`layer_sources`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from fxcost._checks import positive_int
from fxcost.sim.plan import Plan, Segment, StagePlan, add_layer_collectives, layer_of
from fxcost.sim.recompute import activations
from fxcost.sim.schedule import assign_chunks, virtual_stages
from fxcost.sim.strategy import Strategy

__all__ = ["deepen", "layer_sources"]


def layer_sources(layers: int | Sequence[int], traced: int) -> tuple[int, ...]:
    """The traced layer (of ``traced``) each of the deep model's layers repeats: ``layers`` a depth, the
    first traced layers then the last one repeated (layer ``i`` repeats ``min(i, traced - 1)``), or one
    traced index per layer, for a model whose layers are of kinds (DeepSeek's dense layers before its
    sparse ones: :meth:`fxcost.zoo.decoders.Decoder.layer_sources`).

    Raises:
        ValueError: a depth below 1, or an index that names no traced layer.
    """
    if isinstance(layers, int):
        return tuple(min(i, traced - 1) for i in range(positive_int("layers", layers)))
    sources = tuple(layers)
    if not sources or any(not 0 <= i < traced for i in sources):
        raise ValueError(
            f"layer sources {sources} must each be the index of one of the {traced} traced layers"
        )
    return sources


def deepen(plan: Plan, params: Mapping[str, int], strategy: Strategy, layers: int | Sequence[int]) -> Plan:
    """``plan``, compiled with one pipeline stage for a model of a few layers, as the plan of
    the same model ``layers`` layers deep under ``strategy`` (its pipeline stages included); ``layers``
    a depth or each layer's traced layer (:func:`layer_sources`).

    Each deep layer repeats its traced layer (compute, tensor-parallel collectives, saved activations):
    for a depth, the first deep layers are the traced ones (the first layer's backward has no residual
    gradient to add) and the rest repeat the last traced layer; the embeddings stay on
    the first stage, the head and loss on the last. The data-parallel and ZeRO collectives are placed
    again for the new layers. ``params``: the traced model's parameter counts by module path.

    Raises:
        ValueError: ``plan`` has more than one stage or no layers, it was compiled for other data,
            tensor or sequence parallelism or micro-batches than ``strategy``, ``strategy``'s ``pp x
            vpp`` virtual stages exceed the layers, or ``layers`` is no depth or names no traced layer.
    """
    s = strategy
    if len(plan.stages) != 1 or not plan.stages[0].layers:
        raise ValueError(f"deepen takes a one-stage plan with layers; got {len(plan.stages)} stage(s)")
    p = plan.strategy
    if (p.dp, p.tp, p.sp, p.micro_batches, p.ep, p.cp) != (s.dp, s.tp, s.sp, s.micro_batches, s.ep, s.cp):
        raise ValueError(f"deepen: the plan was compiled for {p}, not the dp, tp, sp, mb, ep and cp of {s}")
    stage = plan.stages[0]
    traced = stage.layers
    sources = layer_sources(layers, len(traced))
    placed = virtual_stages(len(sources), s.pp, s.vpp)  # (stage, chunk) of each layer; raises if too few
    prefix = traced[-1].rpartition(".")[0]
    names = [f"{prefix}.{i}" if prefix else str(i) for i in range(len(sources))]
    source = {name: traced[j] for name, j in zip(names, sources, strict=True)}

    def parts(segments: list[Segment]) -> tuple[list[Segment], dict[str, list[Segment]], list[Segment]]:
        """(the segments before the layers, each traced layer's, those after the layers)"""
        inside = [i for i, seg in enumerate(segments) if seg.layer]
        by_layer = {layer: [seg for seg in segments if seg.layer == layer] for layer in traced}
        return segments[: inside[0]], by_layer, segments[inside[-1] + 1 :]

    def copied(segments: list[Segment], layer: str | None = None) -> list[Segment]:
        return [replace(seg, layer=seg.layer if layer is None else layer, before=[], inside=list(seg.inside),
                        after=[]) for seg in segments]  # fmt: skip

    embed_fw, layer_fw, head_fw = parts(stage.forward)
    head_bw, layer_bw, embed_bw = parts(stage.backward)
    stage_of_layer = {layer: placed[i][0] for i, layer in enumerate(names)}
    stages = []
    for index in range(s.pp):
        mine = [layer for layer in names if stage_of_layer[layer] == index]
        forward = [seg for layer in mine for seg in copied(layer_fw[source[layer]], layer)]
        backward = [seg for layer in reversed(mine) for seg in copied(layer_bw[source[layer]], layer)]
        if index == 0:
            forward, backward = copied(embed_fw) + forward, backward + copied(embed_bw)
        if index == s.pp - 1:
            forward, backward = forward + copied(head_fw), copied(head_bw) + backward
        stages.append(StagePlan(index, mine, forward, backward, 0, 0.0, 0.0))
    deep = {module: count for module, count in params.items() if not layer_of(module, set(traced))}
    for name in names:  # each layer's modules by path, so that its experts' stay apart (sim.moe)
        layer = source[name]
        deep.update({name + module[len(layer) :]: count for module, count in params.items()
                     if layer_of(module, set(traced)) == layer})  # fmt: skip
    assign_chunks(stages, {layer: placed[i][1] for i, layer in enumerate(names)}, s.vpp)
    add_layer_collectives(stages, deep, set(names), s, plan.itemsize)
    for st in stages:
        st.activation_bytes, st.recompute_bytes = activations(st.forward, s, plan.boundary_bytes)
    return Plan(s, stages, plan.boundary_bytes, plan.hidden, plan.tokens, plan.itemsize,
                plan.compute_interval)  # fmt: skip
