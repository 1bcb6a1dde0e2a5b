"""How the origin-free heads hold on GPUs they were not fit on: the development metric.

Retrains the heads with each training GPU left out (LOO) and with each architecture generation left
out (LOGO: Pascal = P4 + P100, Volta = V100, Turing = T4, Ampere = A100), and predicts the left-out
GPUs' held-out rows (``ops_test``; for convolutions the hashed 10% of configurations no head trains
on) from their spec sheets alone. Beside it, in the same run: the same heads trained on every
training GPU, on the held-out rows of those GPUs (in distribution), and the roofline. A fold whose
GPUs share their generation with none of the others is both a LOO and a LOGO fold and is trained
once. Then the Hugging Face runs of each left-out GPU (``models/<GPU>/``) are predicted end to end
with the heads trained without it.

Also measured here: the calibration of the heads' intervals (:mod:`fxcost.cost_models.heads.intervals`).
For each left-out GPU, the interval is calibrated on the LOO errors of the *other* GPUs only, and the
share of its rows inside the nominal 80% interval is counted.

Folds train in parallel processes and keep their heads in ``--work`` (resumable: a fold already
trained is read back). ``--write-intervals`` writes the shipped interval file from every fold's LOO
errors, with the step scale the Hugging Face runs give (:mod:`fxcost.cost_models.heads.step_intervals`).

By default a reduced schedule, 5 epochs per head and fold (7 folds of 10 epochs took 9 minutes to
train on a loaded 2-core machine, and the run 14), to check a change in minutes; the README's figures
are ``--full``'s, the shipped schedule. The output and the last line (``epochs=N``) say which ran.

    python benchmarks/generalization.py --data ../shared/data [--epochs 5 | --full] [--work DIR]

Last line: ``loo_bmm=.. loo_fc=.. loo_conv=.. loo_ew=.. loo_ln=.. loo_softmax=.. logo_...=.. id_...=..
roofline_loo_...=.. e2e_loo_mape=.. e2e_loo_max=.. coverage80=.. e2e_coverage80=.. e2e_low=.. e2e_high=..
step_scale=.. folds=N epochs=N``; each MAPE is the mean over left-out GPUs of the per-GPU MAPE.
``e2e_coverage80`` is the share of a left-out GPU's runs inside their step interval (nodes' intervals
and the step scale calibrated without the GPU: :mod:`fxcost.cost_models.heads.step_intervals`),
``e2e_low`` and ``e2e_high`` its median ends as factors of the prediction.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import HEADS, TILED_HEADS, Heads
from fxcost.cost_models.heads.intervals import (
    NOMINAL,
    Intervals,
    interval_class,
    node_classes,
    shipped_intervals,
    write_intervals,
)
from fxcost.cost_models.heads.step_intervals import StepSums, step_scale_for, step_sums
from fxcost.cost_models.roofline import Roofline
from fxcost.data.datasets import data_root, read_model_runs, row_node
from fxcost.gpus import HELD_OUT_DEVICES, get_device
from fxcost.gpus.holdout import uncalibrated
from fxcost.lowering.attention import ATTENTION_OPS
from fxcost.train.heads import TrainConfig, split, train

NAMES = {"linear": "fc", "bmm": "bmm", "conv": "conv", "ew": "ew", "ln": "ln", "softmax": "softmax"}
GENERATIONS = {
    "Pascal": ("P4", "P100-PCIE-16GB"),
    "Volta": ("V100-PCIE-32GB",),
    "Turing": ("T4",),
    "Ampere": ("A100-PCIE-40GB",),
}
TRAINING_GPUS = tuple(g for gpus in GENERATIONS.values() for g in gpus)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--epochs", type=int, default=5, help="epochs per head and fold (default 5)")
    parser.add_argument("--full", action="store_true", help="the shipped schedule: 40 epochs per head")
    parser.add_argument("--heads", nargs="+", default=list(HEADS), choices=HEADS)
    parser.add_argument("--layers", type=int, default=TrainConfig().layers, help="hidden layers per head")
    parser.add_argument("--width", type=int, default=TrainConfig().width, help="units per hidden layer")
    parser.add_argument("--seed", type=int, default=TrainConfig().seed, help="the heads' initialization seed")
    parser.add_argument("--work", help="where folds keep their heads (resumable; default: a temporary one)")
    parser.add_argument("--jobs", type=int, default=2, help="folds trained at once")
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end Hugging Face runs")
    parser.add_argument("--e2e-cache", help="directory of captured Hugging Face steps (resumable)")
    parser.add_argument("--write-intervals", help="write the interval file from the LOO errors here")
    parser.add_argument("--out", help="write every fold's row predictions to this CSV")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    config = TrainConfig(layers=args.layers, width=args.width, seed=args.seed,
                         epochs=TrainConfig().epochs if args.full else args.epochs)  # fmt: skip
    work = Path(args.work or tempfile.mkdtemp(prefix="fxcost-generalization-"))
    folds: dict[str, tuple[str, ...]] = {"all": ()} | {f"loo:{g}": (g,) for g in TRAINING_GPUS}
    folds |= {f"logo:{name}": gpus for name, gpus in GENERATIONS.items() if len(gpus) > 1}
    if config.epochs < TrainConfig().epochs:
        print(f"REDUCED schedule: {config.epochs} epochs per head, not the shipped {TrainConfig().epochs}")
    print(f"training {len(folds)} folds x {len(args.heads)} heads, {config.epochs} epochs, in {work}",
          flush=True)  # fmt: skip
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        jobs = {name: pool.submit(_train_fold, args.data, work / _dir(name), args.heads, gpus, config)
                for name, gpus in folds.items()}  # fmt: skip
        for name, job in jobs.items():
            job.result()
            print(f"  fold {name} trained ({time.perf_counter() - start:.0f} s)", flush=True)
    models = {name: Heads.load(work / _dir(name)) for name in folds}

    rows = pd.concat([_rows(args.data, head, models, folds) for head in args.heads], ignore_index=True)
    if args.out:
        rows.to_csv(args.out, index=False)
    loo = rows[rows["fold"].str.startswith("loo:")]
    logo = _logo(rows)
    ident = rows[rows["fold"] == "all"]
    tables = {"LOO": _per_gpu(loo, "heads"), "LOGO": _per_gpu(logo, "heads"),
              "in distribution": _per_gpu(ident, "heads"), "roofline": _per_gpu(loo, "roofline")}  # fmt: skip
    for title, table in tables.items():
        print(f"\n{title}: MAPE (%) per op class and GPU")
        print(table.to_string(float_format=lambda v: f"{v:6.1f}"))

    coverage = _coverage(loo)
    print(f"\nNominal {NOMINAL:.0%} intervals, each GPU's calibrated on the other GPUs' LOO errors alone:")
    print("share of its rows inside")
    print(coverage.to_string(float_format=lambda v: f"{v:6.1%}"))
    errors = _log_errors(loo)
    intervals = Intervals.calibrated(errors)

    e2e, steps = pd.DataFrame(), dict[str, float]()
    if not args.no_e2e:
        cache = Path(args.e2e_cache or work / "e2e")
        e2e = _end_to_end(args.data, cache, models)
        if not e2e.empty:
            print("\nHugging Face runs of each left-out GPU, heads trained without it (error %)")
            shown = e2e.drop(columns=["predicted"])
            print(shown.to_string(index=False, float_format=lambda v: f"{v:8.1f}"))
            steps, drawn = _step_coverage(e2e, errors)
            intervals = dataclasses.replace(intervals, step_scale=steps["step_scale"], drawn_classes=drawn,
                                            step_runs=len(e2e))  # fmt: skip
    if args.write_intervals and not steps:  # no runs to calibrate a step's interval on: keep the shipped one
        shipped = shipped_intervals()
        if shipped is not None:
            print("no Hugging Face runs: the step scale is kept from the shipped intervals")
            kept = {f: getattr(shipped, f) for f in ("step_scale", "drawn_classes", "step_runs")}
            intervals = dataclasses.replace(intervals, **kept)
    if args.write_intervals:
        print(f"wrote {write_intervals(intervals, args.write_intervals)}")

    summary = {}
    for label, table in (("loo", tables["LOO"]), ("logo", tables["LOGO"]), ("id", tables["in distribution"]),
                         ("roofline_loo", tables["roofline"])):  # fmt: skip
        summary.update({f"{label}_{NAMES[h]}": table.loc[h, "mean"] for h in args.heads if h in table.index})
    if not e2e.empty:
        summary["e2e_loo_mape"] = float(e2e["heads_err"].abs().mean())
        summary["e2e_loo_max"] = float(e2e["heads_err"].abs().max())
    summary["coverage80"] = float(coverage.loc["all", "all"]) if "all" in coverage.index else float("nan")
    summary.update({k: v for k, v in steps.items() if k != "step_scale"})
    if steps:
        summary["step_scale"] = steps["step_scale"]
    print(f"({time.perf_counter() - start:.0f} s)")
    print(" ".join(f"{k}={v:.3f}" if "coverage" in k else f"{k}={v:.2f}" for k, v in summary.items())
          + f" folds={len(folds) - 1} epochs={config.epochs}")  # fmt: skip
    return 0


def _sibling(name: str) -> Any:
    """Another benchmark script of this folder, as a module."""
    if str(Path(__file__).parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).parent))
    return importlib.import_module(name)


def _dir(fold: str) -> str:
    return fold.replace(":", "_")


def _train_fold(data: str, out: Path, heads: list[str], gpus: tuple[str, ...], config: TrainConfig) -> None:
    """Train a fold's ``heads``, and its GEMM fit whatever they are: every prediction prices GEMMs with it."""
    heads = list(dict.fromkeys([*heads, *sorted(TILED_HEADS)]))
    train([data], out, heads=heads, exclude=HELD_OUT_DEVICES | set(gpus), config=config)


