"""Deep models from a shallow trace (``simulate(..., layers=N)``), and the event engine's schedule."""

from __future__ import annotations

import graphlib
import random
from typing import Any

import pytest

from fxcost import zoo
from fxcost.sim import simulate
from fxcost.sim.engine import Task, simulate_tasks

DIM, SEQ, VOCAB = 64, 16, 256


def _gpt(layers: int) -> tuple[Any, Any]:
    return zoo.build("gpt2", 8, seq=SEQ, dim=DIM, heads=4, layers=layers, vocab=VOCAB)


@pytest.mark.parametrize(
    ("strategy", "cluster"),
    [
        ("dp=2,tp=2,pp=2,mb=4", "8xA100-SXM4-80GB"),
        ("dp=2,pp=3,mb=2,zero=3,recompute=1", "6xA100-SXM4-80GB"),
        ("tp=2,pp=2,mb=2,sp=1,recompute=1", "4xA100-SXM4-80GB"),
    ],
)
def test_two_traced_layers_stand_for_a_deep_model_exactly(strategy: str, cluster: str) -> None:
    deep_model, inputs = _gpt(6)
    shallow_model, _ = _gpt(2)
    whole = simulate(deep_model, strategy, cluster, example_inputs=inputs, batch=16)
    deepened = simulate(shallow_model, strategy, cluster, example_inputs=inputs, batch=16, layers=6)
    assert deepened.iteration_ms == pytest.approx(whole.iteration_ms, rel=1e-9)
    assert deepened.collectives == whole.collectives
    assert [m.total for m in deepened.memory] == pytest.approx([m.total for m in whole.memory], rel=1e-9)
    assert [m.params for m in deepened.memory] == [m.params for m in whole.memory]
    assert len(deepened.tasks) == len(whole.tasks)


def test_a_deep_model_refuses_more_stages_than_layers() -> None:
    model, inputs = _gpt(2)
    with pytest.raises(ValueError, match="pp=4 stages but the model has 3 layers"):
        simulate(model, "pp=4,mb=4", "4xA100-SXM4-80GB", example_inputs=inputs, batch=8, layers=3)
    with pytest.raises(ValueError, match="layers must be a whole number >= 1"):
        simulate(model, "pp=1", "1xA100-SXM4-80GB", example_inputs=inputs, batch=8, layers=0)


def _reference(tasks: list[Task], gamma: float) -> float:
    """The schedule by its definition, one event at a time: of every stream's next task whose
    dependencies have ended, the one that can start first starts (communication before compute at
    equal times, then the stream seen first), unless a running kernel ends first. A transfer's end is
    known when it starts (nothing slows it), so it counts as ended then; a kernel's only at its end.
    A kernel runs longer by ``gamma`` times each part of its unslowed duration that a gradient or
    param transfer of its stage runs beside, whether the transfer started before it or starts while
    it runs."""
    queues: dict[tuple[int, str], list[int]] = {}
    for i, t in enumerate(tasks):
        queues.setdefault((t.stage, t.stream), []).append(i)
    order = {key: n for n, key in enumerate(queues)}
    heads, free = dict.fromkeys(queues, 0), dict.fromkeys(queues, 0.0)
    ended, running = [False] * len(tasks), {}
    spans: dict[int, list[tuple[float, float]]] = {}

    def beside(a: float, b: float, stage: int) -> float:
        return sum(max(0.0, min(b, y) - max(a, x)) for x, y in spans.get(stage, []))

    while not all(ended):
        events = [((tasks[i].end_ms, 0, 0, i), i) for i in running.values()]
        for key, queue in queues.items():
            i = queue[heads[key]] if heads[key] < len(queue) else None
            if i is not None and i not in running.values() and all(ended[d] for d in tasks[i].deps):
                start = max([free[key], *(tasks[d].end_ms for d in tasks[i].deps)])
                events.append(((start, 1 + (key[1] == "compute"), order[key], i), i))
        (time, kind, _, _), i = min(events)
        t = tasks[i]
        if kind == 2:  # a kernel starts
            t.start_ms, running[t.stage] = time, i
        elif kind == 1:  # a transfer runs
            t.start_ms, t.end_ms = time, time + t.duration_ms
            if t.stream in ("gradient", "param"):
                spans.setdefault(t.stage, []).append((time, t.end_ms))
        for k in running.values():
            k_start, k_nominal = tasks[k].start_ms, tasks[k].start_ms + tasks[k].duration_ms
            tasks[k].end_ms = k_nominal + gamma * beside(k_start, k_nominal, tasks[k].stage)
        if kind < 2:  # a kernel or a transfer ends
            if kind == 0:
                del running[t.stage]
            ended[i], free[(t.stage, t.stream)] = True, t.end_ms
            heads[(t.stage, t.stream)] += 1
    return max(t.end_ms for t in tasks)


