"""The papers' seed predictors on our data, beside fxcost's default on the same rows.

Justus et al. (per-layer network): the held-out rows of fully connected (linear) and convolution
layers, RMSE (ms) and MAPE per device, with the shipped Justus weights (trained on every training
GPU) and, as the paper's §VII-C, retrained without one training GPU (``--holdout``) and tested on it;
fxcost's heads on the same rows, also retrained without that GPU for the held-out figure.

Lattuada et al. (stepwise regression over run features): the end-to-end inference runs of
``DIR/models``, per model family, with the features the runs have (B batch size, P the GPU's peak
GFLOPS; I, G, T, D, N are constant within a family, so they carry nothing). §3.4's protocol: fit on
small batches and test on the largest; fit on the less powerful GPUs and test on the most powerful;
and the in-sample fit. fxcost's default predicts the same held-out runs with no measurement at all
(captured on this CPU, as in ``models_e2e.py``).

By default the protocol is reduced to finish in minutes on a 2-core machine: the retrained networks
of the held-out column train for a tenth of their schedules (Justus 30 epochs of §VI-E's 300, the
heads 2 of their 20), so only the ``*_unseen`` columns change; the shipped networks, Lattuada and
every fxcost capture are as in the full protocol. ``--full`` runs the complete schedules (tens of
minutes there). The output and the last line say which protocol ran.

    python benchmarks/seed_models.py --data ../shared/data [--holdout V100-PCIE-32GB] [--full | --epochs N]

Last line: ``justus_mape=.. fxcost_mape_same_rows=.. lattuada_mape=.. fxcost_mape_lattuada_rows=..
protocol=reduced|full`` (Justus and fxcost on the held-out layer rows of the GPUs seen in training;
Lattuada and fxcost on the runs Lattuada extrapolates to).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))

from models_e2e import _capture

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import Heads, load_heads
from fxcost.cost_models.heads.sustained import shipped_gemm_fit
from fxcost.cost_models.justus import JustusPredictor
from fxcost.cost_models.lattuada import LattuadaRegression
from fxcost.data.datasets import data_root, read_model_runs, row_node
from fxcost.gpus import HELD_OUT_DEVICES, get_device
from fxcost.train.heads import TrainConfig, split, train
from fxcost.train.justus import JustusConfig, examples, train_justus

LAYERS = ("linear", "conv")
FULL_JUSTUS_EPOCHS = JustusConfig().epochs  # §VI-E: 300
FULL_HEADS_EPOCHS = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--holdout", default="V100-PCIE-32GB", help="training GPU left out (§VII-C)")
    parser.add_argument(
        "--full", action="store_true", help=f"the complete schedules: Justus {FULL_JUSTUS_EPOCHS} epochs, "
        f"the heads {FULL_HEADS_EPOCHS} (default: a tenth of each)",
    )  # fmt: skip
    parser.add_argument(
        "--epochs", type=int, help="Justus epochs of the held-out column (overrides the protocol)"
    )
    parser.add_argument("--cache", help="captured HF reports and the held-out models (kept between runs)")
    args = parser.parse_args()
    start = time.perf_counter()
    holdout = get_device(args.holdout).name
    epochs = args.epochs or (FULL_JUSTUS_EPOCHS if args.full else FULL_JUSTUS_EPOCHS // 10)
    heads_epochs = FULL_HEADS_EPOCHS if args.full else FULL_HEADS_EPOCHS // 10
    protocol = "full" if args.full and epochs == FULL_JUSTUS_EPOCHS else "reduced"
    if protocol == "reduced":
        print(f"REDUCED protocol (--full for the complete one): the held-out column's networks train "
              f"{epochs} epochs (Justus) and {heads_epochs} (heads), not {FULL_JUSTUS_EPOCHS} and "
              f"{FULL_HEADS_EPOCHS}\n")  # fmt: skip

    justus = JustusPredictor.load(Path(__file__).parent.parent / "fxcost/cost_models/weights/justus.npz")
    print(f"Justus et al. vs fxcost's heads on held-out layer rows (Justus retrained without {holdout} "
          f"for its column: {epochs} epochs)")  # fmt: skip
    cache = Path(args.cache or tempfile.mkdtemp(prefix="fxcost-seed-"))
    cache.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(JustusConfig(), epochs=epochs)
    saved = cache / f"justus-{epochs}-without-{holdout}.npz"
    justus_out = train_justus(args.data, exclude=[holdout], config=config, out=saved)
    work = cache / f"heads-{heads_epochs}-without-{holdout}"
    train([args.data], work, heads=LAYERS, exclude=set(HELD_OUT_DEVICES) | {holdout},
          config=dataclasses.replace(TrainConfig(), epochs=heads_epochs))  # fmt: skip
    heads_out = Heads.load(work)  # fit without the held-out GPU
    heads = Heads(load_heads(), shipped_gemm_fit())
    rows = []
    for layer in LAYERS:
        _, test = split([args.data], layer)
        for device_name, group in test.groupby("device", sort=True):
            x, y = examples(group, layer)
            device = get_device(device_name)
            batch = NodeBatch.of([row_node(r) for r in group.itertuples(index=False)])
            fx = heads.predict(batch, device)
            row = {"layer": layer, "device": device_name, "rows": len(y),
                   **_scores("justus", justus.networks[layer](x), y), **_scores("fxcost", fx, y)}  # fmt: skip
            if device_name == holdout:
                row.update(_scores("justus_unseen", justus_out.networks[layer](x), y))
                row.update(_scores("fxcost_unseen", heads_out.predict(batch, device), y))
            rows.append(row)
    layers = pd.DataFrame(rows)
    print(layers.to_string(index=False, float_format=lambda v: f"{v:9.2f}"))
    justus_mape = float(layers["justus_mape"].mean())
    fxcost_mape = float(layers["fxcost_mape"].mean())

    print("\nLattuada et al. on end-to-end inference runs (per model family; §3.4 extrapolation)")
    root = data_root(args.data)
    runs = read_model_runs(root)
    runs = runs[runs["mode"] == "inf"].copy()
    runs["P"] = [get_device(d).fp32_tflops * 1e3 for d in runs["device"]]  # type: ignore[operator]
    runs["B"] = runs["batch"].astype(float)
    lattuada_rows = []
    for model, family in runs.groupby("model", sort=True):
        splits = {"in-sample": (family, family)}
        if family["B"].nunique() > 1:
            biggest = family["B"].max()
            splits["batch extrapolation"] = (family[family["B"] < biggest], family[family["B"] == biggest])
        if family["P"].nunique() > 1:
            fastest = family["P"].max()
            splits["GPU extrapolation"] = (family[family["P"] < fastest], family[family["P"] == fastest])
        for name, (fit_rows, test_rows) in splits.items():
            if len(fit_rows) < 3:
                continue
            regression = LattuadaRegression().fit(fit_rows, target="e2e", features=["B", "P"])
            predicted = regression.predict(test_rows)
            for run, lattuada_ms in zip(test_rows.itertuples(index=False), predicted, strict=True):
                report = _capture(root, cache, model, False, run.seqlen, run.batch)
                device = get_device(run.device).name
                fxcost_ms = report.predict([device]).eager_ms(device)
                terms = " ".join(t.name for t in regression.terms) or "-"
                lattuada_rows.append({"model": model, "split": name, "device": device, "batch": run.batch,
                                      "measured_ms": run.e2e, "terms": terms,
                                      "lattuada_err": (lattuada_ms / run.e2e - 1) * 100,
                                      "fxcost_err": (fxcost_ms / run.e2e - 1) * 100})  # fmt: skip
    lattuada = pd.DataFrame(lattuada_rows)
    print(lattuada.to_string(index=False, float_format=lambda v: f"{v:9.1f}"))
    summary = lattuada.groupby("split")[["lattuada_err", "fxcost_err"]].agg(lambda e: e.abs().mean())
    print("\nMAPE (%) by split\n" + summary.to_string(float_format=lambda v: f"{v:9.1f}"))
    extrapolated = lattuada[lattuada["split"] != "in-sample"]
    print(f"({time.perf_counter() - start:.0f} s)")
    print(f"justus_mape={justus_mape:.2f} fxcost_mape_same_rows={fxcost_mape:.2f} "
          f"lattuada_mape={extrapolated['lattuada_err'].abs().mean():.2f} "
          f"fxcost_mape_lattuada_rows={extrapolated['fxcost_err'].abs().mean():.2f} "
          f"protocol={protocol}")  # fmt: skip
    return 0


def _scores(prefix: str, predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    return {f"{prefix}_rmse": float(np.sqrt(np.mean((predicted - measured) ** 2))),
            f"{prefix}_mape": float(np.mean(np.abs(predicted - measured) / measured) * 100)}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
