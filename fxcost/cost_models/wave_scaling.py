"""Habitat's wave scaling (§3.3, Equations 1-3): scale a kernel-alike op measured on one GPU to another.

A kernel of ``B`` thread blocks runs in ``ceil(B / W_i)`` waves of ``W_i`` blocks on GPU ``i``; a wave's
time scales with the achieved memory bandwidth ``D_i`` when the kernel is bandwidth bound and with
the clock ``C_i`` and wave size when it is compute bound, weighted by gamma:

    T_d = ceil(B/W_d) * (D_o/D_d * W_d/W_o)^gamma * (C_o/C_d)^(1-gamma) * ceil(B/W_o)^-1 * T_o   (Eq. 1)
    T_d = (D_o/D_d)^gamma * (W_o/W_d)^(1-gamma) * (C_o/C_d)^(1-gamma) * T_o                      (Eq. 2)
    gamma = 1 - 0.5 x/R  if x < R,  else  0.5 R/x,   x = FLOP/byte of the kernel, R = P_d/D_d      (Eq. 3)

``W_i`` comes from the occupancy calculator, the kernels from the origin trace's profiler records or,
failing those, from lowering; ``D_i`` is the database's achieved bandwidth.

fxcost adds what the data shows Equation 1 lacks (Habitat's Eq. 1 has no fixed costs): an op timed
with CUDA events costs a fixed per-op overhead (launch, dispatch) on top of its waves, and never less
than a launch floor. Only the part above the origin's overhead is wave-scaled:

    T_d = max(floor_d, overhead_d + Eq1(T_o - overhead_o))

The strategies below are interchangeable functions of one signature; :class:`WaveScaling` picks one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models import NodeBatch, register
from fxcost.devices import Device
from fxcost.devices.occupancy import Launch, wave_size
from fxcost.lowering import is_matmul_class, lower
from fxcost.records import NodeCost

__all__ = ["Strategy", "WaveScaling", "equation_1", "equation_2", "gamma", "kernels_of"]


def gamma(flops_per_byte: float, device: Device, peak_tflops: float | None = None) -> float:
    """Equation 3: memory-boundness of a kernel of arithmetic intensity ``flops_per_byte`` on ``device``.

    ``R = P / D`` is the device's ridge point (fp32 peak unless ``peak_tflops`` is given, achieved
    bandwidth). An unknown intensity (NaN) counts as memory bound: gamma = 1, as Habitat does.
    """
    peak = peak_tflops if peak_tflops is not None else device.fp32_tflops
    bandwidth = device.bandwidth_gbps
    if not math.isfinite(flops_per_byte) or peak is None or not bandwidth:
        return 1.0
    ridge = peak * 1e12 / (bandwidth * 1e9)
    if flops_per_byte < ridge:
        return 1.0 - 0.5 * flops_per_byte / ridge
    return 0.5 * ridge / flops_per_byte


@dataclass(frozen=True)
class ScalingInputs:
    """What a strategy needs to scale one kernel from origin ``o`` to destination ``d``."""

    origin_ms: float
    blocks: int
    wave_o: int
    wave_d: int
    origin: Device
    dest: Device
    gamma: float


Strategy = Callable[[ScalingInputs], float]


def equation_1(k: ScalingInputs) -> float:
    """Habitat's Equation 1, with the wave-count ceilings."""
    d_o, d_d = _bandwidth(k.origin), _bandwidth(k.dest)
    c_o, c_d = _clock(k.origin), _clock(k.dest)
    waves_d, waves_o = math.ceil(k.blocks / k.wave_d), math.ceil(k.blocks / k.wave_o)
    ratio = ((d_o / d_d) * (k.wave_d / k.wave_o)) ** k.gamma * (c_o / c_d) ** (1 - k.gamma)
    return waves_d * ratio / waves_o * k.origin_ms


def equation_2(k: ScalingInputs) -> float:
    """Habitat's Equation 2: Equation 1 for many waves (``ceil(B/W) ~ B/W``)."""
    d_o, d_d = _bandwidth(k.origin), _bandwidth(k.dest)
    c_o, c_d = _clock(k.origin), _clock(k.dest)
    return (d_o / d_d) ** k.gamma * ((k.wave_o / k.wave_d) * (c_o / c_d)) ** (1 - k.gamma) * k.origin_ms


