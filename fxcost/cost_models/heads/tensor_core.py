"""Tiled GEMMs and convolutions: fp32 on CUDA cores, bf16, fp16 and TF32 on tensor cores.

Every GEMM kernel, and every convolution run as implicit GEMMs, is priced by its structure, as cuBLAS
and cuDNN run it (:mod:`~fxcost.cost_models.heads.tiling`):

- **Tiles.** The output is cut into tiles of one of the kernel family's shapes, optionally with the
  reduction split in slices (split-K, for few tiles over a long K), whichever is fastest, as the
  library's heuristics pick; each tile is fed at its share of the SM's rate. Tensor-core kernels use
  CUTLASS's tiles, fed at their operand reuse's share (``TENSOR_TILING``); fp32 CUDA-core kernels the
  SGEMM tiles with their shares fit to the shared measurements (:mod:`~fxcost.cost_models.heads.sustained`).
- **Waves.** The tiles run in ``ceil(tiles / SMs)`` waves: CTAs resident together on one SM share its
  cores, so more of them per SM do not finish sooner.
- **Rate.** Each wave runs at the GPU's *sustained* rate (:class:`TiledGemms`): a rate ``fxcost
  calibrate`` measured (``tl.dot``) where the user calibrated the GPU, else the spec-sheet peak of the
  units that run it times the share of its peak the GPU sustains on a large GEMM: its clock under the
  power cap (a tensor-core GEMM's own, where a source gives it) times its kernel generation's share
  (:meth:`~fxcost.cost_models.heads.sustained.GemmFit.share`).
- **Time.** ``max(launch floor, waves x tile time, DRAM bytes / bandwidth)`` per kernel, a split-K's
  partial sums in fp32 written and read back by one more kernel.

Every term grows with every problem dim (tile counts and padded K are ceilings, the candidates are
fixed), so the minimum over candidates never falls as the problem grows (but for alignment:
:func:`~fxcost.cost_models.heads.tensor_work.load_share`).

**GPU order.** Across GPUs a kernel time is the smallest of the GPU's own and those of the GPUs it
beats on every spec (:func:`fxcost.gpus.order.weaker_than`; a calibrated GPU keeps its own measured
rate). The time a node is priced at, the one users read, is that of the op timed alone: the kernel
plus the per-op overhead an eager step hides again (:func:`~fxcost.cost_models.eager.hidden_overhead_ms`,
which grows with the GPUs a GPU beats, so that the heads' kernel times keep GPU order). Kernel plus
that overhead is no order: a floor-bound GEMM took 3 us on an RTX 4090 and on an A10, plus 27 us on
the one (it beats a P100, whose host's harness took 27 us) and 18 us on the other. So the isolated
time is the largest of the GPU's own (kernel plus overhead) and those of every GPU that beats it
(:func:`fxcost.gpus.order.stronger_than`): a GPU that beats another has fewer GPUs above it, so it is
never priced slower, by construction; the kernel time the step takes back off is never below the
GPU's own (no kernel cut under its floor), and keeps GPU order too. The price: a weaker GPU's
floor-bound GEMMs carry the larger overhead of the GPUs above it (up to 12 us on a tiny kernel).

What a node runs (its GEMMs, a convolution's implicit GEMMs and layout passes, the share of the rate
its operand loads allow) is :mod:`fxcost.cost_models.heads.tensor_work`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fxcost.cost_models.eager import hidden_overhead_ms
from fxcost.cost_models.heads.sustained import GemmFit
from fxcost.cost_models.heads.tensor_work import LayoutWorks, TensorWork, layout_works
from fxcost.cost_models.heads.tiling import TENSOR_TILING, Tiling, gemm_kernel_ms, pass_ms
from fxcost.gpus import Device, all_devices
from fxcost.gpus.order import comparable, stronger_than, weaker_than
from fxcost.records import NodeCost

__all__ = ["TiledGemms", "tensor_peak_tflops"]


def tensor_peak_tflops(device: Device, kind: str) -> float | None:
    """The spec-sheet dense peak ``device`` runs GEMMs of ``kind`` at: its tensor cores', or for a half
    precision it has none for (a V100's bf16) its fp32 CUDA cores' (as :func:`fxcost.gpus.order.strength`
    ranks it); None for TF32 without TF32 tensor cores (that is fp32 work, its fp32 twin's)."""
    if kind == "tf32":
        return device.tf32_tflops
    peak = device.bf16_tflops if kind == "bfloat16" else device.fp16_tflops if kind == "float16" else None
    return peak or device.fp32_tflops


class TiledGemms:
    """Prices :class:`TensorWork` on a GPU by its tiles and waves; ``fit`` holds the fp32 tiles and the
    share of its peaks a GPU sustains on a large GEMM."""

    def __init__(self, fit: GemmFit) -> None:
        self.fit = fit

    def tiling(self, kind: str) -> Tiling:
        """The tiles of the kernels that run GEMMs of ``kind``."""
        return self.fit.tiling if kind == "float32" else TENSOR_TILING

    def sustained_tflops(self, device: Device, kind: str) -> float | None:
        """The rate ``device`` sustains on a large GEMM of ``kind``: for a tensor-core kind the
        calibrated ``tl.dot`` rate where measured (TF32 at the calibrated bf16 rate's share of its
        peak), else the peak of the units that run it times the GPU's sustained share; None if the GPU
        has no tensor cores for TF32 or a spec is missing."""
        peak = device.fp32_tflops if kind == "float32" else tensor_peak_tflops(device, kind)
        if peak is None:
            return None
        calibrated = None if kind == "float32" else _calibrated(device, kind)
        if calibrated is not None:
            return calibrated
        share = self.fit.share(device, tensor=kind != "float32")
        return float(peak) * min(share, 1.0) if math.isfinite(share) and share > 0 else None

    def kernel_ms(self, works: Sequence[TensorWork], device: Device) -> np.ndarray:
        """Kernel time (ms) of each work on ``device`` by its own rates (NaN where it has none)."""
        return self.kernel_table(works, [device])[0]

    def kernel_table(self, works: Sequence[TensorWork], devices: Sequence[Device]) -> np.ndarray:
        """:meth:`kernel_ms` on each of ``devices`` (rows), in one vectorized pass: each of a work's
        :attr:`~TensorWork.choices` at its fastest way, as the library picks."""
        choices = [(owner, ways) for owner, work in enumerate(works) for ways in work.choices]
        table = self._candidate_table([*works, *(way for _, ways in choices for way in ways)], devices)
        out = table[:, : len(works)].copy()
        if choices:
            fastest = np.full((len(devices), len(choices)), np.nan)
            choice_of_way = np.repeat(np.arange(len(choices)), [len(ways) for _, ways in choices])
            np.fmin.at(fastest.T, choice_of_way, table[:, len(works) :].T)  # NaN where every way is
            np.add.at(out.T, [owner for owner, _ in choices], fastest.T)
        return out

    def layout_savings_ms(
        self, nodes: Sequence[NodeCost], device: Device, works: LayoutWorks | None = None
    ) -> np.ndarray:
        """The kernel time a step running channels-last saves on each convolution node on ``device``:
        its price on NCHW tensors (:func:`tensor_work`: the layout transposes; for a 1x1 one, per
        gradient the faster of those and a GEMM per image) less its price on NHWC ones. 0 for other
        nodes, and where this model has no price (a GPU without tensor cores for the node's kind).
        ``works``: :func:`layout_works` of ``nodes``, where the caller keeps them across GPUs."""
        found = layout_works(nodes) if works is None else works
        out = np.zeros(len(nodes))
        if found:
            ms = self.kernel_ms([work for _, nchw, nhwc in found for work in (nchw, nhwc)], device)
            out[[i for i, _, _ in found]] = np.nan_to_num(ms[0::2] - ms[1::2], nan=0.0)
        return out

    def _candidate_table(self, works: Sequence[TensorWork], devices: Sequence[Device]) -> np.ndarray:
        """Each work's own kernel time on each of ``devices`` (rows)."""
        out = np.full((len(devices), len(works)), np.nan)
        if not works:
            return out
        gemm_owner = np.repeat(np.arange(len(works)), [len(w.gemms) for w in works])
        pass_owner = np.repeat(np.arange(len(works)), [len(w.passes) for w in works])
        dims = np.array([g for w in works for g in w.gemms], dtype=np.float64).reshape(-1, 4)
        gemm_bytes = np.array([x for w in works for x in w.gemm_bytes], dtype=np.float64)
        shares = np.array([x for w in works for x in w.shares()], dtype=np.float64)
        pass_bytes = np.array([x for w in works for x in w.passes], dtype=np.float64)
        kinds = sorted({w.kind for w in works})
        work_kind = np.array([kinds.index(w.kind) for w in works])
        rows, rates, sms, bandwidths = [], [], [], []
        for row, device in enumerate(devices):
            if device.num_sms is None or device.bandwidth_gbps is None:
                continue
            rate = np.array([self.sustained_tflops(device, kind) or np.nan for kind in kinds])[work_kind]
            rows.append(row)
            rates.append(rate)
            sms.append(float(device.num_sms))
            bandwidths.append(float(device.bandwidth_gbps))
        if not rows:
            return out
        rate = np.array(rates)  # (GPUs, works): NaN where a GPU has no rate for a work's kind
        count = len(rows)
        per_gpu = np.array(sms)[:, None], np.array(bandwidths)[:, None]
        ms = np.zeros((count, len(works)))
        if len(dims):
            gemm = np.empty((count, len(dims)))
            gemm_kind = work_kind[gemm_owner]
            for k, kind in enumerate(kinds):
                mine = gemm_kind == k
                width = int(mine.sum())
                if not width:
                    continue
                gemm[:, mine] = gemm_kernel_ms(
                    np.tile(dims[mine], (count, 1)),
                    np.tile(gemm_bytes[mine], count),
                    rate[:, gemm_owner[mine]].ravel(),
                    np.broadcast_to(per_gpu[0], (count, width)).ravel(),
                    np.broadcast_to(per_gpu[1], (count, width)).ravel(),
                    self.tiling(kind),
                    np.tile(shares[mine], count),
                ).reshape(count, width)
            # A GPU without tensor cores for a kind has NaN there: kept out of the other works' sums.
            np.add.at(ms.T, gemm_owner, np.nan_to_num(gemm, nan=0.0).T)
        if len(pass_bytes):
            np.add.at(ms.T, pass_owner, pass_ms(pass_bytes[None, :], per_gpu[1]).T)
        out[rows] = np.where(np.isfinite(rate), ms, np.nan)
        return out

    def predict(
        self, works: Sequence[TensorWork], device: Device, cache: dict[object, object] | None = None
    ) -> np.ndarray:
        """Isolated-op times (ms, as the heads predict: kernel time plus the per-op overhead an eager
        step hides, :func:`~fxcost.cost_models.eager.hidden_overhead_ms`), in GPU order by
        construction: the largest of ``device``'s own and those of every GPU that beats it, each
        GPU's own being its kernel time (the smallest of its own and those of every GPU it beats; a
        calibrated GPU: its own for tensor-core work) plus its hidden overhead. NaN where ``device``
        has no rate for a work's kind (TF32 without TF32 tensor cores: the fp32 twin prices it).
        ``cache``: a dict kept with ``works`` (the batch's), so that pricing them on another GPU reuses
        every GPU's kernel times."""
        state = _State.of(cache, works)
        found = state.isolated.get(device)
        if found is not None:
            return found
        own = state.kernels(self, [device])[device]
        if np.isfinite(own).any():
            above = stronger_than(device)
            bounds = [state.own_isolated(self, e) for e in (device, *above)]
            # A GPU above without tensor cores for a kind (NaN) bounds nothing there.
            found = np.where(np.isfinite(own), np.fmax.reduce(bounds), np.nan)
        else:
            found = own
        state.isolated[device] = found
        return found


class _State:
    """What :meth:`TiledGemms.predict` keeps of one list of works, per database state: each GPU's
    kernel times, its own isolated times and its final ones."""

    def __init__(self, works: Sequence[TensorWork]) -> None:
        self.works = works
        self.raw: dict[Device, np.ndarray] = {}
        self.own: dict[Device, np.ndarray] = {}
        self.isolated: dict[Device, np.ndarray] = {}

    @classmethod
    def of(cls, cache: dict[object, object] | None, works: Sequence[TensorWork]) -> _State:
        if cache is None:
            return cls(works)
        key = ("tensor_core", tuple(map(id, all_devices())))  # GPUs added or changed: start again
        state = cache.get(key)
        if not isinstance(state, _State):
            state = cache[key] = cls(works)
        return state

    def kernels(self, cores: TiledGemms, devices: Sequence[Device]) -> dict[Device, np.ndarray]:
        """Kernel times on ``devices``, those not computed yet in one pass."""
        todo = [d for d in dict.fromkeys(devices) if d not in self.raw]
        if todo:
            for d, row in zip(todo, cores.kernel_table(self.works, todo), strict=True):
                self.raw[d] = row
        return {d: self.raw[d] for d in devices}

    def own_isolated(self, cores: TiledGemms, device: Device) -> np.ndarray:
        """``device``'s kernel times, the smallest of its own and its weaker GPUs' (on a calibrated GPU
        its own for tensor-core work, which its measured ``tl.dot`` rate prices), plus its hidden
        overhead."""
        found = self.own.get(device)
        if found is None:
            weaker = weaker_than(device)
            if device not in self.raw:  # the GPUs near it are likely asked next: every one at once
                self.kernels(cores, [device, *weaker, *comparable()])
            own = self.raw[device]
            found_below = self.kernels(cores, weaker).values()
            kernel = np.where(np.isfinite(own), np.fmin.reduce([own, *found_below]), np.nan)
            if _is_calibrated(device):
                measured = np.array([w.kind != "float32" for w in self.works])
                kernel = np.where(measured, own, kernel)
            found = self.own[device] = kernel + hidden_overhead_ms(device)
        return found


def _calibrated(device: Device, kind: str) -> float | None:
    bf16, fp16 = device.dot_bf16_tflops, device.dot_fp16_tflops
    if kind == "bfloat16":
        return bf16
    if kind == "float16":
        return fp16
    if kind == "tf32" and bf16 is not None and device.bf16_tflops and device.tf32_tflops:
        return bf16 * device.tf32_tflops / device.bf16_tflops
    return None


def _is_calibrated(device: Device) -> bool:
    return device.dot_bf16_tflops is not None or device.dot_fp16_tflops is not None
