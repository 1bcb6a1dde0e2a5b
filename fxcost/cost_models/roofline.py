"""Roofline cost model: the baseline every other model must beat.

A kernel takes ``max(flops / peak_flops, bytes / bandwidth)`` plus a fixed launch floor, the shortest
time any kernel takes on the GPU's timeline. Peaks are spec-sheet values: CUDA-core fp32 for fp32 work,
tensor-core peaks for fp16/bf16 matmul-class ops (those PyTorch's flop registry counts) and for fp32
ones that may use TF32 (``NodeCost.tf32``). Nodes that launch no kernel cost zero; a node whose bytes
are unknown has no prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fxcost.cost_models.interface import NodeBatch, register
from fxcost.gpus import Device

__all__ = ["LAUNCH_FLOOR_MS", "Roofline"]

# The shortest kernels on NVIDIA GPUs since Pascal last about 2-3 us on the device timeline
# (launch, scheduling, tail); a single documented constant until a calibrated per-device floor exists.
LAUNCH_FLOOR_MS = 0.003


@dataclass(frozen=True)
class Roofline:
    """``time = max(flops / peak, bytes / bandwidth) + launch floor`` per kernel-launching node; the
    spec bandwidth, or with ``achieved_bandwidth`` the one the GPU achieves (``Device.bandwidth_gbps``:
    calibrated, else its memory controller class's share of the spec)."""

    launch_floor_ms: float = LAUNCH_FLOOR_MS
    name: str = "roofline"
    achieved_bandwidth: bool = False

    def predict(
        self,
        batch: NodeBatch,
        device: Device,
        traffic: np.ndarray | float = 1.0,
        flops: np.ndarray | None = None,
    ) -> np.ndarray:
        """Per-node ms; ``traffic`` scales each node's bytes to what its kernels move from DRAM, and
        ``flops`` stands for the nodes' work where given (a bound counting a faster algorithm's)."""
        if device.mem_bandwidth_gbps is None:
            return np.full(len(batch), np.nan)
        work = np.nan_to_num(batch.flops) if flops is None else flops
        ms = self.ms(work, batch.bytes * traffic, self.peak_tflops(batch, device), device)
        return np.where(batch.has_kernel, ms, 0.0)

    def ms(
        self, flops: np.ndarray, nbytes: np.ndarray, peak_tflops: np.ndarray | float, device: Device
    ) -> np.ndarray:
        """The bound of kernels of ``flops`` and DRAM ``nbytes`` at ``peak_tflops`` on ``device``, plus
        the launch floor (NaN where the device lacks a peak or a bandwidth)."""
        spec = device.mem_bandwidth_gbps
        bandwidth = (device.bandwidth_gbps if self.achieved_bandwidth else spec) or np.nan
        compute_ms = flops / (np.asarray(peak_tflops, dtype=np.float64) * 1e9)
        return np.maximum(compute_ms, nbytes / (bandwidth * 1e6)) + self.launch_floor_ms

    @staticmethod
    def peak_tflops(batch: NodeBatch, device: Device) -> np.ndarray:
        """Each node's peak TFLOP/s on ``device``: fp32 CUDA cores, or tensor cores for matmul-class ops in
        half precision or allowed TF32."""
        fp32 = device.fp32_tflops or np.nan
        half = device.fp16_tflops or fp32
        tf32 = device.tf32_tflops or fp32  # GPUs without TF32 (before Ampere) run fp32 on CUDA cores
        peak = np.where(batch.matmul & batch.tf32, tf32, fp32)
        return np.where(batch.matmul & (batch.itemsize == 2), half, peak)


@register("roofline")
def _roofline() -> Roofline:
    return Roofline()
