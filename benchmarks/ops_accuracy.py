"""Operator accuracy of the MLP heads with no origin GPU, against the roofline and a Habitat-style MLP.

Evaluates heads on every held-out row: ``DIR/ops_test/*.csv`` for linear (FC), bmm, elementwise, layer
norm and softmax, and the 10% of ``DIR/ops/conv`` configurations never trained on. Each row is
predicted on the device that measured it, from the op's dims and the device's spec sheet alone. In the
same run: the roofline model, and a Habitat-style MLP (raw time, op dims + the four GPU features of
Habitat §3.4, MAPE loss) trained on the same training rows.

With ``--leave-one-device-out`` the heads are retrained with each training GPU excluded in turn and
tested on that GPU only: the unseen-GPU figure. ``--size-study`` trains the bmm head at several depths
and widths (Habitat's Figure 6).

    python benchmarks/ops_accuracy.py --data ../shared/data [--out rows.csv] [--leave-one-device-out]

Last line: ``mape_bmm=.. mape_fc=.. mape_conv=.. mape_ew=.. mape_softmax=.. mape_ln=..
mape_roofline_all=.. mape_habitat_mlp_all=.. rows=N`` (and ``loo_*`` with --leave-one-device-out);
each MAPE is the mean over devices of the per-device MAPE.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import HEADS, TILED_HEADS, Heads
from fxcost.cost_models.heads.sustained import GemmFit
from fxcost.cost_models.roofline import Roofline
from fxcost.data.datasets import row_node
from fxcost.gpus import HELD_OUT_DEVICES, get_device
from fxcost.gpus.holdout import uncalibrated
from fxcost.train.compare import habitat_mlp_ms
from fxcost.train.heads import TrainConfig, examples, fit, split, train

NAMES = {"linear": "fc", "bmm": "bmm", "conv": "conv", "ew": "ew", "softmax": "softmax", "ln": "ln"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--heads", help="directory of trained heads (default: the shipped ones)")
    parser.add_argument("--out", help="write one row per prediction to this CSV")
    parser.add_argument("--leave-one-device-out", action="store_true")
    parser.add_argument("--loo-epochs", type=int, default=TrainConfig().epochs)
    parser.add_argument("--size-study", action="store_true")
    parser.add_argument("--work", default=None, help="where LOO runs keep their heads (resumable)")
    args = parser.parse_args()
    start = time.perf_counter()
    model = Heads.load(args.heads) if args.heads else Heads()  # refuses heads of another GEMM fit
    heads = model.heads
    if not heads:
        print("no trained heads: run `fxcost train --data DIR --out DIR` first", file=sys.stderr)
        return 2

    rows, table, gemm = [], {}, model.gemm
    for head in HEADS:
        train_rows, test_rows = split([args.data], head)
        test_ex = examples(test_rows, head, gemm.watts)
        nodes_ms = {
            "heads": _model_ms(heads, gemm, head, test_rows, test_ex),
            "roofline": _roofline(test_rows, head),
            "habitat_mlp": habitat_mlp_ms(examples(train_rows, head), test_ex, head),
        }
        frame = pd.DataFrame({"head": head, "device": test_ex.device, "measured_ms": test_ex.latency_ms,
                              **{k: v for k, v in nodes_ms.items()}})  # fmt: skip
        rows.append(frame)
        table[head] = {m: _mape(frame, m) for m in nodes_ms}
    predictions = pd.concat(rows, ignore_index=True)

    print("MAPE (%) on held-out rows, per device (heads | roofline | Habitat-style MLP)")
    per_device = predictions.assign(
        **{
            m: (predictions[m] - predictions["measured_ms"]).abs() / predictions["measured_ms"] * 100
            for m in ("heads", "roofline", "habitat_mlp")
        }
    ).pivot_table(index=["head", "device"], values=["heads", "roofline", "habitat_mlp"], aggfunc="mean")
    print(per_device.to_string(float_format=lambda v: f"{v:8.1f}"), "\n")
    summary = pd.DataFrame(table).T
    print("MAPE (%) per op class (mean over devices)")
    print(summary.to_string(float_format=lambda v: f"{v:8.1f}"), "\n")

    loo = {}
    if args.leave_one_device_out:
        loo = _leave_one_device_out(args.data, args.work, args.loo_epochs)
        print("Leave-one-device-out MAPE (%): trained without the GPU, tested on it")
        print(pd.DataFrame(loo).to_string(float_format=lambda v: f"{v:8.1f}"), "\n")
    if args.size_study:
        print("Layers x width study (bmm head, MAPE % on 10% of the training configurations held back):")
        print(_size_study(args.data).to_string(float_format=lambda v: f"{v:8.1f}"), "\n")
    if args.out:
        predictions.to_csv(args.out, index=False)
    print(f"({time.perf_counter() - start:.0f} s)")
    figures = [
        f"mape_{NAMES[h]}={table[h]['heads']:.2f}" for h in ("bmm", "linear", "conv", "ew", "softmax", "ln")
    ]
    figures += [f"mape_roofline_all={_mape(predictions, 'roofline'):.2f}",
                f"mape_habitat_mlp_all={_mape(predictions, 'habitat_mlp'):.2f}"]  # fmt: skip
    if loo:
        figures += [f"loo_{NAMES[h]}={np.nanmean(list(loo[h].values())):.2f}" for h in loo]
    print(" ".join(figures) + f" rows={len(predictions)}")
    return 0


def _mape(frame: pd.DataFrame, method: str) -> float:
    error = (frame[method] - frame["measured_ms"]).abs() / frame["measured_ms"] * 100
    return float(error.groupby(frame["device"]).mean().mean())


def _roofline(rows: pd.DataFrame, head: str) -> np.ndarray:
    """fxcost's roofline model on the rows, in the device order :func:`examples` uses."""
    return _per_device(rows, Roofline())


