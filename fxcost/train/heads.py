"""Training the MLP heads on measurement directories: deterministic, resumable, with a manifest.

``train(data_dirs, out_dir)`` fits one head per op class on the training rows (``ops/``), evaluates it
on the held-out rows (``ops_test/``; for convolutions, which have none, on 10% of the configurations
set aside by a hash of the configuration), and writes ``heads.npz`` and ``manifest.json`` (data files
and their SHA-256, devices, sizes, train and test MAPE per device kept apart). The GEMM classes
(``linear``, ``bmm``) are one tiled model, fit to both at once and written as ``gemm.json``
(:mod:`fxcost.train.gemm`). Every epoch is
checkpointed, so an interrupted run resumes where it stopped; finished heads are not trained again.
GPUs held out by DESIGN.md (H100, L4, A100-80GB) are excluded unless asked for.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fxcost._io import atomic_write
from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import (
    CLOCKED_HEADS,
    FEATURE_VERSION,
    HEAD_OUTPUT,
    HEADS,
    TILED_HEADS,
    load_heads,
    node_features,
    roofline_ms,
    with_device,
)
from fxcost.cost_models.heads.sustained import GEMM_FILE, load_gemm_fit
from fxcost.cost_models.heads.weights import CLOCKED_WATTS
from fxcost.cost_models.mlp import MLP, save_mlps
from fxcost.data.datasets import ELEMENTWISE, read_ops, read_ops_test, row_node
from fxcost.gpus import HELD_OUT_DEVICES, get_device
from fxcost.records import NodeCost
from fxcost.train import mlp
from fxcost.train.gemm import fit_gemm, gemm_rows
from fxcost.train.mlp import Loss

__all__ = ["CONFIG_COLUMNS", "Examples", "TrainConfig", "examples", "fit", "split", "train"]

# Training ops and held-out files per head (None: hold out a share of the training configurations).
SOURCES: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "linear": (("linear",), ("linear",)),
    "bmm": (("bmm",), ("bmm",)),
    "conv": (("conv",), None),
    "ew": (tuple(ELEMENTWISE), ("elem",)),
    "ln": (("ln",), ("ln",)),
    "softmax": (("softmax",), ("softmax",)),
}
CONV_TEST_SHARE = 0.1
CONFIG_COLUMNS = {
    "linear": ["B", "M", "N", "K"], "bmm": ["B", "M", "N", "K"], "ew": ["OPName", "B", "H"],
    "ln": ["B", "H"], "softmax": ["B", "H"],
    "conv": ["B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"],
}  # fmt: skip

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class TrainConfig:
    """Size and schedule of a head. The defaults come from the layers x width study
    (``benchmarks/ops_accuracy.py --size-study``)."""

    layers: int = 3
    width: int = 256
    epochs: int = 40
    batch: int = 512
    lr: float = 2e-3
    seed: int = 0

    def recipe(self, loss: Loss = "log_l1") -> mlp.Recipe:
        """The network and schedule for :func:`fxcost.train.mlp.fit`."""
        hidden = (self.width,) * self.layers
        return mlp.Recipe(hidden, self.epochs, self.batch, self.lr, self.seed, loss=loss, output=HEAD_OUTPUT)


@dataclass
class Examples:
    """Features, targets (log of measured / reference time) and bookkeeping of one head's rows."""

    x: np.ndarray
    y: np.ndarray
    reference_ms: np.ndarray
    latency_ms: np.ndarray
    device: np.ndarray


def examples(frame: Any, head: str, watts: float | None = None) -> Examples:
    """Feature rows for ``head`` from a frame of data-set rows (see :mod:`fxcost.data.datasets`),
    their targets against the heads' bound (``watts``: the GEMM fit's, which prices convolutions;
    :func:`~fxcost.cost_models.heads.features.roofline_ms`).

    A configuration measured on several GPUs is built and featurized once.
    """
    built: dict[tuple[Any, ...], tuple[NodeCost, list[float]]] = {}
    parts = []
    for device_name, group in frame.groupby("device", sort=True):
        device = get_device(device_name)
        keys = [tuple(r) for r in group[["OPName", *CONFIG_COLUMNS[head]]].itertuples(index=False)]
        for key, row in zip(keys, group.itertuples(index=False), strict=True):
            if key not in built:
                node = row_node(row)
                built[key] = (node, node_features(head, node))
        nodes, problem = zip(*(built[k] for k in keys), strict=True)
        reference = roofline_ms(NodeBatch.of(nodes), device, watts)
        latency = group["Latency"].to_numpy(dtype=np.float64)
        parts.append(Examples(with_device(head, problem, device), np.log(latency / reference), reference,
                              latency, np.full(len(group), device_name, dtype=object)))  # fmt: skip
    return Examples(*(np.concatenate([getattr(p, f) for p in parts]) for f in Examples.__dataclass_fields__))


