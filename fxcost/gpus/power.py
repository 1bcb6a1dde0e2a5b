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

from fxcost.gpus import Device, all_devices
from fxcost.gpus.order import per_database
from fxcost.gpus.sourced import read_sourced

__all__ = ["die_of", "power_headroom", "process_energy", "process_source", "tensor_clock_share"]

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


@per_database  # it reads the other GPUs of the die
def tensor_clock_share(device: Device) -> float | None:
    """The share of its boost clock ``device`` sustains on a large tensor-core GEMM at its TDP; None
    where no source says (no tensor-core cap known).

    A tensor-core GEMM draws far more power per FP32 peak than :func:`power_headroom` reads for CUDA
    cores: an H100 SXM runs one at about 1.83 GHz of its 1.98 at 700 W (``tensor_clock_mhz``, with its
    source). A GPU whose source states its clock runs at it. Another GPU of the same die spends the same
    energy per tensor operation: the stated one draws its TDP at ``clock share x tensor peak``, so many
    watts per TFLOP/s sustained, and the other sustains what its own TDP feeds at that rate, never
    above its boost clock (the dynamic power falling with the clock at the voltage floor, as for FP32).
    A 500 W H100 SXM then runs 0.66 of its boost clock, an H100 PCIe (350 W) 0.61, an H200 (700 W)
    the H100 SXM's 0.92. Board power that does not slow with the clock (memory, fans) would make a
    lower-power GPU slower still; a mild cap that also lowers the voltage, faster.

    Example:
        >>> from fxcost.gpus import get_device
        >>> round(tensor_clock_share(get_device("H100-SXM-96GB-HBM2e")), 2)
        0.66
    """
    own = _stated_share(device)
    if own is not None:
        return own
    die, peak = die_of(device), _tensor_peak(device)
    if die is None or peak is None or not device.tdp_w:
        return None
    for other in all_devices():
        share, other_peak = _stated_share(other), _tensor_peak(other)
        if share is None or other_peak is None or not other.tdp_w or die_of(other) != die:
            continue
        watts_per_tflops = float(other.tdp_w) / (share * other_peak)
        return min(1.0, float(device.tdp_w) / (watts_per_tflops * peak))
    return None


def _stated_share(device: Device) -> float | None:
    """``tensor_clock_mhz`` over the boost clock, where both are known."""
    if not device.tensor_clock_mhz or not device.boost_clock_mhz:
        return None
    return min(1.0, float(device.tensor_clock_mhz) / float(device.boost_clock_mhz))


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
