"""The heads' files: the ones shipped with fxcost, or a directory ``fxcost train`` wrote."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from fxcost.cost_models.heads.features import FEATURE_VERSION, HEAD_OUTPUT
from fxcost.cost_models.mlp import MLP, read_mlps
from fxcost.gpus import Device, UnknownDeviceError, get_device

__all__ = [
    "CLOCKED_WATTS",
    "clocked_watts",
    "load_heads",
    "load_trained",
    "measured_in_training",
    "shipped_heads",
    "shipped_manifest",
    "spec_sheet_caveat",
    "trained_devices",
    "unlike_training",
]


CLOCKED_WATTS = "clocked_watts"
"""The ``heads.npz`` entry that records the GEMM fit's watts its clocked heads (the conv head:
:data:`~fxcost.cost_models.heads.features.CLOCKED_HEADS`) were trained against."""


def clocked_watts(directory: str | Path | None = None) -> float | None:
    """The GEMM fit's watts the clocked heads in ``directory``'s ``heads.npz`` (the shipped one where
    None) were trained against; None where it holds no clocked head or does not say (an older fxcost's)."""
    with _npz(directory) as arrays:
        return None if arrays is None else _watts(arrays)


def load_heads(directory: str | Path | None = None) -> dict[str, MLP]:
    """Heads from ``directory`` (``heads.npz``), or the ones shipped with fxcost."""
    return dict(shipped_heads()) if directory is None else load_trained(directory)[0]


def load_trained(directory: str | Path) -> tuple[dict[str, MLP], float | None]:
    """The heads in ``directory``'s ``heads.npz`` and the watts its clocked heads were trained against
    (:func:`clocked_watts`), read in one pass.

    Raises:
        FileNotFoundError: the directory holds no ``heads.npz``.
    """
    path = Path(directory) / "heads.npz"
    with _npz(directory) as arrays:
        if arrays is None:
            raise FileNotFoundError(f"{path}: no trained heads (run `fxcost train --out {directory}`)")
        return _read(arrays, str(path)), _watts(arrays)


def _watts(arrays: Any) -> float | None:
    return float(arrays[CLOCKED_WATTS]) if CLOCKED_WATTS in arrays.files else None


@functools.cache
def shipped_heads() -> dict[str, MLP]:
    """The shipped heads as one shared mapping (read-only; ``load_heads()`` hands out copies)."""
    with _npz(None) as arrays:
        return {} if arrays is None else _read(arrays, "the shipped heads")


@contextlib.contextmanager
def _npz(directory: str | Path | None) -> Iterator[Any]:
    """The open ``heads.npz`` of ``directory`` (the shipped one where None), None where there is none."""
    if directory is None:
        source: Any = resources.files("fxcost.cost_models").joinpath("weights", "heads.npz")
    else:
        source = Path(directory) / "heads.npz"
    if not source.is_file():
        yield None
        return
    with source.open("rb") as f, np.load(f) as arrays:
        yield arrays


def _read(arrays: Any, source: str) -> dict[str, MLP]:
    version = int(arrays["feature_version"]) if "feature_version" in arrays.files else None
    if version != FEATURE_VERSION:
        raise ValueError(
            f"{source} were trained on feature version {version}; this fxcost computes version "
            f"{FEATURE_VERSION}: retrain them with `fxcost train`"
        )
    return read_mlps(arrays, output=HEAD_OUTPUT)


def shipped_manifest() -> dict[str, Any]:
    """The training manifest of the shipped heads (data files and hashes, devices, metrics)."""
    path = resources.files("fxcost.cost_models").joinpath("weights", "manifest.json")
    return json.loads(path.read_text()) if path.is_file() else {}


def unlike_training(device: Device) -> bool:
    """Whether no GPU the shipped heads were fit on resembles ``device`` (none of its vendor: AMD today).

    Its predictions stand on spec-sheet rates and efficiencies learned on other hardware; outputs say so.
    """
    return device.vendor not in _trained_vendors()


def measured_in_training(device: Device) -> bool:
    """Whether the shipped heads were fit on measurements of ``device`` itself; for every other GPU
    they read its spec sheet (the 80% interval says how far that has been off on held-out GPUs)."""
    return device.name in trained_devices()


@functools.cache
def trained_devices() -> frozenset[str]:
    """Canonical names of the GPUs whose measurements the shipped heads were fit on (any head)."""
    names = set()
    for head in shipped_manifest().get("heads", {}).values():
        for name in head.get("devices", []):
            with contextlib.suppress(UnknownDeviceError):  # a GPU of a file this fxcost does not know
                names.add(get_device(name).name)
    return frozenset(names)


@functools.cache
def _trained_vendors() -> frozenset[str]:
    return frozenset(get_device(name).vendor for name in trained_devices())


def spec_sheet_caveat(device: Device) -> str:
    """What outputs say of a GPU :func:`unlike_training` (empty for the others)."""
    if not unlike_training(device):
        return ""
    return (
        f"caveat: {device.name} is unlike every GPU the heads were fit on; its predictions rest on "
        "spec-sheet rates and efficiencies learned on other hardware, and may be off by more than "
        "the interval"
    )
