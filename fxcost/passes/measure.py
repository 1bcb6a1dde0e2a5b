"""Measurement pass: time every node of a captured graph on the device its inputs live on (Habitat §4.1).

The graph runs once under a :class:`torch.fx.Interpreter` on the real inputs of its first call; each
call node is then re-run in isolation on those same arguments, warm-ups then repeats, and the median
is written to ``NodeCost.origin_ms``. On CUDA a further pass under torch.profiler records each node's
kernels (name, grid, block, registers, shared memory, duration). Finally the whole graph is timed,
which gives the capture fidelity: the sum of node times against the time of the graph as one piece.

The user's tensors are never changed: the random-number state is restored afterwards, and when the
graph mutates anything (an optimizer step), it runs on clones of its inputs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_map

from fxcost.bench.profiling import kernel_range, recording_kernels
from fxcost.bench.timing import bench_ms
from fxcost.records import META_KEY, GraphRecord, NodeCost

__all__ = ["NODE_REPS", "Progress", "run"]

Progress = Callable[[int, int], None]

log = logging.getLogger(__name__)

# Fresh allocations make the first calls of an op slow on the CPU (page faults); with one warm-up and
# three repetitions the node times of ResNet-50 summed to 1.3x its eager step, with two and five to
# 1.0-1.1x. Used for whole graphs and steps as well, so both sides of the fidelity ratio match.
NODE_REPS = {"warmup": 2, "min_reps": 5}


def run(
    gm: torch.fx.GraphModule,
    inputs: Sequence[Any],
    graph: GraphRecord | None = None,
    *,
    budget_ms: float = 10.0,
    profile_kernels: bool = True,
    progress: Progress | None = None,
) -> torch.fx.GraphModule:
    """Measure every annotated node of ``gm`` on ``inputs`` (and the whole graph into ``graph``).

    Args:
        gm: an annotated graph (see :mod:`fxcost.passes.annotate`).
        inputs: real tensors, as the graph receives them on its first call.
        graph: the graph's record; its ``measured_ms`` is set to the time of the whole graph.
        budget_ms: time budget of the repetitions per node.
        profile_kernels: on CUDA, also record each node's kernels with torch.profiler.
        progress: called as ``progress(done, total)`` after each node is timed.
    """
    device = _device_of(inputs)
    mutates = any(_is_mutating(n.target) for n in gm.graph.nodes if n.op == "call_function")

    def fresh_inputs() -> list[Any]:
        return _clone_tensors(list(inputs)) if mutates else list(inputs)

    with _isolated(device):
        _NodeTimer(gm, device, budget_ms, progress).run(*fresh_inputs())
        if profile_kernels and device.type == "cuda":
            _record_kernels(gm, fresh_inputs())
        if graph is not None:
            args = fresh_inputs()
            graph.measured_ms = bench_ms(lambda: gm(*args), device, budget_ms=4 * budget_ms, **NODE_REPS)
    return gm


class _NodeTimer(torch.fx.Interpreter):
    """Runs the graph, and after each call node re-runs that node alone to time it."""

    def __init__(
        self, gm: torch.fx.GraphModule, device: torch.device, budget_ms: float, progress: Progress | None
    ) -> None:
        super().__init__(gm)
        self.device = device
        self.budget_ms = budget_ms
        self.progress = progress
        self.total = sum(META_KEY in n.meta for n in gm.graph.nodes)
        self.done = 0

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        record: NodeCost | None = n.meta.get(META_KEY)
        if n.op != "call_function" or record is None:
            return result
        self._time(n, record)
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)
        return result

    def _time(self, n: torch.fx.Node, record: NodeCost) -> None:
        if not record.has_kernel and (self.device.type == "cuda" or not _is_aten(n.target)):
            record.origin_ms = 0.0  # no kernel: nothing to time on a GPU, a Python-level op on a CPU
            return
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        if _is_mutating(n.target):
            args, kwargs = _clone_tensors(args), _clone_tensors(kwargs)
        try:
            record.origin_ms = bench_ms(
                _call(n.target, args, kwargs), self.device, budget_ms=self.budget_ms, **NODE_REPS
            )
        except Exception as e:
            raise RuntimeError(f"fxcost measure failed on node={n.format_node()}") from e


def _record_kernels(gm: torch.fx.GraphModule, inputs: list[Any]) -> None:
    """Run the graph once more under torch.profiler, each node in its own kernel range."""

    class _Ranges(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            if n.op != "call_function":
                return super().run_node(n)
            with kernel_range(n.name):
                return super().run_node(n)

    with recording_kernels() as kernels:
        _Ranges(gm).run(*inputs)
    for n in gm.graph.nodes:
        record = n.meta.get(META_KEY)
        if record is not None:
            record.kernels = kernels.get(n.name, [])


def _call(target: Any, args: Any, kwargs: Any) -> Callable[[], Any]:
    return lambda: target(*args, **kwargs)


def _is_aten(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def _is_mutating(target: Any) -> bool:
    return _is_aten(target) and target._schema.is_mutable


def _clone_tensors(x: Any) -> Any:
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


def _device_of(inputs: Sequence[Any]) -> torch.device:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            return t.device
    return torch.device("cpu")


@contextlib.contextmanager
def _isolated(device: torch.device) -> Iterator[None]:
    """No autograd, no autocast (casts are explicit in ATen graphs), and the RNG state restored."""
    devices = [device.index if device.index is not None else 0] if device.type == "cuda" else []
    with (
        torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"),
        torch.no_grad(),
        torch.autocast(device.type, enabled=False),
    ):
        yield
