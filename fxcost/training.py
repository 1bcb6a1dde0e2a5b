"""Training the MLP heads on measurement directories: deterministic, resumable, with a manifest.

``train(data_dirs, out_dir)`` fits one head per op class on the training rows (``ops/``), evaluates it
on the held-out rows (``ops_test/``; for convolutions, which have none, on 10% of the configurations
set aside by a hash of the configuration), and writes ``heads.npz`` and ``manifest.json`` (data files
and their SHA-256, devices, sizes, train and test MAPE per device kept apart). Every epoch is
checkpointed, so an interrupted run resumes where it stopped; finished heads are not trained again.
GPUs held out by DESIGN.md (H100, L4, A100-80GB) are excluded unless asked for.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fxcost._io import atomic_write
from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import FEATURE_VERSION, HEADS, MLP, node_features, roofline_ms, with_device
from fxcost.datasets import ELEMENTWISE, read_ops, read_ops_test, row_node
from fxcost.devices import get_device
from fxcost.records import NodeCost

__all__ = ["HELD_OUT_DEVICES", "TrainConfig", "examples", "fit", "train"]

HELD_OUT_DEVICES = frozenset({"H100-SXM", "H100-PCIE", "L4", "A100-PCIE-80GB", "A100-SXM4-80GB"})

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
_CONFIG = {
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


@dataclass
class Examples:
    """Features, targets (log of measured / reference time) and bookkeeping of one head's rows."""

    x: np.ndarray
    y: np.ndarray
    reference_ms: np.ndarray
    latency_ms: np.ndarray
    device: np.ndarray


def examples(frame: Any, head: str) -> Examples:
    """Feature rows for ``head`` from a frame of data-set rows (see :mod:`fxcost.datasets`).

    A configuration measured on several GPUs is built and featurized once.
    """
    built: dict[tuple[Any, ...], tuple[NodeCost, list[float]]] = {}
    parts = []
    for device_name, group in frame.groupby("device", sort=True):
        device = get_device(device_name)
        keys = [tuple(r) for r in group[["OPName", *_CONFIG[head]]].itertuples(index=False)]
        for key, row in zip(keys, group.itertuples(index=False), strict=True):
            if key not in built:
                node = row_node(row)
                built[key] = (node, node_features(head, node))
        nodes, problem = zip(*(built[k] for k in keys), strict=True)
        reference = roofline_ms(NodeBatch.of(nodes), device)
        latency = group["Latency"].to_numpy(dtype=np.float64)
        parts.append(Examples(with_device(head, problem, device), np.log(latency / reference), reference,
                              latency, np.full(len(group), device_name, dtype=object)))  # fmt: skip
    return Examples(*(np.concatenate([getattr(p, f) for p in parts]) for f in Examples.__dataclass_fields__))


