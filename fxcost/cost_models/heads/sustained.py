"""The share of its spec-sheet peak a GPU sustains on a large GEMM, and the fp32 CUDA-core tiles: the
part of the tiled GEMM model (:mod:`~fxcost.cost_models.heads.tiling`) fit to measurements.

A GPU runs a large GEMM below its peak for two reasons a spec sheet can be read for:

- **The clock under the power cap.** At the boost clock its peak is quoted at, a GEMM draws ``watts``
  per TFLOP/s of peak on a TSMC 16FF+ chip, less on a finer process; where the board power cannot
  feed that, the clock falls until it can. A GPU's :func:`~fxcost.gpus.power.power_headroom` is its
  TDP over its peak FP32 rate and its process's energy per operation, so it sustains
  ``clock share = min(1, headroom / watts)`` of its boost clock (:func:`clock_share`), the dynamic
  power falling with the clock at the voltage floor a capped card runs at. ``watts`` is one number
  for every GPU. A 75 W P4 (headroom 13.6) and a 70 W T4 (11.5) run large fp32 GEMMs well below
  their peak; a 250 W V100 (23.8) or A100 PCIe (36.6, on 7 nm) at their boost clock.
- **The tensor clock.** A tensor-core GEMM draws far more power than the FP32 one the headroom is
  read for. Where a source states the clock one sustains (an H100 SXM about 1.83 GHz, the clock its
  tensor peaks are quoted at), a GPU of that die sustains the share of its tensor peaks its own TDP
  feeds at the stated GPU's watts per TFLOP/s (:func:`~fxcost.gpus.power.tensor_clock`: a 500 W H100
  0.71). Where no GPU of its die states one, tensor-core work runs at the FP32 clock share.
- **The kernels.** cuBLAS ships its CUDA-core SGEMM kernels per generation, and a GPU runs its
  generation's (:func:`kernel_family`; the kernel names in the measurements say which: Pascal runs
  ``maxwell_sgemm``, Volta and Turing ``volta_sgemm``, Ampere ``ampere_sgemm``, and the H100 the
  same CUTLASS ``sm80`` kernels). Each family's best tile sustains its own share of the peak.

So a GPU sustains ``family share x clock share`` of its peak (:meth:`GemmFit.share`). Both are fit to
the shared measurements (``fxcost train``, :mod:`fxcost.train.gemm`); a GPU measured in them keeps
the share its own rows gave. A family without measurements (a new generation, an AMD GPU) takes the
newest measured family before it, else the oldest after it.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fxcost._io import atomic_write
from fxcost.cost_models.heads.tiling import Tiling
from fxcost.gpus import Device, UnknownDeviceError, get_device
from fxcost.gpus.occupancy import sm_version
from fxcost.gpus.power import power_headroom, tensor_clock

__all__ = [
    "FAMILIES",
    "GEMM_FILE",
    "GemmFit",
    "clock_share",
    "kernel_family",
    "load_gemm_fit",
    "shipped_gemm_fit",
]

FAMILIES = ("maxwell", "volta", "ampere")
"""cuBLAS's CUDA-core SGEMM kernel generations, oldest first."""

GEMM_FILE = "gemm.json"


def kernel_family(device: Device) -> str | None:
    """The generation of CUDA-core GEMM kernels ``device`` runs, None for a GPU without a readable CUDA
    compute capability (AMD): compute capability 6 and below run ``maxwell`` kernels, 7 ``volta``, 8 and above
    ``ampere`` (CUTLASS's ``sm80`` SIMT kernels, as the H100 recordings show)."""
    version = sm_version(device)
    if version is None:
        return None
    major = version // 10
    return "maxwell" if major < 7 else "volta" if major == 7 else "ampere"


def clock_share(device: Device, watts: float) -> float:
    """The share of its boost clock ``device`` sustains on a large GEMM that draws ``watts`` per
    TFLOP/s of peak on a 16FF+ chip: its :func:`~fxcost.gpus.power.power_headroom` over ``watts``,
    never above the boost clock. Where the headroom is unknown (no TDP, peak or process: a device
    file whose architecture names no die of ``processes.csv``), no cap is known and the GPU is read
    at its boost clock."""
    headroom = power_headroom(device)
    return 1.0 if headroom is None else min(1.0, headroom / watts)


