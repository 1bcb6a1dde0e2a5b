"""Habitat's wave scaling (§3.3, Equations 1-3): scale a kernel-alike op measured on one GPU to another.

A kernel of ``B`` thread blocks runs in ``ceil(B / W_i)`` waves of ``W_i`` blocks on GPU ``i``; a wave's
time scales with the achieved memory bandwidth ``D_i`` when the kernel is bandwidth bound and with
the clock ``C_i`` and wave size when it is compute bound, weighted by gamma:

    T_d = ceil(B/W_d) * (D_o/D_d * W_d/W_o)^gamma * (C_o/C_d)^(1-gamma) * ceil(B/W_o)^-1 * T_o   (Eq. 1)
    T_d = (D_o/D_d)^gamma * (W_o/W_d)^(1-gamma) * (C_o/C_d)^(1-gamma) * T_o                      (Eq. 2)
    gamma = 1 - 0.5 x/R  if x < R,  else  0.5 R/x,   x = FLOP/byte of the kernel, R = P_d/D_d      (Eq. 3)

``W_i`` comes from the occupancy calculator, the kernels from the origin trace's profiler records or,
failing those, from lowering; ``D_i`` is the database's achieved bandwidth.

fxcost adds three effects the measurements show and Equation 1 lacks:

- fixed costs: an op timed with CUDA events costs a per-op overhead (launch, dispatch) on top of its
  waves, and never less than a launch floor. Only the part above the origin's overhead is scaled:
  ``T_d = max(floor_d, overhead_d + Eq1(T_o - overhead_o))``. On small kernels Habitat's equations
  are off by 35-190% on the training rows; with the overheads, 15%. Where the origin's profiler timed
  the node's kernels (a trace captured with fxcost on a GPU), their summed duration ``K_o`` is the
  part to scale and no floor is needed: ``T_d = overhead_d + Eq1(K_o)``. On the lent H100 and H200
  the event-timed ops carried a median 4-41 us of launch overhead beyond their kernels, depending on
  the machine and the model, so subtracting the database's 18 us would be a guess where a
  measurement exists.
- bandwidth share: Equation 3 weighs a kernel's time by how memory bound its arithmetic intensity
  makes it, as if it ran at the bandwidth roof. Many do not: on the lent H100 and H200 ResNet-50's
  kernel-alike ops moved their bytes at a median 18-47% of the achieved bandwidth, an LSTM's at
  5-11%, and they sped up far less than the H200's 43% more bandwidth. Only the share of the origin
  time the bytes explain at the origin's achieved bandwidth, ``u = min(1, bytes / (D_o T_o))``,
  follows a change of bandwidth: gamma becomes ``u * gamma``. Cross-GPU error of the wave-scaled nodes of the
  H100/H200 traces fell from 22% to 4%, and on the shared test rows from 4.2% to 4.0% (no
  parameter is fit).
- L2 capacity: row kernels (softmax, layer norm) read each row again in later passes. The re-reads
  hit L2 while a wave's rows fit there and go to DRAM when they do not, so the DRAM traffic is
  ``bytes + reread_bytes * miss(S / L2)``, ``S`` = rows of one wave, ``miss`` a ramp from 0 at
  ``S = L2_RAMP[0] * L2`` to 1 at ``L2_RAMP[1] * L2``. The measured traffic of softmax saturates at
  twice and of layer norm at 1.5 times the single-pass bytes, as the kernels' passes predict. The
  ramp was fit on the training rows (``benchmarks/calibrate_devices.py``), whose rows are at most
  4100 elements long, so it is only loosely determined.

The strategies below are interchangeable functions of one signature; :class:`WaveScaling` picks one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.interface import NodeBatch, register
from fxcost.gpus import Device
from fxcost.gpus.occupancy import Launch, wave_size
from fxcost.lowering import KernelSpec, is_matmul_class, lower
from fxcost.records import NodeCost

__all__ = [
    "L2_RAMP",
    "Strategy",
    "WaveScaling",
    "dram_traffic_factor",
    "equation_1",
    "equation_2",
    "gamma",
    "kernels_of",
]

# Working set of one wave, in units of the L2 size, where row re-reads start and stop missing L2.
L2_RAMP = (0.4, 1.1)


def bandwidth_share(nbytes: int | None, kernel_ms: float, device: Device) -> float:
    """The share of a kernel's measured time its DRAM traffic explains at ``device``'s achieved
    bandwidth (1 where unknown). Only that share of the time can follow a change of bandwidth."""
    if not nbytes or kernel_ms <= 0 or not device.bandwidth_gbps:
        return 1.0
    return min(1.0, nbytes / (device.bandwidth_gbps * 1e6) / kernel_ms)


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
    traffic_o: float = 1.0
    traffic_d: float = 1.0


Strategy = Callable[[ScalingInputs], float]


def equation_1(k: ScalingInputs) -> float:
    """Habitat's Equation 1, with the wave-count ceilings."""
    d_o, d_d = _bandwidth(k.origin), _bandwidth(k.dest)
    c_o, c_d = _clock(k.origin), _clock(k.dest)
    waves_d, waves_o = math.ceil(k.blocks / k.wave_d), math.ceil(k.blocks / k.wave_o)
    memory = (d_o / d_d) * (k.traffic_d / k.traffic_o) * (k.wave_d / k.wave_o)
    ratio = memory**k.gamma * (c_o / c_d) ** (1 - k.gamma)
    return waves_d * ratio / waves_o * k.origin_ms


