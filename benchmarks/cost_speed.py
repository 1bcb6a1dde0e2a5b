"""Cost speed: how long one estimate takes once a model is captured, against PyTorch's in-tree estimator.

For GPT-2 small (train, batch 8, seq 512) and ResNet-50 (train, batch 64), an :class:`fxcost.Estimator`
captures the training step once (timed), then prices it for ten devices not priced yet (each once, at
the traced batch) and for ten batch sizes not priced yet (on the capture device); each ``.cost()`` call
is timed with ``time.perf_counter`` and the median, min and max are reported.

The comparison is ``torch.distributed._tools.runtime_estimator.RuntimeEstimator`` in its
``operator-level-cost-model`` (roofline) mode over the same step (forward, loss, backward; no optimizer,
like fxcost's step) on fake tensors. It has no notion of a captured model: every estimate, for any
device or batch, runs the model again under ``FakeTensorMode``. Without CUDA it raises, and within
some ops aborts the process (a subprocess probe shows which); then a shim gives it the capture
device's datasheet peak FLOP/s and DRAM bandwidth (``fxcost.devices``) in place of the CUDA and
Triton queries, for the estimate only. For information, the roofline of
``torch._inductor.fx_passes.overlap_scheduling.estimate_roofline_runtime_ms`` over every node of
fxcost's captured ATen graphs (no re-trace) is timed too, under the same shim.

A search loop runs several estimators at once (Optuna's ``n_jobs``, Ray workers); ``--parallel N``
runs GPT-2's estimate loop (new devices, then new batches) in N spawned processes at once, each after
its own capture, all starting together.

    python benchmarks/cost_speed.py [--quick] [--device T4] [--repeats 3] [--parallel 4]

Last line: ``capture_s_gpt2=.. cost_ms_gpt2=.. cost_ms_resnet50=.. runtime_estimator_ms_gpt2=..
speedup_vs_runtime_estimator=..`` (and ``cost_ms_gpt2_parallel4=..`` with ``--parallel 4``);
``cost_ms_*`` is the median time of a ``.cost()`` for a new device (pooled over the processes for the
parallel one), and the speedup is the smaller over the two models of the in-tree estimator's ms per
estimate over it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

from fxcost import zoo
from fxcost.capture import CaptureOptions, FxcostBackend, default_loss, trace_step
from fxcost.estimator import Estimator
from fxcost.gpus import Device, get_device

# (zoo name, batch, config): the sizes, and smaller ones for a fast check. Tracing time grows
# with the layers, not the sizes.
MODELS: list[tuple[str, int, dict[str, Any]]] = [("gpt2", 8, {"seq": 512}), ("resnet50", 64, {})]
QUICK: list[tuple[str, int, dict[str, Any]]] = [
    ("gpt2", 8, {"seq": 128, "layers": 2}),
    ("resnet50", 16, {"image": 64}),
]
# Priced once each at the traced batch; none is the capture device (checked in main).
NEW_DEVICES = ("P100-PCIE-16GB", "V100-SXM2-16GB", "RTX3090", "RTX4090", "A10G", "L4", "L40S",
               "A100-SXM4-80GB", "H100-SXM", "H200")  # fmt: skip
# Priced once each on the capture device; none is a traced batch. Batch 1 is left out: Dynamo
# specializes it, so the symbolic graph may not hold there and fxcost would trace again.
NEW_BATCHES = (2, 3, 5, 12, 16, 24, 32, 48, 96, 128)

# Run in a subprocess: the estimator's CUDA check may raise or abort, depending on the torch version.
_PROBE = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.runtime_estimator import RuntimeEstimator
with FakeTensorMode():
    layer, x = torch.nn.Linear(64, 64), torch.randn(8, 64)
    with RuntimeEstimator()("operator-level-cost-model"):
        layer(x).sum().backward()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller models (2-layer gpt2 seq 128, resnet50 batch 16 on 64x64), one in-tree estimate",
    )
    parser.add_argument("--device", default="T4", help="capture device, priced with the capture")
    parser.add_argument("--repeats", type=int, default=3, help="in-tree estimates per model (median)")
    parser.add_argument(
        "--parallel",
        type=int,
        default=0,
        metavar="N",
        help="also run GPT-2's estimate loop in N processes at once, as a search loop's workers do",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    base = get_device(args.device)
    new_devices = [get_device(d).name for d in NEW_DEVICES if get_device(d).name != base.name][:10]
    models = QUICK if args.quick else MODELS
    repeats = 1 if args.quick else args.repeats
    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, cuda: {cuda}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip

    substitution = in_tree_substitution(base)
    print(f"in-tree estimator: {substitution}\n")

    rows = []
    for name, batch, config in models:
        label = f"{name} train b{batch}" + "".join(f" {k}{v}" for k, v in config.items())
        print(f"-- {label}", flush=True)
        row: dict[str, Any] = {"model": name, "label": label}
        row.update(time_fxcost(name, batch, config, base, new_devices))
        row.update(time_runtime_estimator(name, batch, config, base, repeats))
        row.update(time_inductor_roofline(name, batch, config, base, repeats))
        row["speedup"] = row["re_ms"] / statistics.median(row["device_ms"])
        rows.append(row)

    print()
    print_table(rows, base.name, len(new_devices))
    print(f"\nin-tree estimator: {substitution}")
    print("speedup = RuntimeEstimator ms per estimate / fxcost median ms per .cost() for a new device")
    parallel: dict[str, Any] = {}
    if args.parallel > 0:
        name, batch, config = models[0]
        print(f"\n-- {name}: the estimate loop in {args.parallel} processes at once", flush=True)
        parallel = time_parallel(args.parallel, name, batch, config, base, new_devices)
    sweep_points, sweep_s = time_sweep(1000 if args.quick else 10_000)
    print(f"sweep: {sweep_points} points (4 transformer widths x batches x 10 GPUs x 5 precisions) "
          f"in {sweep_s:.1f} s, traces included")  # fmt: skip
    print(f"({time.perf_counter() - start:.0f} s)")
    by_model = {r["model"]: r for r in rows}
    gpt2, resnet = by_model["gpt2"], by_model["resnet50"]
    print(f"capture_s_gpt2={gpt2['capture_s']:.2f} cost_ms_gpt2={statistics.median(gpt2['device_ms']):.3f} "
          f"cost_ms_resnet50={statistics.median(resnet['device_ms']):.3f} "
          f"runtime_estimator_ms_gpt2={gpt2['re_ms']:.1f} "
          f"speedup_vs_runtime_estimator={min(r['speedup'] for r in rows):.0f} "
          f"cost_ms_new_batch_gpt2={statistics.median(gpt2['batch_ms']):.3f} "
          f"cost_ms_new_batch_resnet50={statistics.median(resnet['batch_ms']):.3f} "
          f"sweep_points={sweep_points} sweep_s={sweep_s:.1f}"
          + (f" cost_ms_gpt2_parallel{args.parallel}={statistics.median(parallel['device_ms']):.3f}"
             if parallel else ""))  # fmt: skip
    return 0


def time_fxcost(
    name: str, batch: int, config: dict[str, Any], base: Device, devices: list[str]
) -> dict[str, Any]:
    """Capture once, then time ``.cost()`` for each new device and each new batch."""
    model, inputs = zoo.build(name, batch, **config)
    est = Estimator(devices=[base.name])
    t0 = time.perf_counter()
    predicted_ms = est.cost(model, inputs, train=True, device=base.name).ms
    capture_s = time.perf_counter() - t0
    captured = est.capture(model, inputs)
    timed = estimate_loop(est, model, inputs, batch, base, devices)
    print(f"   fxcost: capture {capture_s:.1f} s, new device {statistics.median(timed['device_ms']):.2f} ms, "
          f"new batch {statistics.median(timed['batch_ms']):.2f} ms", flush=True)  # fmt: skip
    return {
        "capture_s": capture_s,
        "fxcost_ms": predicted_ms,
        "distinct": len(captured.nodes),
        "kernels": int(captured.counts.sum()),
        "all_nodes": len(captured.report.nodes),
        **timed,
    }


def estimate_loop(
    est: Estimator, model: Any, inputs: Any, batch: int, base: Device, devices: list[str]
) -> dict[str, Any]:
    """Time ``.cost()`` for each new device (at the traced batch), then for each new batch (on the
    capture device), in ms; also the new batches that forced a re-trace."""

    def timed(**kw: Any) -> float:
        t = time.perf_counter()
        est.cost(model, inputs, train=True, **kw)
        return (time.perf_counter() - t) * 1e3

    device_ms = sorted(timed(device=d) for d in devices)
    batch_ms, retraced = [], []
    for b in NEW_BATCHES:
        if b != batch:
            traced = est.cache_info()["captures"]
            batch_ms.append(timed(device=base.name, batch_size=b))
            if est.cache_info()["captures"] > traced:  # the symbolic graph did not hold at b
                retraced.append(b)
    return {"device_ms": device_ms, "batch_ms": sorted(batch_ms), "retraced": retraced}


def time_parallel(
    workers: int, name: str, batch: int, config: dict[str, Any], base: Device, devices: list[str]
) -> dict[str, Any]:
    """:func:`estimate_loop` in ``workers`` processes at once (spawned, as a search loop's workers
    are): each builds and captures the model, all wait for the slowest capture, then run the loop
    together. Returns every worker's times, pooled."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_parallel_worker, args=(barrier, results, name, batch, config, base.name,
                                                        devices)) for _ in range(workers)]  # fmt: skip
    for p in procs:
        p.start()
    timed = [results.get() for _ in procs]
    for p in procs:
        p.join()
    failed = [t["error"] for t in timed if "error" in t]
    if failed:
        raise RuntimeError(f"{len(failed)} of {workers} parallel estimators failed: {failed[0]}")
    pooled = {k: sorted(x for t in timed for x in t[k]) for k in ("device_ms", "batch_ms")}
    medians = ", ".join(f"{statistics.median(t['device_ms']):.2f}" for t in timed)
    device_ms = statistics.median(pooled["device_ms"])
    print(f"   fxcost x{workers} processes at once: new device {device_ms:.2f} ms "
          f"(per process {medians}), new batch {statistics.median(pooled['batch_ms']):.2f} ms, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    return pooled


def _parallel_worker(
    barrier: Any, results: Any, name: str, batch: int, config: dict[str, Any], base: str, devices: list[str]
) -> None:
    try:
        model, inputs = zoo.build(name, batch, **config)
        est = Estimator(devices=[base])
        est.cost(model, inputs, train=True, device=base)  # the capture, not timed
        barrier.wait()
        results.put(estimate_loop(est, model, inputs, batch, get_device(base), devices))
    except Exception as e:  # the parent reports it; a worker that died silently would hang it
        barrier.abort()
        results.put({"error": f"{type(e).__name__}: {e}"})


def time_sweep(points: int) -> tuple[int, float]:
    """Wall time of ``fxcost.sweep`` over ``points`` points: four transformer-block widths (a trace
    each), batches 2 and up, ten GPUs, five precisions, in a fresh process-wide estimator."""
    from fxcost.estimator import clear_default_estimators
    from fxcost.gpus import device_names
    from fxcost.sweeps import Point, sweep

    clear_default_estimators()  # the traces are part of what a sweep costs
    devices = device_names()[:10]
    precisions = ("fp32", "tf32", "bf16", "fp16", None)
    batches = range(2, 2 + points // (4 * len(devices) * len(precisions)))
    configs = [{"seq": 64, "dim": width, "heads": 8} for width in (256, 512, 768, 1024)]
    grid = [Point("transformer_block", batch=b, device=d, precision=p, config=c)
            for c in configs for b in batches for d in devices for p in precisions]  # fmt: skip
    start = time.perf_counter()
    results = sweep(grid, progress=False)
    elapsed = time.perf_counter() - start
    failed = [r.error for r in results if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} sweep points failed, e.g. {failed[0]}")
    return len(grid), elapsed


def in_tree_substitution(base: Device) -> str:
    """Run the unshimmed estimator in a subprocess and say what stands in for it here, and why."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        return "RuntimeEstimator('operator-level-cost-model') as is (the probe ran: CUDA is present)"
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    how = f"exit {proc.returncode}" if proc.returncode > 0 else signal.Signals(-proc.returncode).name
    said = lines[-1] if proc.returncode > 0 else (lines[0] if lines else "")
    return (
        "RuntimeEstimator('operator-level-cost-model') with a datasheet shim. Unshimmed, its roofline raises "
        "AssertionError('... needs to access CUDA capabilities') on every op without CUDA; raised inside a "
        f"C++ dispatch (nn.Linear) that kills the process (probe of Linear fw+bw: {how}, {said!r}). The shim "
        "makes torch.cuda.is_available() true and answers torch.utils._runtime_estimation's "
        f"get_device_tflops / get_gpu_dram_gbps with {base.name}'s spec sheet ({base.fp32_tflops} fp32 "
        f"TFLOP/s, {base.mem_bandwidth_gbps} GB/s), during the estimate only; the step runs on CPU fake "
        "tensors"
    )


@contextlib.contextmanager
def datasheet_shim(device: Device) -> Iterator[None]:
    """The device queries of torch's roofline answered from ``device``'s spec sheet (no CUDA needed).

    Does nothing where CUDA is present: the estimator then queries the real GPU.
    """
    if torch.cuda.is_available():
        yield
        return
    import torch.utils._runtime_estimation as runtime_estimation

    def tflops(dtype: torch.dtype) -> float:
        # As torch._inductor.utils.datasheet_tops: TF32 for float32 when matmuls may use it.
        by_dtype = {torch.float16: device.fp16_tflops, torch.bfloat16: device.bf16_tflops}
        if dtype == torch.float32 and torch.backends.cuda.matmul.fp32_precision == "tf32":
            by_dtype[torch.float32] = device.tf32_tflops
        return float(by_dtype.get(dtype) or device.fp32_tflops or 0.0)

    with (
        mock.patch.object(torch.cuda, "is_available", return_value=True),
        mock.patch.object(runtime_estimation, "get_device_tflops", tflops),
        mock.patch.object(runtime_estimation, "get_gpu_dram_gbps", return_value=device.mem_bandwidth_gbps),
    ):
        yield


def time_runtime_estimator(
    name: str, batch: int, config: dict[str, Any], base: Device, repeats: int
) -> dict[str, Any]:
    """Median seconds of one full RuntimeEstimator estimate: the step run under FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator

    estimator = RuntimeEstimator()
    times_ms, predicted_ms = [], float("nan")
    with FakeTensorMode():
        model, inputs = zoo.build(name, batch, **config)  # not timed: built once, like fxcost's model
        for _ in range(repeats):
            for p in model.parameters():
                p.grad = None  # every estimate sees the same step (no gradient accumulation)
            # The estimator prints its total on exit; kept out of the table.
            with datasheet_shim(base), contextlib.redirect_stdout(io.StringIO()):
                t = time.perf_counter()
                with estimator("operator-level-cost-model"):
                    default_loss(model(*inputs)).backward()
                times_ms.append((time.perf_counter() - t) * 1e3)
            predicted_ms = estimator.total_runtime
    re_ms = statistics.median(times_ms)
    print(f"   RuntimeEstimator: {re_ms:.0f} ms per estimate (predicts {predicted_ms:.1f} ms)", flush=True)
    return {"re_ms": re_ms, "re_predicted_ms": predicted_ms}


def time_inductor_roofline(
    name: str, batch: int, config: dict[str, Any], base: Device, repeats: int
) -> dict[str, Any]:
    """Median ms of summing ``estimate_roofline_runtime_ms`` over every node of fxcost's captured
    graphs (captured once more here, static shapes, not timed)."""
    from torch._inductor.fx_passes.overlap_scheduling import estimate_roofline_runtime_ms

    model, inputs = zoo.build(name, batch, **config)
    backend = FxcostBackend(CaptureOptions(devices=(), measure=False), run_graphs=False)
    trace_step(model, inputs, {}, backend, train=True)
    nodes = [n for gm in backend.graph_modules() for n in gm.graph.nodes if n.op == "call_function"]
    estimate: Callable[[torch.fx.Node], float] = estimate_roofline_runtime_ms
    times_ms, predicted_ms = [], float("nan")
    for _ in range(repeats):
        with datasheet_shim(base):
            t = time.perf_counter()
            predicted_ms = sum(estimate(n) for n in nodes)
            times_ms.append((time.perf_counter() - t) * 1e3)
    roofline_ms = statistics.median(times_ms)
    print(f"   inductor roofline over the captured graphs ({len(nodes)} nodes): {roofline_ms:.0f} ms "
          f"per estimate (predicts {predicted_ms:.1f} ms)", flush=True)  # fmt: skip
    return {"roofline_ms": roofline_ms, "roofline_predicted_ms": predicted_ms}


def print_table(rows: list[dict[str, Any]], base: str, n_devices: int) -> None:
    n_batches = len(rows[0]["batch_ms"])

    def spread(ms: list[float]) -> str:
        return f"{statistics.median(ms):7.3f} ({min(ms):.3f}-{max(ms):.3f})"

    print(f"{'':44s}" + "".join(f"{r['label']:>30s}" for r in rows))
    lines: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("fxcost capture (first .cost()), s", lambda r: f"{r['capture_s']:.2f}"),
        ("nodes: captured / kernel / distinct", lambda r: f"{r['all_nodes']}/{r['kernels']}/{r['distinct']}"),
        (f".cost() new device ({n_devices}), ms med (min-max)", lambda r: spread(r["device_ms"])),
        (f".cost() new batch ({n_batches}), ms med (min-max)", lambda r: spread(r["batch_ms"])),
        ("  new batches that forced a re-trace", lambda r: ",".join(map(str, r["retraced"])) or "none"),
        ("RuntimeEstimator per estimate, ms", lambda r: f"{r['re_ms']:.1f}"),
        ("speedup vs RuntimeEstimator (new device)", lambda r: f"{r['speedup']:.0f}x"),
        ("inductor roofline over captured graphs, ms", lambda r: f"{r['roofline_ms']:.1f}"),
        (f"predicted step on {base}: fxcost, ms", lambda r: f"{r['fxcost_ms']:.1f}"),
        (f"predicted step on {base}: RuntimeEstimator", lambda r: f"{r['re_predicted_ms']:.1f}"),
        (f"predicted step on {base}: inductor roofline", lambda r: f"{r['roofline_predicted_ms']:.1f}"),
    ]  # fmt: skip
    for title, cell in lines:
        print(f"{title:44s}" + "".join(f"{cell(r):>30s}" for r in rows))


if __name__ == "__main__":
    sys.exit(main())