def _model_ms(heads: dict[str, Any], gemm: GemmFit, head: str, rows: pd.DataFrame, ex: Any) -> np.ndarray:
    """The shipped model's prediction of ``rows``: the bare network of an MLP head, or the tiled GEMM
    model (``gemm``) for the GEMM classes, which have no network (``rows`` in ``ex``'s device order)."""
    if head not in TILED_HEADS:
        return ex.reference_ms * np.exp(heads[head](ex.x))
    return _per_device(rows, Heads(heads, gemm))


def _per_device(rows: pd.DataFrame, model: Any) -> np.ndarray:
    """``model``'s predictions of the rows' nodes on each row's GPU, in the device order :func:`examples`
    uses."""
    parts = []
    for device_name, group in rows.groupby("device", sort=True):
        nodes = [row_node(r) for r in group.itertuples(index=False)]
        parts.append(model.predict(NodeBatch.of(nodes), get_device(device_name)))
    return np.concatenate(parts)


def _leave_one_device_out(data: str, work: str | None, epochs: int) -> dict[str, dict[str, float]]:
    root = Path(work or tempfile.mkdtemp(prefix="fxcost-loo-"))
    devices = sorted(set(split([data], "linear")[0]["device"]))
    result: dict[str, dict[str, float]] = {h: {} for h in HEADS}
    for device in devices:
        out = root / device
        train([data], out, exclude=set(HELD_OUT_DEVICES) | {device},
              config=dataclasses.replace(TrainConfig(), epochs=epochs))  # fmt: skip
        fitted = Heads.load(out)
        heads, gemm = fitted.heads, fitted.gemm
        for head in HEADS:
            _, test_rows = split([data], head, exclude=set(HELD_OUT_DEVICES))
            test_rows = test_rows[test_rows["device"] == device]
            if test_rows.empty:
                result[head][device] = math.nan
                continue
            with uncalibrated([device]):  # as a GPU nobody measured: its own calibration reaches nothing
                ex = examples(test_rows, head, gemm.watts)  # its bound too
                predicted = _model_ms(heads, gemm, head, test_rows, ex)
            result[head][device] = float(np.mean(np.abs(predicted - ex.latency_ms) / ex.latency_ms) * 100)
        print(f"  left out {device}: " + " ".join(f"{h}={result[h][device]:.1f}" for h in HEADS), flush=True)
    return result


def _size_study(data: str) -> pd.DataFrame:
    """Held-out MAPE of the bmm head by depth and width, on a validation share of the *training*
    configurations (10%, by a hash of the configuration), so ops_test plays no part in the choice."""
    import hashlib

    train_rows, _ = split([data], "bmm")
    key = train_rows[["B", "M", "N", "K"]].astype(str).agg("/".join, axis=1)
    held = key.map(lambda k: int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) / 2**32 < 0.1)
    fit_ex, val_ex = examples(train_rows[~held], "bmm"), examples(train_rows[held], "bmm")
    table = {}
    for layers in (2, 3, 4, 6):
        for width in (64, 128, 256, 512):
            model = fit(fit_ex, TrainConfig(layers=layers, width=width, epochs=15))
            predicted = val_ex.reference_ms * np.exp(model(val_ex.x))
            table.setdefault(f"{layers} layers", {})[f"width {width}"] = float(
                np.mean(np.abs(predicted - val_ex.latency_ms) / val_ex.latency_ms) * 100
            )
    return pd.DataFrame(table).T


if __name__ == "__main__":
    sys.exit(main())