def _unscheduled(tasks: list[Task]) -> list[Task]:
    """Fresh copies of ``tasks``, not yet scheduled."""
    return [Task(t.name, t.stage, t.stream, t.duration_ms, list(t.deps)) for t in tasks]


def _random_tasks(rng: random.Random, n: int) -> list[Task]:
    tasks = []
    for i in range(n):
        deps = rng.sample(range(i), k=min(i, rng.randint(0, 2)))
        stream = rng.choice(("compute", "compute", "feature", "gradient", "param"))
        tasks.append(
            Task(f"t{i}", rng.randint(0, 2), stream, rng.choice((0.0, 1.0, 2.0, rng.random())), deps)
        )
    return tasks


@pytest.mark.parametrize("seed", range(40))
def test_the_engine_schedules_as_its_definition_says(seed: int) -> None:
    rng = random.Random(seed)
    n, gamma = rng.randint(1, 60), rng.choice((0.0, 0.1))
    tasks = _random_tasks(rng, n)
    copy = _unscheduled(tasks)
    assert simulate_tasks(tasks, gamma) == pytest.approx(_reference(copy, gamma), rel=1e-12)
    spans = [t.start_ms for t in tasks] + [t.end_ms for t in tasks]
    assert spans == pytest.approx([t.start_ms for t in copy] + [t.end_ms for t in copy], rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_the_engine_refuses_exactly_the_schedules_that_deadlock(seed: int) -> None:
    """Dependencies drawn from any task, later ones too: the engine raises when the dependencies and
    the streams' orders form a cycle, and otherwise schedules as its definition says."""
    rng = random.Random(seed)
    tasks = _random_tasks(rng, rng.randint(2, 30))
    for t in tasks:
        t.deps = rng.sample([j for j in range(len(tasks)) if tasks[j] is not t], k=rng.randint(0, 1))
    order = graphlib.TopologicalSorter({i: set(t.deps) for i, t in enumerate(tasks)})
    streams: dict[tuple[int, str], int] = {}
    for i, t in enumerate(tasks):  # a stream runs its tasks in list order
        if (t.stage, t.stream) in streams:
            order.add(i, streams[(t.stage, t.stream)])
        streams[(t.stage, t.stream)] = i
    try:
        order.prepare()
    except graphlib.CycleError:
        with pytest.raises(ValueError, match="deadlocks"):
            simulate_tasks(tasks, 0.1)
        return
    copy = _unscheduled(tasks)
    assert simulate_tasks(tasks, 0.1) == pytest.approx(_reference(copy, 0.1), rel=1e-12)


def test_a_recomputed_layer_all_reduces_its_tensor_parallel_activations_again() -> None:
    model, inputs = _gpt(2)
    plain = simulate(model, "tp=2,mb=2", "2xA100-SXM4-80GB", example_inputs=inputs, batch=8)
    again = simulate(model, "tp=2,mb=2,recompute=1", "2xA100-SXM4-80GB", example_inputs=inputs, batch=8)
    boundary = 8 // 2 * SEQ * DIM * 4  # a micro-batch's activations, fp32

    def tp_all_reduces(result: Any) -> int:
        return sum(n for (kind, group, nbytes), n in result.collectives.items()
                   if (kind, group, nbytes) == ("all_reduce", "tp", boundary))  # fmt: skip

    # Per micro-batch and layer: attention and MLP outputs forward, their gradients backward; the
    # recomputed forward all-reduces its two outputs once more.
    micro_batches, layers = 2, 2
    assert tp_all_reduces(plain) >= micro_batches * layers * 2 * 2
    assert tp_all_reduces(again) - tp_all_reduces(plain) == micro_batches * layers * 2
