"""Every op-level predictor fxcost has, on the same held-out rows: one table of their trade-offs.

For each op class the rows are the held-out measurements of :func:`fxcost.train.heads.split`
(``ops_test``, and the conv configurations never trained on). Columns:

- ``roofline``: spec-sheet roofline, no measurement;
- ``justus``: Justus et al.'s per-layer network (fully connected and convolution layers only);
- ``habitat``: Habitat's hybrid — for kernel-alike ops its wave scaling (Equation 1 alone) from the
  same configuration measured on each other GPU; for kernel-varying ones (linear, bmm, conv) a
  Habitat-style MLP (raw time from the op's dims and Habitat's four GPU features, MAPE loss, §3.4)
  trained in the same run on the training rows;
- ``fxcost``: fxcost's default with no origin (the MLP heads);
- ``fxcost_runtime``: fxcost's default with each other GPU's measurement of the configuration as
  origin (wave scaling with overheads and L2, heads' ratio for matmuls and convolutions).

Runtime columns average over every (origin, target) pair that measured the configuration. Each cell is
the MAPE (%) over devices, like the benchmarks. Lattuada et al.'s regression predicts whole runs, not
ops: its comparison is in ``benchmarks/seed_models.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fxcost.cost_models import NodeBatch, model_chain, predict_batch
from fxcost.data.datasets import row_node
from fxcost.gpus import get_device
from fxcost.train.heads import CONFIG_COLUMNS, Examples, TrainConfig, examples, fit, split

__all__ = ["MODELS", "compare_ops", "habitat_mlp_ms"]

KERNEL_VARYING = ("linear", "bmm", "conv")

MODELS = ("roofline", "justus", "habitat", "fxcost", "fxcost_runtime")
_ORIGIN_FREE = {"roofline": "roofline", "justus": "justus", "fxcost": "auto"}
_RUNTIME = {"habitat": "habitat_eq1", "fxcost_runtime": "auto"}


def compare_ops(
    data: str | Path,
    heads: Sequence[str] = ("linear", "bmm", "conv", "ew", "ln", "softmax"),
    progress: Callable[[str], Any] | None = None,
) -> Any:
    """A DataFrame: one row per op class, one column per predictor (MAPE %), plus ``rows``."""
    import pandas as pd

    table = {}
    for head in heads:
        if progress:
            progress(head)
        train_rows, rows = split([data], head)
        rows = rows.reset_index(drop=True)
        nodes = [row_node(r) for r in rows.itertuples(index=False)]
        measured = rows["Latency"].to_numpy(dtype=np.float64)
        devices = rows["device"].to_numpy()
        errors: dict[str, np.ndarray] = {m: np.full(len(rows), np.nan) for m in MODELS}
        for device_name in sorted(set(devices)):
            index = np.flatnonzero(devices == device_name)
            device = get_device(device_name)
            batch = NodeBatch.of([nodes[i] for i in index])
            for column, model in _ORIGIN_FREE.items():
                predicted = _predict(batch, model, device)
                errors[column][index] = np.abs(predicted - measured[index]) / measured[index] * 100
        keys = rows[CONFIG_COLUMNS[head]].astype(str).agg("/".join, axis=1).to_numpy()
        for column, model in _RUNTIME.items():
            errors[column] = _runtime_errors(nodes, keys, devices, measured, model)
        if head in KERNEL_VARYING:  # Habitat predicts these with its MLPs, not wave scaling
            order = np.concatenate([np.flatnonzero(devices == d) for d in sorted(set(devices))])
            predicted = np.empty(len(rows))
            predicted[order] = habitat_mlp_ms(examples(train_rows, head), examples(rows, head), head)
            errors["habitat"] = np.abs(predicted - measured) / measured * 100
        per_device = {m: pd.Series(e).groupby(devices).mean().mean() for m, e in errors.items()}
        table[head] = {**per_device, "rows": len(rows)}
    return pd.DataFrame(table).T


def habitat_mlp_ms(train: Examples, test: Examples, head: str, epochs: int = 20) -> np.ndarray:
    """A Habitat-style MLP (§3.4: raw time from the op's dims and the GPU's memory, bandwidth, SMs
    and peak FLOPS, MAPE loss) fit on ``train`` and predicting ``test``'s rows, in ms."""
    raw = Examples(_habitat_features(train, head), train.latency_ms, train.reference_ms, train.latency_ms,
                   train.device)  # fmt: skip
    model = fit(raw, TrainConfig(epochs=epochs), loss="mape")
    return np.maximum(model(_habitat_features(test, head)), 1e-6)


def _habitat_features(ex: Examples, head: str) -> np.ndarray:
    """Op dims (the first problem features, un-logged) plus Habitat's four GPU features, unscaled."""
    dims = {"linear": 4, "bmm": 4, "conv": 6, "ew": 2, "ln": 2, "softmax": 2}[head]
    gpu = []
    for name in ex.device:
        d = get_device(name)
        gpu.append([d.memory_gb, d.mem_bandwidth_gbps, d.num_sms, d.fp32_tflops])
    return np.c_[np.exp(ex.x[:, :dims]) if head != "ew" else ex.x[:, :dims], np.asarray(gpu, dtype=float)]


def _predict(batch: NodeBatch, model: str, device: Any) -> np.ndarray:
    return predict_batch(batch, model_chain(model, batch.origin), device)[0]


def _runtime_errors(
    nodes: list[Any], keys: np.ndarray, devices: np.ndarray, measured: np.ndarray, model: str
) -> np.ndarray:
    """Mean error of each row predicted from every other GPU's measurement of its configuration."""
    import dataclasses

    by_key: dict[tuple[str, str], int] = {
        (k, d): i for i, (k, d) in enumerate(zip(keys, devices, strict=True))
    }
    total, count = np.zeros(len(nodes)), np.zeros(len(nodes))
    names = sorted(set(devices))
    for origin in names:
        for target in names:
            if origin == target:
                continue
            pairs = [(by_key[k, origin], i) for i, (k, d) in enumerate(zip(keys, devices, strict=True))
                     if d == target and (k, origin) in by_key]  # fmt: skip
            if not pairs:
                continue
            sources = [dataclasses.replace(nodes[j], origin_ms=float(measured[j])) for j, _ in pairs]
            batch = NodeBatch.of(sources, origin=get_device(origin))
            predicted = _predict(batch, model, get_device(target))
            index = np.array([i for _, i in pairs])
            error = np.abs(predicted - measured[index]) / measured[index] * 100
            ok = np.isfinite(error)
            np.add.at(total, index[ok], error[ok])
            np.add.at(count, index[ok], 1)
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)
