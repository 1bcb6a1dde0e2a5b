"""How much power a GPU has for its peak: the spec sheet's board power over its peak FP32 rate, in
watts of a TSMC 16FF+ chip (``processes.csv``).

A GEMM kernel keeps every FP32 unit busy; at the boost clock its peak is quoted at, the chip draws
energy per operation times the rate. Where the board power cannot feed that, the clock falls until
it can (:func:`fxcost.cost_models.heads.sustained.clock_share`). The energy an operation takes is the
manufacturing process's: each die's node and that node's power at the same speed, relative to
TSMC's 16FF+ (the Pascal GPUs'), from the foundries' published node-to-node figures. So

    headroom = TDP / (peak FP32 TFLOP/s x energy per operation relative to 16FF+)

is what a GPU has to spend per TFLOP/s of its peak, in 16FF+ watts: a 75 W P4 on 16FF+ 13.6, a 70 W
T4 on 12FFN 11.5, a 250 W A100 PCIe on N7 36.6, a 72 W L4 on 4N 9.7. A relative energy with a
trailing ``?`` is unconfirmed (as in ``gpus.csv``). A die without a row, or a GPU without a TDP or a
peak, has no headroom (None): the GEMM model then knows no cap and reads it at its boost clock.

The model's limits: the board power also feeds memory and fans, which do not slow with the clock;
a mild cap also lowers the voltage, so power falls faster than the clock and the cap is shallower
than this reads; and a tensor-core GEMM draws other power than the FP32 one its peak is read from.

Example:
    >>> from fxcost.gpus import get_device
    >>> round(power_headroom(get_device("T4")), 1)
    11.5
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from fxcost.gpus import Device, all_devices
from fxcost.gpus.order import per_database
from fxcost.gpus.sourced import read_sourced

__all__ = ["TensorClock", "die_of", "power_headroom", "process_energy", "process_source", "tensor_clock"]

# The die in the architecture column: "Pascal (GP104)", "Ada Lovelace (AD102)", "CDNA2 (gfx90a, ...)".
_DIE = re.compile(r"\b(G[PVHAB]\d{3}|TU\d{3}|AD\d{3}|gfx\d[0-9a-f]{2,3})\b", re.IGNORECASE)


def die_of(device: Device) -> str | None:
    """The die ``device`` is built on, as its architecture column names it (NVIDIA's in capitals,
    AMD's ``gfx`` targets in lower case, whatever the column's case); None where it names none."""
    return _die_in(device.architecture or "")


def process_energy(device: Device) -> float | None:
    """The energy an operation takes on ``device``'s manufacturing process, relative to TSMC 16FF+;
    None where its die has no row in ``processes.csv``."""
    row = _row(device)
    return None if row is None else row[0]


def process_source(device: Device) -> str:
    """Where :func:`process_energy` of ``device`` comes from ("unknown" where it has none)."""
    row = _row(device)
    return "unknown" if row is None else row[1]


def power_headroom(device: Device) -> float | None:
    """``device``'s board power per TFLOP/s of its peak FP32 rate, in watts of a 16FF+ chip (see the
    module docstring); None where its TDP, its peak or its process is unknown."""
    energy = process_energy(device)
    if energy is None or not device.tdp_w or not device.fp32_tflops:
        return None
    return float(device.tdp_w) / (float(device.fp32_tflops) * energy)


class TensorClock(NamedTuple):
    """How a GPU runs a large tensor-core GEMM at its TDP: ``share`` of its dense tensor peaks, its SMs
    at ``mhz`` meanwhile; ``stated``: the GPU whose stated clock it is read from."""

    share: float
    mhz: float
    stated: Device


@per_database  # it reads the other GPUs of the die
def tensor_clock(device: Device) -> TensorClock | None:
    """How ``device`` runs a large tensor-core GEMM under its power cap; None where no GPU of its die
    states its tensor clock (no tensor-core cap known).

    A source states ``tensor_clock_mhz`` for the H100 SXM: a tensor-core GEMM sustains about 1.83 GHz
    at 700 W, below the 1.98 GHz boost clock its FP32 peak is quoted at. Its tensor peaks are quoted at
    that clock (989.4 TFLOP/s = 132 SMs x 4096 FLOPs a clock x 1.83 GHz), so it sustains them. Another
    GPU of the same die spends the same energy per tensor operation: where its TDP cannot feed its
    peak at the stated GPU's watts per TFLOP/s, it sustains what it can, its clock falling in
    proportion (the dynamic power falling with the clock at the voltage floor, as for FP32). A 500 W
    H100 SXM then sustains 0.71 of its peaks at 1.31 GHz, an H100 PCIe (350 W) 0.65 at 1.06 GHz, an
    H200 (700 W) all of them at 1.83 GHz. The stated GPU is the first of its die in the table (the
    shipped one before a device file's copy with another TDP). Board power that does not slow with the
    clock (memory, fans) would make a lower-power GPU slower still; a mild cap that also lowers the
    voltage, faster (the 500 W H100 at 0.89 of its peaks were power to fall with the clock's cube).

    Example:
        >>> from fxcost.gpus import get_device
        >>> round(tensor_clock(get_device("H100-SXM-96GB-HBM2e")).share, 2)
        0.71
    """
    die, peak = die_of(device), _tensor_peak(device)
    if die is None or peak is None or not device.tdp_w or not device.num_sms:
        return None
    for stated in all_devices():
        stated_peak = _tensor_peak(stated)
        if (not stated.tensor_clock_mhz or stated_peak is None or not stated.tdp_w or not stated.num_sms
                or die_of(stated) != die):  # fmt: skip
            continue
        share = min(1.0, float(device.tdp_w) / (float(stated.tdp_w) / stated_peak * peak))
        per_sm_and_mhz = stated_peak / (stated.num_sms * float(stated.tensor_clock_mhz))  # the die's
        return TensorClock(share, share * peak / (device.num_sms * per_sm_and_mhz), stated)
    return None


def _tensor_peak(device: Device) -> float | None:
    """The dense 16-bit tensor peak (bf16, else fp16), TFLOP/s; None without one."""
    peak = device.bf16_tflops or device.fp16_tflops
    return float(peak) if peak else None


@functools.cache  # every price of a GEMM on a GPU not measured reads it: the regex once per column
def _die_in(architecture: str) -> str | None:
    found = _DIE.search(architecture)
    if found is None:
        return None
    die = found.group(1)
    return die.lower() if die.lower().startswith("gfx") else die.upper()


def _row(device: Device) -> tuple[float, str] | None:
    """``device``'s row of ``processes.csv``: (relative energy, source)."""
    return _table().get(die_of(device) or "")


@functools.cache
def _table() -> dict[str, tuple[float, str]]:
    return read_sourced("processes.csv", "die", "energy_vs_16ff",
                        lambda row: f"{row['process'].strip()}: {row['sources'].strip()}")  # fmt: skip
