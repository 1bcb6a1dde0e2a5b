"""The event simulator (Proteus §VI-B): per rank a compute stream and three communication streams.

Tasks run in their stream's order, each once the tasks it depends on have finished: compute,
*feature* communication (activations: tensor-parallel all-reduces, pipeline sends; the compute
stream waits for them), *gradient* communication (data-parallel reductions, asynchronous) and
*param* communication (ZeRO-3/FSDP parameter all-gathers, issued ahead of the compute that needs
them, on their own stream as FSDP does). The simulator takes tasks in order of their earliest start.
A compute task is slowed by the overlap factor ``gamma`` for each part of its unslowed duration that
a gradient or param transfer of its rank runs beside (Proteus §VI-C: kernels and NCCL share SMs and
memory bandwidth), whether the transfer was running when the kernel started or starts while it runs:
a compute task ends, and what waits for it starts, only once every transfer that starts inside it is
known. (A transfer starting in the slowdown itself, after the unslowed duration, does not slow it.)

Ranks that do the same work (the data-parallel and tensor-parallel peers of a pipeline stage) are
simulated once: one track per stage.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GAMMA", "STREAMS", "Task", "simulate_tasks", "to_chrome_trace"]

STREAMS = ("compute", "feature", "gradient", "param")

# Proteus §VI-C's overlap factor: how much longer kernels take while gradients are reduced beside
# them. Proteus profiles it per machine and model; 0.1 is in the middle of the slowdowns it and
# others report for NCCL sharing SMs and memory bandwidth with compute. Not fitted here.
GAMMA = 0.1


@dataclass
class Task:
    """One unit of work on one stage's stream; ``start_ms``/``end_ms`` are set by the simulation."""

    name: str
    stage: int
    stream: str
    duration_ms: float
    deps: list[int] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)
    start_ms: float = -1.0
    end_ms: float = -1.0


def simulate_tasks(tasks: Sequence[Task], gamma: float = 0.0) -> float:
    """Schedule ``tasks`` (dependencies by index into ``tasks``); returns the makespan in ms.

    Raises:
        ValueError: a stream's order contradicts the dependencies (a deadlock), or a bad dependency.
    """
    queues: dict[tuple[int, str], list[int]] = {}
    dependents: list[list[int]] = [[] for _ in tasks]
    for i, task in enumerate(tasks):
        if task.stream not in STREAMS:
            raise ValueError(f"task {task.name!r} has stream {task.stream!r}; streams: {', '.join(STREAMS)}")
        if any(not 0 <= d < len(tasks) or d == i for d in task.deps):
            raise ValueError(f"task {task.name!r} has a dependency outside the task list: {task.deps}")
        queues.setdefault((task.stage, task.stream), []).append(i)
        for d in set(task.deps):
            dependents[d].append(i)
    keys = list(queues)
    order = {key: n for n, key in enumerate(keys)}  # ties go to the stream seen first
    queue_of = {i: key for key, queue in queues.items() for i in queue}
    heads = dict.fromkeys(queues, 0)
    free = dict.fromkeys(queues, 0.0)
    waiting = [len(set(task.deps)) for task in tasks]  # dependencies not finished yet
    transfers: dict[int, list[tuple[float, float]]] = {}  # gradient and param spans by stage
    running: dict[int, int] = {}  # the compute task running on each stage, its end not yet known
    # Events by time: a running compute task's end (kind 0), then the tasks that can start (the next
    # of their stream, dependencies done), communication (1) before compute (2), then by stream: an
    # order that makes runs repeatable (a kernel counts a transfer starting with it either way).
    events: list[tuple[float, int, int, int]] = []
    done = 0

    def offer(key: tuple[int, str]) -> None:
        queue = queues[key]
        if heads[key] < len(queue) and waiting[i := queue[heads[key]]] == 0:
            start = max([free[key], *(tasks[d].end_ms for d in tasks[i].deps)])
            heapq.heappush(events, (start, 2 if key[1] == "compute" else 1, order[key], i))

    def finish(i: int) -> None:
        nonlocal done
        key = queue_of[i]
        free[key] = tasks[i].end_ms
        heads[key] += 1
        done += 1
        for j in dependents[i]:
            waiting[j] -= 1
        offer(key)
        for j in dependents[i]:  # a task waiting only for this one, next on its own stream, can start
            other = queue_of[j]
            if waiting[j] == 0 and other != key and queues[other][heads[other]] == j:
                offer(other)

    for key in keys:
        offer(key)
    while events:
        time, kind, _, i = heapq.heappop(events)
        task = tasks[i]
        if kind == 0:  # a compute task's end: later only if a transfer started inside it since
            if task.end_ms > time:
                heapq.heappush(events, (task.end_ms, 0, 0, i))
            else:
                del running[task.stage]
                finish(i)
            continue
        task.start_ms, task.end_ms = time, time + task.duration_ms
        if gamma > 0 and task.stream == "compute":
            spans = transfers.setdefault(task.stage, [])
            spans[:] = [span for span in spans if span[1] > time]  # later kernels start later still
            task.end_ms += gamma * _overlap(spans, time, task.end_ms)
            running[task.stage] = i
            heapq.heappush(events, (task.end_ms, 0, 0, i))
            continue
        if gamma > 0 and task.stream in ("gradient", "param"):
            transfers.setdefault(task.stage, []).append((time, task.end_ms))
            if (kernel := running.get(task.stage)) is not None:  # started at or before this transfer
                k = tasks[kernel]
                k.end_ms += gamma * max(0.0, min(task.end_ms, k.start_ms + k.duration_ms) - time)
        finish(i)
    if done < len(tasks):
        stuck = [tasks[q[heads[k]]].name for k, q in queues.items() if heads[k] < len(q)]
        raise ValueError(f"the schedule deadlocks: no stream can run its next task ({stuck[:4]})")
    return max((t.end_ms for t in tasks), default=0.0)


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


def to_chrome_trace(tasks: Sequence[Task], title: str = "fxcost simulation") -> dict[str, Any]:
    """The simulated timeline as a Chrome/Perfetto trace: a process per stage, a thread per stream."""
    events: list[dict[str, Any]] = []
    for stage in sorted({t.stage for t in tasks}):
        events.append(
            {"ph": "M", "pid": stage, "name": "process_name", "args": {"name": f"{title}: stage {stage}"}}
        )
        for tid, stream in enumerate(STREAMS):
            events.append(
                {"ph": "M", "pid": stage, "tid": tid, "name": "thread_name", "args": {"name": stream}}
            )
    for t in tasks:
        if t.duration_ms <= 0:
            continue
        tid = STREAMS.index(t.stream)
        events.append({"ph": "X", "pid": t.stage, "tid": tid, "name": t.name, "args": t.args,
                       "ts": t.start_ms * 1e3, "dur": (t.end_ms - t.start_ms) * 1e3})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}