STRATEGIES: dict[str, Strategy] = {"eq1": equation_1, "eq2": equation_2}


@dataclass(frozen=True)
class WaveScaling:
    """Runtime-based prediction for kernel-alike nodes measured on a GPU origin.

    Attributes:
        strategy: ``"eq1"`` (default) or ``"eq2"``.
        overheads: model the fixed per-op overhead and launch floor (fxcost); False is Habitat's
            equation alone.
    """

    strategy: str = "eq1"
    overheads: bool = True

    @property
    def name(self) -> str:
        return "wave_scaling" if self.overheads else f"habitat_{self.strategy}"

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        out = np.full(len(batch), np.nan)
        origin = batch.origin
        if origin is None or origin.num_sms is None or device.num_sms is None:
            return out
        scale = STRATEGIES[self.strategy]
        for i, node in enumerate(batch.nodes):
            if not node.has_kernel:
                out[i] = 0.0
            elif node.origin_ms is not None and not is_matmul_class(node.op):
                out[i] = self._node(node, origin, device, scale)
        return out

    def _node(self, node: NodeCost, origin: Device, dest: Device, scale: Strategy) -> float:
        kernels = kernels_of(node)
        if not kernels or node.origin_ms is None:
            return math.nan
        body = node.origin_ms - (origin.overhead_ms if self.overheads else 0.0)
        body = max(body, 0.0)
        total_weight = sum(w for _, w, _ in kernels)
        scaled = 0.0
        for launch, weight, intensity in kernels:
            try:
                wave_o, wave_d = _wave(origin, launch), _wave(dest, launch)
            except ValueError:
                return math.nan
            inputs = ScalingInputs(
                origin_ms=body * weight / total_weight,
                blocks=launch.blocks,
                wave_o=wave_o,
                wave_d=wave_d,
                origin=origin,
                dest=dest,
                gamma=gamma(intensity, dest),
            )
            scaled += scale(inputs)
        if not self.overheads:
            return scaled
        return max(dest.floor_ms, dest.overhead_ms + scaled)


def kernels_of(node: NodeCost) -> list[tuple[Launch, float, float]]:
    """(launch, weight, FLOP/byte) of each kernel of ``node``: the profiler's records when the origin
    trace has them (weighted by measured duration), else the lowering (weighted by bytes)."""
    intensity = (node.flops / node.bytes) if (node.flops is not None and node.bytes) else math.nan
    recorded = [k for k in node.kernels if k.grid is not None and k.block is not None]
    if recorded:
        durations = [k.duration_ms for k in recorded]
        equal = not all(math.isfinite(d) and d > 0 for d in durations)
        return [
            (
                Launch(k.grid, k.block, k.registers_per_thread, k.shared_memory_bytes or 0),  # type: ignore[arg-type]
                1.0 if equal else k.duration_ms,
                intensity,
            )
            for k in recorded
        ]
    specs = lower(node)
    if not specs:
        return []
    return [
        (s.launch, s.bytes if math.isfinite(s.bytes) and s.bytes > 0 else 1.0, _ratio(s.flops, s.bytes))
        for s in specs
    ]


@functools.lru_cache(maxsize=4096)
def _wave(device: Device, launch: Launch) -> int:
    return wave_size(device, launch)


def _bandwidth(device: Device) -> float:
    bandwidth = device.bandwidth_gbps
    if not bandwidth:
        raise ValueError(f"{device.name} has no memory bandwidth")
    return bandwidth


def _clock(device: Device) -> float:
    clock = device.boost_clock_mhz
    if not clock:
        raise ValueError(f"{device.name} has no clock")
    return clock


def _ratio(flops: float, bytes_: float) -> float:
    return flops / bytes_ if math.isfinite(flops) and math.isfinite(bytes_) and bytes_ > 0 else math.nan


@register("wave_scaling")
def _wave_scaling() -> WaveScaling:
    return WaveScaling()


@register("habitat_eq1")
def _habitat_eq1() -> WaveScaling:
    return WaveScaling("eq1", overheads=False)


@register("habitat_eq2")
def _habitat_eq2() -> WaveScaling:
    return WaveScaling("eq2", overheads=False)