def equation_2(k: ScalingInputs) -> float:
    """Habitat's Equation 2: Equation 1 for many waves (``ceil(B/W) ~ B/W``)."""
    d_o, d_d = _bandwidth(k.origin), _bandwidth(k.dest)
    c_o, c_d = _clock(k.origin), _clock(k.dest)
    memory = (d_o / d_d) * (k.traffic_d / k.traffic_o)
    return memory**k.gamma * ((k.wave_o / k.wave_d) * (c_o / c_d)) ** (1 - k.gamma) * k.origin_ms


STRATEGIES: dict[str, Strategy] = {"eq1": equation_1, "eq2": equation_2}


@dataclass(frozen=True)
class WaveScaling:
    """Runtime-based prediction for kernel-alike nodes measured on a GPU origin.

    Attributes:
        strategy: ``"eq1"`` (default) or ``"eq2"``.
        extended: add fxcost's fixed costs and L2 re-read traffic; False is Habitat's equation alone.
    """

    strategy: str = "eq1"
    extended: bool = True

    @property
    def name(self) -> str:
        return "wave_scaling" if self.extended else f"habitat_{self.strategy}"

    def predict(self, batch: NodeBatch, device: Device) -> np.ndarray:
        out = np.full(len(batch), np.nan)
        origin = batch.origin
        if origin is None or origin.num_sms is None or device.num_sms is None:
            return out
        scale = STRATEGIES[self.strategy]
        kernels = batch.derived("wave_scaling.kernels", lambda: [_scalable_kernels(n) for n in batch.nodes])
        for i, node in enumerate(batch.nodes):
            if not node.has_kernel:
                out[i] = 0.0
            elif node.origin_ms is None or not kernels[i]:
                continue
            elif device == origin:
                out[i] = node.origin_ms  # nothing to scale: the measurement is the answer
            else:
                out[i] = self._scale(node, kernels[i], origin, device, scale)
        return out

    def _scale(
        self, node: NodeCost, kernels: list[_Kernel], origin: Device, dest: Device, scale: Strategy
    ) -> float:
        assert node.origin_ms is not None
        kernel_ms = node.kernel_ms if self.extended else None
        if kernel_ms is not None:
            body = kernel_ms
        else:
            body = max(node.origin_ms - (origin.overhead_ms if self.extended else 0.0), 0.0)
        share = bandwidth_share(node.bytes, body, origin) if self.extended else 1.0
        total_weight = sum(k.weight for k in kernels)
        scaled = 0.0
        for k in kernels:
            try:
                wave_o, wave_d = _wave(origin, k.launch), _wave(dest, k.launch)
            except ValueError:
                return math.nan
            inputs = ScalingInputs(
                origin_ms=body * k.weight / total_weight,
                blocks=k.launch.blocks,
                wave_o=wave_o,
                wave_d=wave_d,
                origin=origin,
                dest=dest,
                gamma=gamma(k.flops_per_byte, dest) * share,
            )
            if self.extended and k.reread_ratio:
                inputs = dataclasses.replace(
                    inputs,
                    traffic_o=_traffic(k, origin, wave_o),
                    traffic_d=_traffic(k, dest, wave_d),
                )
            scaled += scale(inputs)
        if not self.extended:
            return scaled
        if kernel_ms is not None:  # the kernel time is known: no floor stands in for it
            return dest.overhead_ms + scaled
        return max(dest.floor_ms, dest.overhead_ms + scaled)