@dataclass(frozen=True)
class GemmFit:
    """The fitted part of the tiled GEMM model.

    Attributes:
        tiling: the fp32 CUDA-core kernels' tiles; the best tile's share is 1.
        watts: what a large GEMM draws per TFLOP/s of peak at the boost clock, in watts of a 16FF+
            chip (:func:`clock_share`).
        family_shares: each measured kernel family's share of the peak at the sustained clock.
        measured_shares: each GPU measured in the fit (canonical name), the share its rows gave.
        devices: the GPUs the fit saw; ``metrics``: its errors, train and test apart.
    """

    tiling: Tiling
    watts: float
    family_shares: Mapping[str, float]
    measured_shares: Mapping[str, float] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def share(self, device: Device, tensor: bool = False) -> float:
        """The share of its fp32 peak ``device`` sustains on a large GEMM, or with ``tensor`` of its
        tensor peaks: its family's share under the power cap, the tensor-core one where a source gives
        it (:func:`~fxcost.gpus.power.tensor_clock`), else the FP32 clock's. A GPU measured in the fit
        keeps the share its rows gave (no training GPU's die has a tensor clock)."""
        measured = self.measured_shares.get(device.name)
        if measured is not None:
            return measured
        capped = tensor_clock(device) if tensor else None
        clock = capped.share if capped else clock_share(device, self.watts)
        return self.family_share(kernel_family(device)) * clock

    def family_share(self, family: str | None) -> float:
        """The share of ``family``'s kernels; for a family the fit has no measurements of, the newest
        measured family before it, else the oldest after it (an unknown family: the newest)."""
        if family is not None and family in self.family_shares:
            return float(self.family_shares[family])
        known = [f for f in FAMILIES if f in self.family_shares]
        if not known:
            return math.nan
        if family not in FAMILIES:
            return float(self.family_shares[known[-1]])
        older = [f for f in known if FAMILIES.index(f) < FAMILIES.index(family)]
        return float(self.family_shares[older[-1] if older else known[0]])

    def to_json(self) -> dict[str, Any]:
        t = self.tiling
        return {
            "tiles": [list(tile) for tile in t.tiles], "shares": list(t.shares), "k_step": t.k_step,
            "k_overhead": t.k_overhead, "splits": list(t.splits), "floor_ms": t.floor_ms,
            "watts": self.watts, "family_shares": dict(self.family_shares),
            "measured_shares": dict(self.measured_shares), "devices": list(self.devices),
            "metrics": dict(self.metrics),
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GemmFit:
        if "watts" not in data:  # an older fxcost's fit, which read the clock off the base clock (kappa)
            raise ValueError("a GEMM fit of an older fxcost (its clock model has no 'watts'): "
                             "run `fxcost train` again into the same --out")  # fmt: skip
        tiling = Tiling(
            tiles=tuple((int(a), int(b)) for a, b in data["tiles"]),
            shares=tuple(float(s) for s in data["shares"]),
            k_step=int(data["k_step"]), k_overhead=float(data["k_overhead"]),
            splits=tuple(int(s) for s in data["splits"]), floor_ms=float(data["floor_ms"]),
        )  # fmt: skip
        measured = {}
        for name, value in data.get("measured_shares", {}).items():
            try:
                measured[get_device(name).name] = float(value)
            except UnknownDeviceError:  # a GPU of another database: nothing to look it up by
                continue
        return cls(tiling, float(data["watts"]), {k: float(v) for k, v in data["family_shares"].items()},
                   measured, tuple(data.get("devices", ())), data.get("metrics", {}))  # fmt: skip

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / GEMM_FILE
        atomic_write(path, json.dumps(self.to_json(), indent=1).encode())
        return path


def load_gemm_fit(directory: str | Path | None = None) -> GemmFit:
    """The GEMM fit ``fxcost train`` wrote to ``directory``, or the shipped one."""
    if directory is None:
        return shipped_gemm_fit()
    path = Path(directory) / GEMM_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no GEMM fit (run `fxcost train --out {directory}`)")
    try:
        return GemmFit.from_json(json.loads(path.read_text()))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


@functools.cache
def shipped_gemm_fit() -> GemmFit:
    """The GEMM fit shipped with fxcost (fit on the shared training data only)."""
    path = resources.files("fxcost.cost_models").joinpath("weights", GEMM_FILE)
    return GemmFit.from_json(json.loads(path.read_text()))