def _rows(data: str, head: str, models: dict[str, Heads], folds: dict[str, tuple[str, ...]]) -> pd.DataFrame:
    """Every fold's predictions of the held-out rows it did not train on, with the roofline's.

    Each fold predicts as fxcost does (:class:`~fxcost.cost_models.heads.Heads`: its tables along the
    batch-like axis and over weaker GPUs included), not as the bare network.
    """
    _, test = split([data], head, exclude=HELD_OUT_DEVICES)
    test = test.sort_values("device", kind="stable").reset_index(drop=True)
    roofline = _sibling("ops_accuracy")._roofline(test, head)  # in device order, as the rows now are
    nodes = [row_node(r) for r in test.itertuples(index=False)]
    classes = np.array([interval_class(n, head) for n in nodes])
    devices = test["device"].to_numpy()
    parts = []
    for fold, gpus in folds.items():
        heads = models[fold]
        if head not in heads.heads and head not in TILED_HEADS:
            continue
        predicted = np.full(len(test), np.nan)
        with uncalibrated(gpus):  # a left-out GPU's own calibration reaches its predictions through nothing
            for device in sorted(set(devices) & set(gpus or devices)):
                index = np.flatnonzero(devices == device)
                predicted[index] = heads.predict(NodeBatch.of([nodes[i] for i in index]), get_device(device))
        keep = np.isfinite(predicted)
        parts.append(pd.DataFrame({"fold": fold, "head": head, "interval": classes[keep],
                                   "device": devices[keep], "measured": test["Latency"].to_numpy()[keep],
                                   "heads": predicted[keep], "roofline": roofline[keep]}))  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def _logo(rows: pd.DataFrame) -> pd.DataFrame:
    """Each generation's rows from the fold that left it out (a one-GPU generation's LOO fold)."""
    parts = []
    for name, gpus in GENERATIONS.items():
        fold = f"logo:{name}" if len(gpus) > 1 else f"loo:{gpus[0]}"
        parts.append(rows[rows["fold"] == fold])
    return pd.concat(parts, ignore_index=True)


