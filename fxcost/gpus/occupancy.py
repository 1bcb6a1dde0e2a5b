"""CUDA occupancy: how many blocks of a kernel fit on one SM, and how many run in one wave.

The rules of the CUDA occupancy calculator: a block's warps, registers (allocated per warp in units of
``reg_alloc_unit``) and shared memory (allocated per block in units of ``smem_alloc_unit_bytes``, plus
the per-block reservation from compute capability 8.0) must fit the SM's limits, and no more than
``max_blocks_per_sm`` blocks are resident. ``W_i`` of Habitat's Equation 1, the thread blocks in one
wave, is the resulting blocks per SM times the SM count.

Example:
    >>> from fxcost.gpus import get_device
    >>> blocks_per_sm(get_device("V100-PCIE-32GB"), threads_per_block=256, registers_per_thread=64)
    4
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fxcost.gpus import Device

__all__ = ["Launch", "blocks_per_sm", "sm_version", "wave_size"]


def sm_version(device: Device) -> int | None:
    """The compute capability as ``major·10 + minor`` (90 for Hopper, also for a device file's
    ``"9.0a"``), None where unknown."""
    found = re.fullmatch(r"(\d+)\.(\d+)[a-z]?", (device.compute_capability or "").strip())
    return None if found is None else 10 * int(found.group(1)) + int(found.group(2))


@dataclass(frozen=True, slots=True)
class Launch:
    """One kernel launch: grid and block dimensions, registers per thread, dynamic shared memory.

    ``registers_per_thread`` is None where unknown (it then limits nothing).
    """

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers_per_thread: int | None = None
    shared_memory_bytes: int = 0

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)


def blocks_per_sm(
    device: Device,
    threads_per_block: int,
    registers_per_thread: int | None = None,
    shared_memory_bytes: int = 0,
) -> int:
    """Resident blocks per SM of a kernel on ``device``: the tightest of the warp, register,
    shared-memory and block-count limits.

    Raises:
        ValueError: the block cannot launch on this device at all, or the device lacks the limits.
    """
    threads_sm, blocks_sm, max_threads, regs_sm, warp_size, reg_unit, smem_unit, smem_kb = _limits(device)
    if not 1 <= threads_per_block <= max_threads:
        raise ValueError(
            f"{threads_per_block} threads per block cannot launch on {device.name} (1 to {max_threads})"
        )
    warps = math.ceil(threads_per_block / warp_size)
    fits = [blocks_sm, threads_sm // warp_size // warps]
    if registers_per_thread:
        if device.max_regs_per_thread and registers_per_thread > device.max_regs_per_thread:
            raise ValueError(f"{registers_per_thread} registers per thread exceed {device.name}'s limit")
        per_warp = _round_up(registers_per_thread * warp_size, reg_unit)
        fits.append(regs_sm // per_warp // warps)
    if shared_memory_bytes:
        per_block = _round_up(shared_memory_bytes + (device.smem_reserved_per_block_bytes or 0), smem_unit)
        fits.append(int(smem_kb * 1024) // per_block)
    blocks = min(fits)
    if blocks < 1:
        raise ValueError(f"a block of this kernel does not fit on one SM of {device.name}")
    return blocks


def wave_size(device: Device, launch: Launch) -> int:
    """``W``: thread blocks of ``launch`` that run at once on ``device`` (blocks per SM x SMs)."""
    if device.num_sms is None:
        raise ValueError(f"{device.name} has no SM count")
    per_sm = blocks_per_sm(
        device, launch.threads_per_block, launch.registers_per_thread, launch.shared_memory_bytes
    )
    return per_sm * device.num_sms


def _limits(device: Device) -> tuple[int, ...]:
    names = ("max_threads_per_sm", "max_blocks_per_sm", "max_threads_per_block", "regs_per_sm", "warp_size",
             "reg_alloc_unit", "smem_alloc_unit_bytes", "smem_per_sm_kb")  # fmt: skip
    values = [getattr(device, name) for name in names]
    missing = [name for name, value in zip(names, values, strict=True) if not value]
    if missing:
        raise ValueError(f"{device.name} lacks the per-SM limits occupancy needs: {', '.join(missing)}")
    return tuple(int(v) for v in values)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit
