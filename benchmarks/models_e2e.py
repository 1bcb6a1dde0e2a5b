"""End-to-end latency of Hugging Face models, predicted with no origin GPU, against measurements.

For every ``DIR/models/<Device>/<model>-<mode>-<seqlen>-<batch>.json`` (``-dp4``, ``-tp4`` and ``-pp4*``
runs skipped) the model of ``DIR/model_configs/<model>.json`` is built as measured (fp32, eager
attention, random weights, ``input_ids`` of ones; train = forward + backward of the cross-entropy of the
logits), captured on this CPU with meta tensors (nothing runs, any size fits), and predicted on that
GPU from the graph alone. Each (model, mode, seqlen, batch) is captured once and predicted for every
GPU that measured it; captures are cached in ``--cache`` so an interrupted run resumes. A
mixture-of-experts model (Switch) runs under balanced routing (:mod:`fxcost.zoo.routing`), printed
once per model.

Prints per row predicted, measured and error for the default policy and the roofline model, then the
MAPE of training and inference rows apart. The ``-fusion`` runs (the same inference with fused kernels:
``torch.compile``) are predicted in compiled mode (``report.compiled_ms``: Inductor's fusion applied to
the captured graph) and printed apart, with the eager prediction of the same rows. Last line:
``mape_train=.. mape_inf=.. mape_all=.. max_err_train=.. roofline_mape_all=.. rows=N mape_fusion=..
eager_mape_fusion=.. fusion_rows=N``.

    python benchmarks/models_e2e.py --data ../shared/data [--out rows.csv] [--cache DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd

import fxcost
from fxcost.data.datasets import data_root, read_model_runs
from fxcost.gpus import get_device
from fxcost.report import Report
from fxcost.zoo.hf import hf_step

METHODS = {"fxcost": None, "roofline": "roofline"}  # None: the default prediction policy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--out", help="write one row per measurement to this CSV")
    parser.add_argument("--cache", help="directory of captured reports (default: a temporary one)")
    args = parser.parse_args()
    start = time.perf_counter()
    root = data_root(args.data)
    runs = read_model_runs(root)
    if runs.empty:
        print(f"no model runs under {root / 'models'}", file=sys.stderr)
        return 2
    cache = Path(args.cache or tempfile.mkdtemp(prefix="fxcost-e2e-"))
    cache.mkdir(parents=True, exist_ok=True)

    rows = []
    routed: dict[str, str] = {}  # the routing each mixture-of-experts model was captured under
    for (model, mode, seqlen, batch), group in runs.groupby(["model", "mode", "seqlen", "batch"], sort=True):
        report = _capture(root, cache, model, mode == "train", seqlen, batch)
        if report.routing and model not in routed:
            routed[model] = report.routing
            print(f"{model}: mixture-of-experts routing assumed: {report.routing}")
        for run in group.itertuples(index=False):
            device = get_device(run.device).name
            row = {"model": model, "mode": mode, "seqlen": seqlen, "batch": batch, "device": device,
                   "measured_ms": run.e2e, "measured_fw_ms": run.fw, "measured_bw_ms": run.bw}  # fmt: skip
            for method, cost_model in METHODS.items():
                predicted = report.predict([device], cost_model)
                row[f"{method}_ms"] = predicted.eager_ms(device)
                row[f"{method}_fw_ms"] = predicted.eager_ms(device, "fw")
                row[f"{method}_bw_ms"] = predicted.eager_ms(device, "bw")
                if cost_model is None:  # the plain sum of isolated op times, to show what eager changes
                    row["sum_ms"] = predicted.total_ms(device)
            rows.append(row)
    table = pd.DataFrame(rows)
    for method in (*METHODS, "sum"):
        table[f"{method}_err"] = (table[f"{method}_ms"] - table["measured_ms"]) / table["measured_ms"] * 100

    print(
        "\nPredicted vs measured end-to-end ms. fxcost: the default 'auto' policy, nodes run as an eager\n"
        "pipeline (report.eager_ms); sum: the same nodes' isolated times added (report.total_ms);\n"
        "roofline: the roofline model in the same pipeline"
    )
    columns = ["model", "mode", "seqlen", "batch", "device", "measured_ms", "fxcost_ms", "fxcost_err",
               "sum_err", "roofline_ms", "roofline_err"]  # fmt: skip
    print(table[columns].to_string(index=False, float_format=lambda v: f"{v:9.1f}"))
    mape = {
        (method, mode): float(table.loc[table["mode"] == mode, f"{method}_err"].abs().mean())
        for method in ("fxcost", "sum", "roofline")
        for mode in ("train", "inf")
    }
    train = table[table["mode"] == "train"]
    if not train.empty:
        print("\nTraining rows, forward and backward apart (error %):")
        fw = (train["fxcost_fw_ms"] - train["measured_fw_ms"]) / train["measured_fw_ms"] * 100
        bw = (train["fxcost_bw_ms"] - train["measured_bw_ms"]) / train["measured_bw_ms"] * 100
        print(train.assign(fw_err=fw, bw_err=bw)[["model", "seqlen", "batch", "device", "fw_err", "bw_err"]]
              .to_string(index=False, float_format=lambda v: f"{v:7.1f}"))  # fmt: skip
    print("\nMAPE (%)        train     inf     all")
    for method in ("fxcost", "sum", "roofline"):
        everything = float(table[f"{method}_err"].abs().mean())
        print(f"{method:<12} {mape[method, 'train']:8.1f} {mape[method, 'inf']:7.1f} {everything:7.1f}")
    fused = _fusion_rows(root, cache)
    if args.out:
        table.to_csv(args.out, index=False)
    print(f"({time.perf_counter() - start:.0f} s)")
    max_train = float(train["fxcost_err"].abs().max()) if not train.empty else float("nan")
    print(
        f"mape_train={mape['fxcost', 'train']:.2f} mape_inf={mape['fxcost', 'inf']:.2f} "
        f"mape_all={table['fxcost_err'].abs().mean():.2f} max_err_train={max_train:.2f} "
        f"roofline_mape_all={table['roofline_err'].abs().mean():.2f} rows={len(table)} "
        f"mape_fusion={fused['compiled_err'].abs().mean():.2f} "
        f"eager_mape_fusion={fused['eager_err'].abs().mean():.2f} fusion_rows={len(fused)}"
    )
    return 0


def _fusion_rows(root: Path, cache: Path) -> pd.DataFrame:
    """The fused-kernel runs predicted in compiled mode (and eager, for comparison), printed."""
    runs = read_model_runs(root, fusion=True)
    rows = []
    for run in runs.itertuples(index=False):
        report = _capture(root, cache, run.model, run.mode == "train", run.seqlen, run.batch)
        device = get_device(run.device).name
        predicted = report.predict([device])
        kernels = predicted.fused_kernels()
        rows.append({"model": run.model, "mode": run.mode, "seqlen": run.seqlen, "batch": run.batch,
                     "device": device, "measured_ms": run.e2e, "compiled_ms": predicted.compiled_ms(device),
                     "eager_ms": predicted.eager_ms(device), "kernels": len(kernels),
                     "nodes": sum(n.has_kernel for n in predicted.nodes)})  # fmt: skip
    fused = pd.DataFrame(rows, columns=["model", "mode", "seqlen", "batch", "device", "measured_ms",
                                        "compiled_ms", "eager_ms", "kernels", "nodes"])  # fmt: skip
    for method in ("compiled", "eager"):
        fused[f"{method}_err"] = (fused[f"{method}_ms"] - fused["measured_ms"]) / fused["measured_ms"] * 100
    print("\nFused-kernel runs (-fusion), predicted in compiled mode (report.compiled_ms; eager_ms beside):")
    print(fused.to_string(index=False, float_format=lambda v: f"{v:9.1f}"))
    return fused


def _capture(root: Path, cache: Path, model: str, train: bool, seqlen: int, batch: int) -> Report:
    """The captured step of a model, from the cache or captured now (and cached)."""
    path = cache / f"{model}-{'train' if train else 'inf'}-{seqlen}-{batch}.json.gz"
    if path.exists():
        return Report.load(path)
    began = time.perf_counter()
    step = hf_step(root / "model_configs" / f"{model}.json", batch, seqlen, train=train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and autograd's notes on meta tensors
        report = fxcost.profile(step.model, step.inputs, devices=[], train=train, measure=False,
                                loss_fn=step.loss_fn)  # fmt: skip
    report.routing = step.routing  # saved with the trace: a cached capture still says it
    report.save(path)
    print(f"captured {path.name[: -len('.json.gz')]}: {len(report.nodes)} nodes in "
          f"{time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
    return report


if __name__ == "__main__":
    sys.exit(main())