def fit(
    ex: Examples, config: TrainConfig, checkpoint: Path | None = None, progress: Progress | None = None,
    label: str = "", loss: str = "log_l1",
) -> MLP:  # fmt: skip
    """Fit an MLP to ``ex``; resumes from ``checkpoint``.

    ``loss="log_l1"``: absolute error of ``ex.y`` (log time ratios: relative error). ``loss="mape"``: the
    MAPE of ``ex.y`` taken as raw times (Habitat's training objective, for the baseline).
    """
    import torch

    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    mean, std = ex.x.mean(axis=0), ex.x.std(axis=0) + 1e-9
    x = torch.tensor((ex.x - mean) / std, dtype=torch.float32)
    y = torch.tensor(ex.y, dtype=torch.float32)
    layers: list[torch.nn.Module] = []
    width_in = x.shape[1]
    for _ in range(config.layers):
        layers += [torch.nn.Linear(width_in, config.width), torch.nn.ReLU()]
        width_in = config.width
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width_in, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.epochs)
    start = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        resumable = (asdict(config), len(ex.y), x.shape[1], FEATURE_VERSION)
        if (state["config"], state["rows"], state.get("features"), state.get("version")) == resumable:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            schedule.load_state_dict(state["schedule"])
            generator.set_state(state["generator"])
            start = state["epoch"]
    with _one_thread():
        for epoch in range(start, config.epochs):
            order = torch.randperm(len(y), generator=generator)
            for i in range(0, len(y), config.batch):
                batch = order[i : i + config.batch]
                optimizer.zero_grad()
                error = (model(x[batch])[:, 0] - y[batch]).abs()
                objective = (error / y[batch]).mean() if loss == "mape" else error.mean()
                objective.backward()
                optimizer.step()
            schedule.step()
            if checkpoint is not None:
                state = {"config": asdict(config), "rows": len(ex.y), "features": x.shape[1],
                         "version": FEATURE_VERSION, "epoch": epoch + 1,
                         "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "schedule": schedule.state_dict(), "generator": generator.get_state()}  # fmt: skip
                _atomic_torch_save(state, checkpoint)
            if progress is not None:
                progress(label, epoch + 1, config.epochs)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    return MLP(low=ex.x.min(axis=0), high=ex.x.max(axis=0), mean=mean, std=std,
               weights=tuple(m.weight.detach().double().numpy().T.copy() for m in linears),
               biases=tuple(m.bias.detach().double().numpy().copy() for m in linears))  # fmt: skip


@contextmanager
def _one_thread() -> Iterator[None]:
    """Train on one thread: with two, MKL's matmuls now and then split their sums differently (about one
    run in twelve on a 2-core machine), and 40 epochs amplify the last bit into different heads, so a
    resumed run would not equal an uninterrupted one. The MLPs are small; one thread costs ~10%."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
        key = train[_CONFIG[head]].astype(str).agg("/".join, axis=1)
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
    """Train ``heads`` on ``data``; writes ``heads.npz`` and ``manifest.json`` to ``out`` and returns the
    manifest."""
    unknown = set(heads) - set(HEADS)
    if unknown:
        raise ValueError(f"unknown heads {sorted(unknown)}; heads: {', '.join(HEADS)}")
    out = Path(out)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest.get("feature_version") != FEATURE_VERSION:
        manifest["heads"] = {}  # heads of other features: train again
    manifest.update({"config": asdict(config), "excluded_devices": sorted(set(exclude)),
                     "data": _data_files(data), "feature_version": FEATURE_VERSION})  # fmt: skip
    manifest.setdefault("heads", {})
    trained = dict(_load_existing(out))
    for head in heads:
        every_row, every_test = split(data, head, exclude=())
        train_rows, test_rows = _without(every_row, exclude), _without(every_test, exclude)
        left_out = every_row.loc[every_row["device"].isin(set(exclude)), "device"].value_counts()
        if train_rows.empty:
            raise ValueError(f"no training rows for head {head!r} in {', '.join(map(str, data))}")
        train_ex = examples(train_rows, head)
        done = manifest["heads"].get(head, {}).get("config") == asdict(config) and head in trained
        if not done:
            trained[head] = fit(train_ex, config, out / "checkpoints" / f"{head}.pt", progress, head)
        model = trained[head]
        test_ex = examples(test_rows, head) if not test_rows.empty else None
        manifest["heads"][head] = {
            "config": asdict(config),
            "devices": sorted(set(train_ex.device)),
            "left_out_rows": {str(device): int(rows) for device, rows in sorted(left_out.items())},
            "train_rows": len(train_ex.y),
            "test_rows": 0 if test_ex is None else len(test_ex.y),
            "train_mape": mape_by_device(model, train_ex),
            "test_mape": mape_by_device(model, test_ex) if test_ex is not None else {},
        }
        _save(out, trained, manifest)
    return manifest


def _data_files(data: Sequence[str | Path]) -> list[dict[str, str]]:
    files = []
    for directory in data:
        for path in sorted(Path(directory).rglob("*.csv")):
            if "/ops" in str(path):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                files.append({"path": str(path.relative_to(directory)), "sha256": digest})
    return files


def _load_existing(out: Path) -> dict[str, MLP]:
    from fxcost.cost_models.heads import load_heads

    try:
        return load_heads(out)
    except (FileNotFoundError, ValueError):  # none yet, or trained on other features: train again
        return {}


def _save(out: Path, heads: dict[str, MLP], manifest: dict[str, Any]) -> None:
    arrays: dict[str, np.ndarray] = {"feature_version": np.array(FEATURE_VERSION)}
    for name, model in heads.items():
        arrays.update({k: v.astype(np.float32) for k, v in model.to_arrays(name).items()})
    atomic_write(out / "heads.npz", lambda f: np.savez_compressed(f, **arrays))  # type: ignore[arg-type]
    atomic_write(out / "manifest.json", json.dumps(manifest, indent=1).encode())


def _atomic_torch_save(state: dict[str, Any], path: Path) -> None:
    import torch

    atomic_write(path, lambda f: torch.save(state, f))
