"""The per-node record: the one object fxcost stores on a graph node.

Every pass reads and writes ``node.meta["fxcost"]``, an instance of :class:`NodeCost`; nothing else is
stored on nodes. A :class:`~fxcost.report.Report` is a list of these records (plus per-graph facts), so
the same type is what users see in ``report.nodes`` and what a JSON trace stores.

Units are in the field names: ``*_ms`` milliseconds, ``bytes_*`` bytes, ``flops`` floating point ops.
``None`` always means *unknown* (never "free"); a node that launches no kernel says so in ``has_kernel``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["META_KEY", "PHASES", "GraphRecord", "KernelRecord", "NodeCost", "Phase", "Shape"]

META_KEY = "fxcost"

Phase = Literal["fw", "bw", "opt"]
PHASES: tuple[Phase, ...] = ("fw", "bw", "opt")

Shape = tuple[int, ...]


@dataclass(slots=True)
class KernelRecord:
    """One GPU kernel launched by a node, as recorded by torch.profiler on the origin device."""

    name: str
    duration_ms: float
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelRecord:
        grid, block = d.get("grid"), d.get("block")
        return cls(
            name=str(d["name"]),
            duration_ms=float(d["duration_ms"]),
            grid=tuple(grid) if grid is not None else None,
            block=tuple(block) if block is not None else None,
            registers_per_thread=d.get("registers_per_thread"),
            shared_memory_bytes=d.get("shared_memory_bytes"),
        )


@dataclass(slots=True)
class NodeCost:
    """Everything fxcost knows about one call node of a captured ATen graph.

    Attributes:
        name: the FX node name, unique within its graph.
        op: canonical ATen overload, e.g. ``"aten.mm.default"`` (``"operator.getitem"`` for tuple access).
        phase: ``"fw"`` forward, ``"bw"`` backward, ``"opt"`` optimizer step.
        graph: index of the captured graph the node belongs to (see ``Report.graphs``).
        module: dotted path of the owning ``nn.Module`` (``""`` for the root); backward nodes carry the
            module whose forward they differentiate.
        in_shapes, in_dtypes: tensor arguments, in schema order (lists of tensors are flattened).
        out_shapes, out_dtypes: tensor results.
        args: the op's non-tensor arguments by schema name (``dim``, ``kernel_size``, ...), normalized.
        flops: floating point operations, ``None`` where no formula applies.
        bytes_read, bytes_written: DRAM traffic of a kernel reading each input and writing each output
            once; ``0`` for nodes that launch no kernel.
        has_kernel: False for views, aliases and tuple access, which cost nothing on a GPU.
        inputs: names of the nodes of the same graph whose results this node reads (its data
            dependencies; graph inputs are not listed).
        tf32: an fp32 matmul or convolution that PyTorch lets run on TF32 tensor cores (the
            process's ``torch.backends.cuda.matmul.allow_tf32`` / ``cudnn.allow_tf32`` at capture).
        origin_ms: median measured time on the origin device, ``None`` if not measured.
        kernels: GPU kernels recorded on a CUDA origin.
        pred_ms: predicted milliseconds per canonical device name (``None`` where no model applies).
        pred_source: which cost model produced each prediction.
        note: why something is unknown, if it is.
    """

    name: str
    op: str
    phase: Phase
    graph: int = 0
    module: str = ""
    in_shapes: list[Shape] = field(default_factory=list)
    in_dtypes: list[str] = field(default_factory=list)
    out_shapes: list[Shape] = field(default_factory=list)
    out_dtypes: list[str] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)
    flops: int | None = None
    bytes_read: int | None = None
    bytes_written: int | None = None
    has_kernel: bool = True
    inputs: list[str] = field(default_factory=list)
    tf32: bool = False
    origin_ms: float | None = None
    kernels: list[KernelRecord] = field(default_factory=list)
    pred_ms: dict[str, float | None] = field(default_factory=dict)
    pred_source: dict[str, str] = field(default_factory=dict)
    note: str | None = None

    @property
    def shapes(self) -> list[Shape]:
        """Input tensor shapes (alias of ``in_shapes``)."""
        return self.in_shapes

    @property
    def kernel_ms(self) -> float | None:
        """The summed durations of the kernels recorded on the origin (the GPU time of the node,
        without the launch and event overhead in ``origin_ms``); None unless every one was timed."""
        durations = [k.duration_ms for k in self.kernels]
        if not durations or not all(math.isfinite(d) and d > 0 for d in durations):
            return None
        return sum(durations)

    @property
    def bytes(self) -> int | None:
        """Total DRAM traffic, read plus written, or ``None`` if unknown."""
        if self.bytes_read is None or self.bytes_written is None:
            return None
        return self.bytes_read + self.bytes_written

    def replace(self, **changes: Any) -> NodeCost:
        """A shallow copy with ``changes`` (three times faster than ``copy.copy`` on a slotted class,
        which matters where every distinct node of a step is re-priced per call)."""
        values = {name: getattr(self, name) for name in _NODE_FIELDS}
        values.update(changes)
        return NodeCost(**values)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kernels"] = [k.to_json() for k in self.kernels]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeCost:
        d = dict(d)
        d["kernels"] = [KernelRecord.from_json(k) for k in d.get("kernels", [])]
        for key in ("in_shapes", "out_shapes"):
            d[key] = [tuple(s) for s in d.get(key, [])]
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown node fields {sorted(unknown)}; accepted: {sorted(names)}")
        return cls(**d)


_NODE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeCost))


@dataclass(slots=True)
class GraphRecord:
    """One captured ATen graph (a forward, backward or optimizer graph of one Dynamo frame).

    Attributes:
        index: position in the report.
        phase: the phase of its nodes.
        frame: Dynamo frame id; graph breaks give several frames, recompiles replace a frame's graphs.
        num_nodes: call nodes in the graph.
        measured_ms: median time of the whole graph run on the origin device, if measured.
    """

    index: int
    phase: Phase
    frame: int | None = None
    num_nodes: int = 0
    measured_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GraphRecord:
        return cls(**d)