def _per_gpu(rows: pd.DataFrame, method: str) -> pd.DataFrame:
    """MAPE per op class (rows) and GPU (columns), and the mean over GPUs."""
    error = (rows[method] - rows["measured"]).abs() / rows["measured"] * 100
    table = rows.assign(error=error).pivot_table(
        index="head", columns="device", values="error", aggfunc="mean"
    )
    table["mean"] = table.mean(axis=1)
    return table.reindex([h for h in HEADS if h in table.index])


def _log_errors(rows: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """log(measured / predicted) of the rows, per GPU and interval class
    (:func:`~fxcost.cost_models.heads.intervals.interval_class`)."""
    return {
        str(device): {c: np.log(h["measured"] / h["heads"]).to_numpy() for c, h in g.groupby("interval")}
        for device, g in rows.groupby("device")
    }


def _coverage(loo: pd.DataFrame) -> pd.DataFrame:
    """Per interval class and GPU: the share of the GPU's rows inside the interval calibrated on the
    other GPUs' LOO errors alone (nested: the GPU takes no part in choosing its interval's width)."""
    errors = _log_errors(loo)
    result: dict[str, dict[str, float]] = {}
    for device, mine in errors.items():
        others = Intervals.calibrated({g: e for g, e in errors.items() if g != device})
        for head, e in mine.items():
            if head in others.quantiles:
                low, high = others.quantiles[head]
                result.setdefault(head, {})[device] = float(((e >= low) & (e <= high)).mean())
    table = pd.DataFrame(result).T
    table["all"] = table.mean(axis=1)
    table.loc["all"] = table.mean(axis=0)
    order = [*HEADS, *sorted(set(table.index) - set(HEADS) - {"all"}), "all"]
    return table.reindex([c for c in order if c in table.index])


def _end_to_end(data: str, cache: Path, models: dict[str, Heads]) -> pd.DataFrame:
    """The Hugging Face runs of each training GPU, predicted with the heads of the fold that left it
    out (``predicted``: that prediction's report)."""
    e2e = _sibling("models_e2e")
    _capture = e2e._capture

    root = data_root(data)
    runs = read_model_runs(root)
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for (model, mode, seqlen, batch), group in runs.groupby(["model", "mode", "seqlen", "batch"], sort=True):
        report = None
        for run in group.itertuples(index=False):
            device = get_device(run.device).name
            if device not in TRAINING_GPUS:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = report or _capture(root, cache, model, mode == "train", seqlen, batch)
            row = {"model": model, "mode": mode, "seqlen": seqlen, "batch": batch, "device": device,
                   "measured_ms": run.e2e}  # fmt: skip
            for label, heads in (("heads", models[f"loo:{device}"]), ("in_dist", models["all"])):
                with uncalibrated([device] if label == "heads" else []):
                    predicted = report.predict([device], [heads, Roofline()])
                row[f"{label}_ms"] = predicted.eager_ms(device)
                row[f"{label}_err"] = (row[f"{label}_ms"] - run.e2e) / run.e2e * 100
                if label == "heads":
                    row["predicted"] = predicted
            rows.append(row)
    return pd.DataFrame(rows)


def _step_coverage(
    e2e: pd.DataFrame, errors: dict[str, dict[str, np.ndarray]]
) -> tuple[dict[str, float], tuple[str, ...]]:
    """The step scale (:func:`~fxcost.cost_models.heads.step_intervals.step_scale_for`) from every
    left-out GPU's runs, each GPU's runs bounded by node intervals calibrated on the other GPUs' LOO
    ``errors``; and nested: each GPU's runs against the scale the other GPUs' runs give, theirs bounded
    by node intervals calibrated without either GPU (the share inside, ``e2e_coverage80``, and the
    median interval's ends as factors of the prediction). Also the classes drawn in: those of the
    runs' nodes."""
    runs = [
        _Run.of(str(r.device), r.measured_ms / r.heads_ms, r.predicted) for r in e2e.itertuples(index=False)
    ]
    drawn = tuple(sorted({c for run in runs for n, c in zip(run.nodes, run.classes, strict=True)
                          if c is not None and n.op not in ATTENTION_OPS}))  # fmt: skip
    calibrated: dict[frozenset[str], Intervals] = {}

    def sums(without: frozenset[str], gpus: set[str]) -> dict[str, list[tuple[float, StepSums]]]:
        """The runs of ``gpus``, bounded by node intervals calibrated without the GPUs ``without``."""
        if without not in calibrated:
            kept = {g: e for g, e in errors.items() if g not in without}
            calibrated[without] = dataclasses.replace(Intervals.calibrated(kept), drawn_classes=drawn)
        out: dict[str, list[tuple[float, StepSums]]] = {}
        for run in runs:
            if run.gpu in gpus:
                bounded = step_sums(
                    run.nodes, run.ms, run.sources, intervals=calibrated[without], classes=run.classes
                )
                out.setdefault(run.gpu, []).append((run.ratio, bounded))
        return out

    gpus = {run.gpu for run in runs}
    # each GPU's node intervals without it (the shipped scale's runs, and the summed bounds)
    own: dict[str, list[tuple[float, StepSums]]] = {}
    for gpu in sorted(gpus):
        own.update(sums(frozenset({gpu}), {gpu}))
    inside, lows, highs = {}, [], []
    for gpu in sorted(gpus):
        others: dict[str, list[tuple[float, StepSums]]] = {}
        for other in sorted(gpus - {gpu}):
            others.update(sums(frozenset({gpu, other}), {other}))
        scale = step_scale_for(others)
        inside[gpu] = float(np.mean([s.covers(ratio, scale) for ratio, s in own[gpu]]))
        lows += [s.bounds(scale)[0] / s.total for _, s in own[gpu]]
        highs += [s.bounds(scale)[1] / s.total for _, s in own[gpu]]
    scale = step_scale_for(own)
    summed = [(s.bounds(1.0), ratio, s.total) for mine in own.values() for ratio, s in mine]
    print(
        f"\nStep intervals: the nodes' summed bounds drawn in by {scale:.2f} (log distance from the "
        f"prediction) for the classes {', '.join(drawn)}, calibrated on the left-out GPUs' runs"
    )
    print("nested, each GPU's runs against the other GPUs' scale: share inside "
          + ", ".join(f"{g} {c:.0%}" for g, c in inside.items())
          + f"; median interval x{np.median(lows):.2f} to x{np.median(highs):.2f}")  # fmt: skip
    print(f"(the summed bounds: x{np.median([lo / t for (lo, _), _, t in summed]):.2f} to "
          f"x{np.median([hi / t for (_, hi), _, t in summed]):.2f}, holding "
          f"{np.mean([lo <= r * t <= hi for (lo, hi), r, t in summed]):.0%} of the runs)")  # fmt: skip
    steps = {"e2e_coverage80": float(np.mean(list(inside.values()))), "e2e_low": float(np.median(lows)),
             "e2e_high": float(np.median(highs)), "step_scale": scale}  # fmt: skip
    return steps, drawn


@dataclasses.dataclass(frozen=True)
class _Run:
    """A left-out GPU's run: its measured over predicted time, and its predicted nodes on the GPU."""

    gpu: str
    ratio: float
    nodes: list[Any]
    ms: np.ndarray
    sources: list[str | None]
    classes: list[str | None]

    @classmethod
    def of(cls, gpu: str, ratio: float, report: Any) -> _Run:
        nodes = report.nodes
        sources = [n.pred_source.get(gpu) for n in nodes]
        ms = np.array([n.pred_ms.get(gpu) or 0.0 for n in nodes])
        return cls(gpu, ratio, nodes, ms, sources, node_classes(nodes, sources))


if __name__ == "__main__":
    sys.exit(main())