@dataclass(frozen=True)
class _Kernel:
    launch: Launch
    weight: float  # share of the node's time
    flops_per_byte: float
    reread_ratio: float = 0.0  # re-read bytes per single-pass byte (0: one pass)
    block_bytes: int = 0


def _scalable_kernels(node: NodeCost) -> list[_Kernel]:
    """The kernels wave scaling scales: none for kernel-varying (matmul-class) or kernel-free nodes."""
    if not node.has_kernel or is_matmul_class(node.op):
        return []
    return kernels_of(node)


def kernels_of(node: NodeCost) -> list[_Kernel]:
    """The kernels of ``node`` with their share of its time.

    From the lowering (shares by bytes), unless the origin trace recorded the kernels: then their
    launches, shares by measured duration, and the re-read traffic of the lowering when it lowers to
    as many kernels.
    """
    # A launch chunked for 32-bit indexing repeats one spec (hundreds of times at an axis table's
    # largest sizes): one kernel object for it, built once (with the weights' sum below, a tenth of a
    # profiled 1,000-point sweep).
    made: dict[int, _Kernel] = {}
    lowered = []
    for s in lower(node) or []:
        if id(s) not in made:
            made[id(s)] = _Kernel(s.launch, s.bytes if s.bytes > 0 else 1.0, _ratio(s.flops, s.bytes),
                                  _reread_ratio(s), s.block_bytes)  # fmt: skip
        lowered.append(made[id(s)])
    recorded = [k for k in node.kernels if k.grid is not None and k.block is not None]
    if not recorded:
        return lowered
    timed = all(math.isfinite(k.duration_ms) and k.duration_ms > 0 for k in recorded)
    intensity = _ratio(_number(node.flops), _number(node.bytes))
    if len(lowered) == len(recorded):
        rereads = [(k.reread_ratio, k.block_bytes) for k in lowered]
    else:
        rereads = [(0.0, 0)] * len(recorded)
    return [
        _Kernel(
            Launch(k.grid, k.block, k.registers_per_thread, k.shared_memory_bytes or 0),  # type: ignore[arg-type]
            k.duration_ms if timed else 1.0,
            intensity,
            reread_ratio,
            block_bytes,
        )
        for k, (reread_ratio, block_bytes) in zip(recorded, rereads, strict=True)
    ]


def _number(x: int | None) -> float:
    return math.nan if x is None else float(x)


def _reread_ratio(spec: KernelSpec) -> float:
    return spec.reread_bytes / spec.bytes if math.isfinite(spec.bytes) and spec.bytes > 0 else 0.0


def dram_traffic_factor(kernels: list[_Kernel], device: Device) -> float:
    """DRAM traffic of a node's ``kernels`` on ``device`` over its single-pass bytes: 1 plus the row
    re-reads that miss L2 (see the module docstring), weighted by each kernel's share."""
    total = sum([k.weight for k in kernels])  # a list: twice as fast as a generator on chunked launches
    if not total:
        return 1.0
    extra = 0.0
    for k in kernels:
        if k.reread_ratio:
            with contextlib.suppress(ValueError):  # a launch the device cannot run: no re-read estimate
                extra += k.weight * (_traffic(k, device, _wave(device, k.launch)) - 1.0)
    return 1.0 + extra / total


def _traffic(kernel: _Kernel, device: Device, wave: int) -> float:
    """DRAM traffic of ``kernel`` over its single-pass bytes when ``wave`` blocks run at once: its row
    re-reads come from DRAM as far as one wave's rows miss ``device``'s L2."""
    return 1.0 + kernel.reread_ratio * _l2_miss(device, wave * kernel.block_bytes)


def _l2_miss(device: Device, working_set_bytes: float) -> float:
    """Fraction of row re-reads that miss L2 when one wave's rows take ``working_set_bytes``."""
    if not device.l2_bytes:
        return 1.0
    fill = working_set_bytes / device.l2_bytes
    low, high = L2_RAMP
    return min(max((fill - low) / (high - low), 0.0), 1.0)


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
    return WaveScaling("eq1", extended=False)


@register("habitat_eq2")
def _habitat_eq2() -> WaveScaling:
    return WaveScaling("eq2", extended=False)