def fit(
    ex: Examples, config: TrainConfig, checkpoint: Path | None = None, progress: Progress | None = None,
    label: str = "", loss: Loss = "log_l1", watts: float | None = None,
) -> MLP:  # fmt: skip
    """Fit a head to ``ex``; resumes from ``checkpoint`` if it was trained on the same features and
    bound (``watts``: the GEMM fit's, for :data:`~fxcost.cost_models.heads.CLOCKED_HEADS`).

    ``loss="log_l1"``: absolute error of ``ex.y`` (log time ratios: relative error). ``loss="mape"``: the
    MAPE of ``ex.y`` taken as raw times (Habitat's training objective, for the baseline).
    """
    per_epoch = None if progress is None else (lambda done, total: progress(label, done, total))
    bound = {} if watts is None else {"watts": watts}  # the other heads' checkpoints stay valid
    return mlp.fit(ex.x, ex.y, config.recipe(loss), checkpoint=checkpoint,
                   fingerprint={"feature_version": FEATURE_VERSION, **bound}, progress=per_epoch)  # fmt: skip


def mape_by_device(model: MLP, ex: Examples) -> dict[str, float]:
    """MAPE (%) of ``model`` on ``ex`` per device, and over all rows (``"all"``)."""
    predicted = ex.reference_ms * np.exp(model(ex.x))
    error = np.abs(predicted - ex.latency_ms) / ex.latency_ms * 100
    result = {str(d): float(error[ex.device == d].mean()) for d in sorted(set(ex.device))}
    result["all"] = float(error.mean()) if len(error) else math.nan
    return result


def _each(data: Sequence[str | Path], read: Callable[[str | Path], Any]) -> list[Any]:
    """``read`` of every data directory that has the files; a directory of new measurements
    (``fxcost collect``) may hold some ops and no held-out files. None having them is an error."""
    frames, missing = [], []
    for d in data:
        try:
            frames.append(read(d))
        except FileNotFoundError as e:
            missing.append(str(e))
    if not frames:
        raise FileNotFoundError("; ".join(missing))
    return frames


def split(
    data: Sequence[str | Path], head: str, exclude: Iterable[str] = HELD_OUT_DEVICES
) -> tuple[Any, Any]:
    """(training rows, held-out rows) of ``head`` from every data directory, excluded devices dropped."""
    import pandas as pd

    train_ops, test_files = SOURCES[head]
    train = pd.concat(_each(data, lambda d: read_ops(d, train_ops)), ignore_index=True)
    if test_files is None:
        key = train[CONFIG_COLUMNS[head]].astype(str).agg("/".join, axis=1)
        held = key.map(
            lambda k: int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) / 2**32 < CONV_TEST_SHARE
        )
        train, test = train[~held], train[held]
    else:
        test = pd.concat(_each(data, lambda d: read_ops_test(d, test_files)), ignore_index=True)
        test = test[test["OPName"].isin(train_ops)]
    return _without(train, exclude), _without(test, exclude)


def _without(rows: Any, devices: Iterable[str]) -> Any:
    return rows[~rows["device"].isin(set(devices))]


def train(
    data: Sequence[str | Path],
    out: str | Path,
    heads: Sequence[str] = HEADS,
    exclude: Iterable[str] = HELD_OUT_DEVICES,
    config: TrainConfig = TrainConfig(),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train ``heads`` on ``data``; writes ``heads.npz``, ``gemm.json`` (the GEMM classes) and
    ``manifest.json`` to ``out`` and returns the manifest."""
    unknown = set(heads) - set(HEADS)
    if unknown:
        raise ValueError(f"unknown heads {sorted(unknown)}; heads: {', '.join(HEADS)}")
    out = Path(out)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest.get("feature_version") != FEATURE_VERSION:
        manifest["heads"] = {}  # heads of other features: train again
    files, excluded = _data_files(data), sorted(set(exclude))
    # The GEMM fit on the same data and devices is done; resumed, it is not fit again (one of an older
    # fxcost's GEMM model is).
    tiled_done = _gemm_watts(out) is not None and manifest.get("data") == files
    tiled_done = tiled_done and manifest.get("excluded_devices") == excluded
    manifest.update({"config": asdict(config), "excluded_devices": excluded, "data": files,
                     "feature_version": FEATURE_VERSION})  # fmt: skip
    manifest.setdefault("heads", {})
    # The GEMM classes are the tiled model's (gemm.json): MLPs an older fxcost trained for them go.
    if not (out / GEMM_FILE).exists():
        for head in TILED_HEADS:
            manifest["heads"].pop(head, None)
    trained = {h: m for h, m in _load_existing(out).items() if h not in TILED_HEADS}
    # The clocked heads' bound runs at the clock the GEMM fit's watts give: they need that fit.
    needs_gemm = any(h in TILED_HEADS or h in CLOCKED_HEADS for h in heads)
    if needs_gemm and not (tiled_done and set(manifest["heads"]) >= TILED_HEADS):
        _fit_tiled(data, out, exclude, manifest, progress)
        _save(out, trained, manifest)
    watts = _gemm_watts(out)
    # A clocked head trained for other watts (the GEMM fit redone on new data) is trained again,
    # asked for or not: kept, it would read its efficiency against a bound it never saw.
    stale = [h for h in sorted(CLOCKED_HEADS) if watts is not None and h in trained and h not in heads
             and manifest["heads"].get(h, {}).get("watts") != watts]  # fmt: skip
    heads = [*heads, *stale]
    for head in (h for h in heads if h not in TILED_HEADS):
        every_row, every_test = split(data, head, exclude=())
        train_rows, test_rows = _without(every_row, exclude), _without(every_test, exclude)
        left_out = _left_out(every_row, exclude)
        if train_rows.empty:
            raise ValueError(f"no training rows for head {head!r} in {', '.join(map(str, data))}")
        mine = watts if head in CLOCKED_HEADS else None  # a clocked head asked for: fit above
        train_ex = examples(train_rows, head, mine)
        entry = manifest["heads"].get(head, {})
        done = entry.get("config") == asdict(config) and entry.get("watts") == mine and head in trained
        if not done:
            trained[head] = fit(
                train_ex, config, out / "checkpoints" / f"{head}.pt", progress, head, watts=mine
            )
        model = trained[head]
        test_ex = examples(test_rows, head, mine) if not test_rows.empty else None
        manifest["heads"][head] = {
            "config": asdict(config),
            "watts": mine,
            "devices": sorted(set(train_ex.device)),
            "left_out_rows": left_out,
            "train_rows": len(train_ex.y),
            "test_rows": 0 if test_ex is None else len(test_ex.y),
            "train_mape": mape_by_device(model, train_ex),
            "test_mape": mape_by_device(model, test_ex) if test_ex is not None else {},
        }
        _save(out, trained, manifest)
    return manifest


def _gemm_watts(out: Path) -> float | None:
    """The watts of the GEMM fit ``out`` holds, None where it holds none this fxcost reads."""
    try:
        return load_gemm_fit(out).watts
    except (FileNotFoundError, ValueError, KeyError):
        return None


def _fit_tiled(
    data: Sequence[str | Path], out: Path, exclude: Iterable[str], manifest: dict[str, Any],
    progress: Progress | None,
) -> None:  # fmt: skip
    """Fit the tiled GEMM model to the ``linear`` and ``bmm`` rows at once (:mod:`fxcost.train.gemm`),
    write ``gemm.json`` and the GEMM heads' manifest entries."""
    import pandas as pd

    if progress is not None:
        progress("gemm", 0, 1)
    frames = {head: split(data, head, exclude=()) for head in sorted(TILED_HEADS)}
    excluded = set(exclude)
    train_rows = pd.concat([_without(rows, excluded) for rows, _ in frames.values()], ignore_index=True)
    test_rows = pd.concat([_without(test, excluded) for _, test in frames.values()], ignore_index=True)
    if train_rows.empty:
        raise ValueError(f"no GEMM training rows in {', '.join(map(str, data))}")
    fit = fit_gemm(gemm_rows(train_rows), gemm_rows(test_rows) if not test_rows.empty else None)
    fit.save(out)
    for head, (rows, test) in frames.items():
        manifest["heads"][head] = {
            "model": "tiled GEMM (gemm.json)",
            "devices": list(fit.devices),
            "left_out_rows": _left_out(rows, excluded),
            "train_rows": int((~rows["device"].isin(excluded)).sum()),
            "test_rows": int((~test["device"].isin(excluded)).sum()),
            "train_mape": fit.metrics["train_mape"].get(head, {}),
            "test_mape": fit.metrics.get("test_mape", {}).get(head, {}),
        }
    if progress is not None:
        progress("gemm", 1, 1)


def _left_out(rows: Any, devices: Iterable[str]) -> dict[str, int]:
    """How many of ``rows`` each of ``devices`` has (the rows a head leaves out)."""
    counts = rows.loc[rows["device"].isin(set(devices)), "device"].value_counts()
    return {str(device): int(n) for device, n in sorted(counts.items())}


def _data_files(data: Sequence[str | Path]) -> list[dict[str, str]]:
    files = []
    for directory in data:
        for path in sorted(Path(directory).rglob("*.csv")):
            if "/ops" in str(path):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                files.append({"path": str(path.relative_to(directory)), "sha256": digest})
    return files


def _load_existing(out: Path) -> dict[str, MLP]:
    try:
        return load_heads(out)
    except (FileNotFoundError, ValueError):  # none yet, or trained on other features: train again
        return {}


def _save(out: Path, heads: dict[str, MLP], manifest: dict[str, Any]) -> None:
    extra = {"feature_version": np.array(FEATURE_VERSION)}
    # The watts its clocked heads were trained against (the manifest's, which the heads saved keep).
    watts = {manifest["heads"].get(h, {}).get("watts") for h in CLOCKED_HEADS if h in heads} - {None}
    if watts:
        extra[CLOCKED_WATTS] = np.array(watts.pop())
    save_mlps(out / "heads.npz", heads, dtype=np.float32, extra=extra)
    atomic_write(out / "manifest.json", json.dumps(manifest, indent=1).encode())
