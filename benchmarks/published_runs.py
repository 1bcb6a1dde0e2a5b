"""Published large training runs (papers, reports) simulated and compared with their measured figure.

Each row of ``--runs`` (schema: ``shared/data/README.md``, published_runs.csv) names a decoder-only
model by its dimensions, a cluster (GPU and count) and a parallel plan. The decoder is built on meta
tensors as a Hugging Face GPT-2 or Llama of the row's width, heads, MLP width, vocabulary and
sequence, traced with ``TRACED_LAYERS`` layers and simulated ``layers`` deep
(``fxcost.simulate(..., layers=N)``: the traced layers' segments repeated; a 1T-parameter model costs
the trace of two layers).

How a row becomes a simulation (no row is special-cased; any CSV in the schema runs):

- **Model.** GPT-2 blocks (LayerNorm, GELU MLP of ``ffn_hidden``, 4 x ``hidden`` if empty, dropout,
  tied output layer), or Llama's (RMSNorm, rotary embeddings, a SwiGLU MLP of three ``hidden x ffn``
  matrices, no dropout, an output layer of its own: :class:`fxcost.zoo.decoders.Decoder`), with every
  head's keys and values or 8 key/value heads (the grouped-query attention of Llama 2 70B, Llama 3
  and Mistral; flagged ``assumed``): of the three, the one whose parameter count is closest to the
  row's ``params_b``. The schema has no key/value heads; a ``kv_heads`` column, where a CSV has one,
  is read (a Llama of that many).
- **Plan.** ``tp``, ``pp``, ``dp`` (``gpus / (tp pp cp)`` if empty), ZeRO stage, recomputation (full;
  selective as torchtitan's per-op policy where the source or notes name torchtitan, else as
  Megatron-LM's core attention: :func:`fxcost.sim.runs.recompute_of`),
  ``global_batch / (dp micro_batch)`` micro-batches under 1F1B (interleaved with ``vpp`` chunks where
  the micro-batches are a multiple of ``pp``, Megatron's rule; plain 1F1B, flagged, where not),
  sequence parallelism where ``sp`` is set (with ``tp > 1``; ignored at ``tp = 1``), in the row's
  precision. A row with ``ep > 1`` is a mixture of SwiGLU experts of the row's MLP width (Mixtral's):
  as many as its notes state (``"8 experts"``), else the multiple of ``ep`` whose parameters come
  nearest the row's (flagged, with how far off where beyond 15%), each token run by the ``top-k`` the
  notes state, else 2 (flagged), its experts split over ``ep`` ranks (with ``tp``, expert tensor
  parallelism and its sequence parallelism); shared experts are not modelled. A row without ``ep``
  is one only where its parameter count fits the mixture clearly better than the dense model. Not
  supported by the simulator, reported as ``unsupported: ...`` and simulated without: ``cp`` where the
  sequence does not split into ``2 cp`` chunks (folded into data parallelism), ``ep`` where neither
  notes nor count give experts (a dense model), and beyond the largest degree dividing ``ep``, ``dp``
  and the experts. An unstated micro-batch is 1 and an unstated
  global batch one micro-batch per replica (``assumed: ...``).
- **GPU and cluster** (:mod:`fxcost.sim.runs`). The ``gpu`` column names a database entry, or one
  followed by a system or power cap in parentheses (``"V100-SXM3-32GB (DGX-2H)"``, ``"(500W)"``).
  Nodes of the named system (DGX-2/2H: 16 GPUs, 8 EDR NICs), else of 8 GPUs (``gcd(gpus, 8)``), on the
  GPU's NVLink/NVSwitch. Between nodes, the network the source or notes state (``"1600 Gbps RoCE"``
  per node), else the system's, else the GPU generation's DGX fabric, one NIC per GPU: Volta EDR
  100 Gb/s, Ampere HDR 200 Gb/s (Selene, Narayanan et al. SC'21 §5.1), Hopper and later NDR 400 Gb/s.
  How the GPU and network were read is printed after the flags; it does not count as a flag.
- **Framework.** A row whose source or notes name Megatron(-LM) and no ZeRO stage reduces its
  gradients after the backward (Megatron-LM's default until 2023), any other during it.
- **Units.** ``s_per_iter``: the simulated iteration (forward, backward and the optimizer step).
  ``tokens_per_s_per_gpu``: ``global_batch x seq`` per iteration second per GPU. ``tflops_per_gpu``:
  Megatron's count (Narayanan et al. eq. 3, generalized to any MLP width and to grouped-query heads)
  ``B s (k l (4h^2 + 4h g + 4h f + 4 s h) + 6 h V)`` (a SwiGLU MLP's ``6h f`` in place of ``4h f``;
  ``g``: the keys' width, ``h`` with every head's; a mixture's ``top_k`` experts' MLPs and its router's
  ``2 h E``) with ``k = 4`` (the recomputed forward counted:
  hardware FLOPs) under full recomputation and ``k = 3`` otherwise. ``mfu_pct``: the ``k = 3`` count
  over the GPU's dense tensor peak in the row's precision.

A row that cannot run (an unknown GPU, a plan that does not fit the GPUs or the model) prints its error
and the rest go on. ``--cache DIR`` keeps each row's simulated iteration so that an interrupted run
resumes (keyed by the row, :data:`CACHE_FORMAT` and :func:`code_state`, so that a row cached by other
code, another model or other weights is simulated again rather than read back). ``--breakdown`` prints,
under each row, where the first and last stage's iteration goes, each instant counted once
(:func:`fxcost.sim.runs.breakdown`: compute, then tensor-parallel collectives, pipeline sends, the
optimizer step and data-parallel collectives where no kernel runs, idle: the bubble), the collectives'
whole time (hidden included), the compute's share of the GPU's peak, and the rank's memory by kind.

Each row also prints the simulated iteration's nominal 80% interval in the row's unit
(:attr:`fxcost.sim.SimResult.interval_ms`: every compute task at its interval's ends, collectives as
predicted), marked ``!`` where the measured figure lies outside it.

Last line: ``mape_published=.. max_err_published=.. coverage80_published=.. rows=N rows_flagged=N
rows_failed=N`` (coverage: the share of rows whose measured figure lies inside the interval).

    python benchmarks/published_runs.py --runs ../shared/data/published_runs.csv
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import hashlib
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fxcost
from fxcost.gpus import Device
from fxcost.precision import parse_precision
from fxcost.sim import Cluster, SimResult, Strategy, simulate
from fxcost.sim.ranked import peak_tflops
from fxcost.sim.runs import (
    BREAKDOWN_PARTS,
    attention_of,
    breakdown,
    cluster_for,
    mixture_of,
    read_gpu,
    recompute_of,
    sequence_parallel_of,
)
from fxcost.zoo.decoders import Decoder

TRACED_LAYERS = 2
CACHE_FORMAT = 2  # what a cached row keeps: 2, the breakdown's exposed parts and whole collectives
UNITS = ("s_per_iter", "tflops_per_gpu", "tokens_per_s_per_gpu", "mfu_pct")
REQUIRED = ("layers", "hidden", "seq", "gpu", "gpus", "measured", "unit")


class RowError(ValueError):
    """A row that cannot be simulated, with what is wrong in it."""


@dataclass
class Run:
    """One published run, parsed: the model, the plan, the cluster and the figure."""

    model: Decoder
    gpu: str
    gpus: int
    tp: int
    pp: int
    dp: int
    zero: int
    recompute: str  # a policy of fxcost.sim.strategy.RECOMPUTE
    micro_batch: int
    global_batch: int
    precision: str
    measured: float
    unit: str
    flags: list[str] = field(default_factory=list)
    sp: bool = False
    text: str = ""  # the row's source and notes, where a network may be stated
    overlap: bool = True  # gradients reduced during the backward (False: after it, as Megatron-LM does)
    attention: str = "eager"  # "sdpa" where the report runs a fused attention kernel
    vpp: int = 1
    cp: int = 1
    readings: list[str] = field(default_factory=list)  # how the text was read (not assumptions: no flag)
    ep: int = 1

    @property
    def gated(self) -> bool:
        """Whether the stated parameters fit a gated (SwiGLU) MLP."""
        return self.model.gated

    @property
    def strategy(self) -> Strategy:
        micro_batches = self.global_batch // (self.dp * self.micro_batch)
        return Strategy(dp=self.dp, tp=self.tp, pp=self.pp, micro_batches=micro_batches, zero=self.zero,
                        recompute=self.recompute, sp=self.sp, vpp=self.vpp, cp=self.cp, ep=self.ep,
                        overlap_grad_reduce=self.overlap)  # fmt: skip


def _number(raw: dict[str, str], key: str) -> float | None:
    value = (raw.get(key) or "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError as e:
        raise RowError(f"column {key!r} must be a number, got {value!r}") from e
    if math.isinf(number):
        raise RowError(f"column {key!r} must be a finite number, got {value!r}")
    return None if math.isnan(number) else number


def _int(raw: dict[str, str], key: str, default: int | None = None) -> int | None:
    number = _number(raw, key)
    if number is None:
        return default
    if number != int(number) or number < 0:
        raise RowError(f"column {key!r} must be a whole number >= 0, got {raw[key]!r}")
    return int(number)


def _stated(raw: dict[str, str], key: str, default: int, flags: list[str], why: str = "") -> int:
    """Column ``key`` of the row, or ``default`` where it is empty, with a flag saying so."""
    value = _int(raw, key)
    if value is not None:
        return value
    flags.append(f"assumed: {key}={default}" + (f" ({why})" if why else ""))
    return default


def parse_run(raw: dict[str, str]) -> Run:
    """A CSV row as a :class:`Run`, its assumptions and unsupported settings in ``flags``.

    Raises:
        RowError: a required column is empty or not a number, the unit is unknown, the plan does not
            fit the GPUs or the batch.
    """
    missing = [key for key in REQUIRED if not (raw.get(key) or "").strip()]
    if missing:
        raise RowError(f"empty required column(s) {missing}; required: {list(REQUIRED)}")
    flags: list[str] = []
    layers, hidden, seq, gpus = (_int(raw, k) for k in ("layers", "hidden", "seq", "gpus"))
    assert layers is not None and hidden is not None and seq is not None and gpus is not None
    if min(layers, hidden, seq, gpus) < 1:
        raise RowError("layers, hidden, seq and gpus must be >= 1")
    heads = _stated(raw, "heads", max(hidden // 128, 1), flags, "hidden/128")
    ffn = _stated(raw, "ffn_hidden", 4 * hidden, flags, "4h")
    vocab = _stated(raw, "vocab", 51200, flags)
    params_b = _number(raw, "params_b")
    name = raw.get("model", "").strip() or "?"
    # GPT, else Llama with every head's keys and values or with 8 key/value heads (grouped-query
    # attention as Llama 2 70B, Llama 3 and Mistral run it; a ``kv_heads`` column, outside the schema,
    # says which): the one whose parameters the row's count is closest to.
    stated_kv = _int(raw, "kv_heads")
    if stated_kv is not None and (stated_kv < 1 or heads % stated_kv):
        raise RowError(f"kv_heads must divide heads {heads}, got {stated_kv}")
    kv_options = [stated_kv] if stated_kv else [heads] + ([8] if heads > 8 and heads % 8 == 0 else [])
    families = [Decoder(name, layers, hidden, heads, ffn, vocab, seq)] if stated_kv in (None, heads) else []
    families += [
        Decoder(name, layers, hidden, heads, ffn, vocab, seq, gated=True, kv_heads=kv) for kv in kv_options
    ]
    model = families[0] if params_b is None else min(families, key=lambda d: abs(d.params_b - params_b))
    unit = raw["unit"].strip()
    if unit not in UNITS:
        raise RowError(f"unknown unit {unit!r}; accepted: {', '.join(UNITS)}")
    tp, pp, vpp, cp, ep = (_int(raw, k, 1) or 1 for k in ("tp", "pp", "vpp", "cp", "ep"))
    dp = _stated(raw, "dp", gpus // (tp * pp * cp), flags, "gpus/(tp*pp*cp)")
    text = f"{raw.get('source') or ''} {raw.get('notes') or ''}"
    attention, attention_read = attention_of(text)
    readings = [attention_read]
    stated_sp = _int(raw, "sp")
    sp = bool(stated_sp) and tp > 1
    if stated_sp is None and tp > 1:
        sp, sp_read = sequence_parallel_of(text)
        readings += [sp_read] if sp else []
    if cp > 1 and seq % (2 * cp):
        flags.append(f"unsupported: cp={cp} with seq {seq} not in 2*cp chunks (simulated as data parallel)")
        dp, cp = dp * cp, 1
    stated_experts, stated_top = mixture_of(text)
    far = params_b is not None and not 0.67 < model.params_b / params_b < 1.5  # the dense model's count
    if ep > 1 or stated_experts or stated_top or far:
        moe, moe_flags, moe_readings = _mixture(families, params_b, ep, stated_experts, stated_top)
        # without ep, a mixture only where the parameter count says so (notes may name experts otherwise)
        clearly = (
            moe is not None
            and params_b is not None
            and abs(moe.params_b - params_b) < 0.5 * abs(model.params_b - params_b)
        )
        if moe is not None and (ep > 1 or clearly):
            model, flags, readings = moe, flags + moe_flags, readings + moe_readings
    if model.kv_heads not in (None, heads) and not stated_kv:
        flags.append(
            f"assumed: {model.kv_heads} key/value heads (grouped-query, as the parameter count says)"
        )
    if ep > 1 and model.experts == 1:
        flags.append(f"unsupported: ep={ep} (a dense model: no experts stated or counted)")
        ep = 1
    if ep > 1 and (dp % ep or model.experts % ep):
        fit = max(d for d in range(1, ep + 1) if ep % d == 0 and dp % d == 0 and model.experts % d == 0)
        flags.append(
            f"unsupported: ep={ep} with dp={dp} and {model.experts} experts (simulated with ep={fit})"
        )
        ep = fit
    if ep > 1 and tp > 1 and not sp:
        stated_off = stated_sp == 0
        flags.append(
            f"{'unsupported: sp=0' if stated_off else 'assumed: sp'} (expert tensor parallelism runs it)"
        )
        sp = True
    if tp * pp * dp * cp != gpus:
        raise RowError(
            f"tp={tp} x pp={pp} x dp={dp} x cp={cp} makes {tp * pp * dp * cp} GPUs, the row has {gpus}"
        )
    try:
        recompute, recompute_read = recompute_of((raw.get("recompute") or "").strip().lower() or "none", text)
    except ValueError as e:
        raise RowError(str(e)) from e
    readings += [recompute_read] if recompute_read else []
    micro = _stated(raw, "micro_batch", 1, flags)
    batch = _stated(raw, "global_batch", micro * dp, flags)
    if micro < 1 or batch < 1 or batch % (dp * micro):
        raise RowError(f"global_batch {batch} does not split into dp={dp} x micro_batch={micro} pieces")
    micro_batches = batch // (dp * micro)
    if vpp > 1 and (pp == 1 or micro_batches % pp or pp * vpp > layers):
        flags.append(f"unsupported: vpp={vpp} with pp={pp}, {micro_batches} micro-batches, {layers} layers "
                     "(interleaving needs micro-batches a multiple of pp; simulated as 1F1B)")  # fmt: skip
        vpp = 1
    precision = (raw.get("precision") or "").strip().lower() or "fp32"
    if precision not in ("fp32", "tf32", "fp16", "bf16"):
        raise RowError(f"precision must be fp32, tf32, fp16 or bf16, got {precision!r}")
    measured = _number(raw, "measured")
    assert measured is not None
    if measured <= 0:
        raise RowError(f"measured must be > 0, got {measured}")
    zero = _int(raw, "zero", 0) or 0
    # Megatron-LM all-reduces the gradients after the backward (its DDP's overlap_grad_reduce came in
    # 2023, with the distributed optimizer); a ZeRO stage means DeepSpeed's reduction, which overlaps.
    overlap = not ("megatron" in text.lower() and zero == 0)
    return Run(model, raw["gpu"].strip(), gpus, tp, pp, dp, zero, recompute, micro, batch, precision,
               measured, unit, flags, sp, text, overlap, attention, vpp, cp, readings, ep)  # fmt: skip


def _mixture(
    dense: list[Decoder], params_b: float | None, ep: int, stated: int | None, top: int | None
) -> tuple[Decoder | None, list[str], list[str]]:
    """The row's model as a mixture of SwiGLU experts of its MLP width (Mixtral's), with its flags and
    readings: as many experts as its text states, else the multiple of ``ep`` whose count is nearest
    the row's parameters, each token run by the ``top`` its text states, else 2 (Mixtral's, flagged);
    None where neither text nor count says. Shared experts are not modelled (a count absorbs them)."""
    if stated is None and params_b is None:
        return None, [], []
    candidates = []
    for d in (d for d in dense if d.gated):
        counts = [stated] if stated else []
        if params_b is not None and not stated:  # one MLP a layer counted already: the rest are experts
            per_layer = 3 * d.hidden * d.ffn + d.hidden  # an expert's matrices and its router column
            counted = (params_b * 1e9 - d.params) / (d.layers * per_layer) + 1
            below = max(math.floor(counted / ep) * ep, ep, 2)
            counts = [below, below + ep]
        candidates += [dataclasses.replace(d, experts=e, top_k=min(top or 2, e)) for e in counts]
    if not candidates:
        return None, [], []
    model = candidates[0] if params_b is None else min(candidates, key=lambda d: abs(d.params_b - params_b))
    flags, readings = [], []
    if stated:
        readings.append(f"{model.experts} experts of the MLP's width (as the report states)")
    else:
        off = model.params_b / params_b - 1 if params_b else 0.0
        fit = "as the parameter count says" if abs(off) <= 0.15 else f"{off:+.0%} off the parameter count"
        flags.append(f"assumed: {model.experts} experts of the MLP's width ({fit})")
    if top is not None and top == model.top_k:
        readings.append(f"top-{top} routing (as the report states)")
    else:
        beyond = f" (the report's top-{top} exceeds the experts)" if top else ""
        flags.append(f"assumed: top-{model.top_k} routing{beyond}")
    return model, flags, readings


def config_of(run: Run) -> dict[str, Any]:
    """The Hugging Face GPT-2 config of the run's decoder, ``TRACED_LAYERS`` deep."""
    return run.model.hf_config(TRACED_LAYERS, run.model.seq, run.attention)


def iteration_flops(run: Run, hardware: bool) -> float:
    """FLOPs of one iteration in Megatron's count; ``hardware``: the recomputed forward counted."""
    m = run.model
    passes = 4 if hardware else 3
    layers = (
        2 * (m.active_matmul_params - m.vocab * m.hidden) + m.layers * 4 * m.seq * m.hidden
    )  # a token's fwd
    return run.global_batch * m.seq * (passes * layers + 6 * m.hidden * m.vocab)


def in_unit(run: Run, iteration_s: float, device: Device) -> float:
    """The simulated iteration as the row's figure."""
    if run.unit == "s_per_iter":
        return iteration_s
    if run.unit == "tokens_per_s_per_gpu":
        return run.global_batch * run.model.seq / iteration_s / run.gpus
    if run.unit == "tflops_per_gpu":
        return iteration_flops(run, run.recompute == "full") / iteration_s / run.gpus / 1e12
    peak = peak_tflops(device, parse_precision(run.precision))
    return iteration_flops(run, False) / iteration_s / run.gpus / 1e12 / peak * 100


def cluster_of(run: Run) -> tuple[Device, Cluster, list[str]]:
    """The run's GPU, its cluster, and how the GPU string and the network were read (flags)."""
    device, system, flags = read_gpu(run.gpu)
    cluster, network = cluster_for(device, run.gpus, system, run.text)
    return device, cluster, flags + network


@functools.cache
def code_state() -> str:
    """A digest of the installed fxcost's source, shipped weights and GPU tables: what a cached row was
    simulated by."""
    root = Path(fxcost.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in {".py", ".json", ".npz", ".csv"} and path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def simulated(run: Run, cluster: Cluster, cache: Path | None) -> dict[str, Any]:
    """The simulated iteration of ``run`` on ``cluster``: ``iteration_s`` and its nominal 80%
    ``interval_s``, ``oom``, the first and the last stage's ``breakdown`` (ms) and their
    ``memory_gib``; cached by the row."""
    c = cluster
    key = json.dumps([CACHE_FORMAT, code_state(), config_of(run), str(run.strategy), run.global_batch,
                      run.model.layers, run.precision, str(c), repr(c.device), c.intra.bandwidth_gbps,
                      c.inter.bandwidth_gbps, c.nics_per_node],
                     sort_keys=True)  # fmt: skip
    path = cache / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json" if cache else None
    if path is not None and path.exists():
        saved = dict(json.loads(path.read_text()))
        return saved
    result: SimResult = simulate(config_of(run), run.strategy, cluster, batch=run.global_batch,
                                 seqlen=run.model.seq, precision=parse_precision(run.precision),
                                 layers=run.model.layers)  # fmt: skip
    ends = sorted({0, run.pp - 1})
    saved = {"iteration_s": result.iteration_ms / 1000, "oom": result.oom,
             "interval_s": [t / 1000 for t in result.interval_ms],
             "breakdown": [breakdown(result, i) for i in ends],
             "memory_gib": [vars_gib(result.memory[i]) for i in ends]}  # fmt: skip
    if path is not None:
        path.write_text(json.dumps(saved))
    return saved


def vars_gib(memory: Any) -> dict[str, float]:
    """A rank's peak memory by kind, GiB."""
    kinds = ("params", "grads", "optimizer", "activations", "capacity")
    return {k: getattr(memory, k) / 2**30 for k in kinds}


def print_breakdown(run: Run, saved: dict[str, Any], device: Device) -> None:
    """Where the first (and last) stage's iteration goes, and its compute against the GPU's peak."""
    flops = iteration_flops(run, run.recompute == "full") / run.gpus  # per rank, hardware count
    peak = peak_tflops(device, parse_precision(run.precision)) * 1e12
    for part, memory in zip(saved["breakdown"], saved["memory_gib"], strict=True):
        total = part["iteration"]
        shares = "  ".join(f"{k} {part.get(k, 0.0):.0f} ms ({part.get(k, 0.0) / total:.0%})"
                           for k in BREAKDOWN_PARTS)  # fmt: skip
        at_peak = flops / peak * 1000
        totals = f"tp {part['tp_total']:.0f}, p2p {part['p2p_total']:.0f}, dp {part['dp']:.0f}"
        print(f"      iteration {total:.0f} ms: {shares}; hidden included, ms: {totals}; compute at "
              f"{at_peak / part['compute']:.0%} of peak ({at_peak:.0f} ms at peak)")  # fmt: skip
        print("      memory GiB: " + ", ".join(f"{k} {v:.1f}" for k, v in memory.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="/work/shared/data/published_runs.csv", help="published runs CSV")
    parser.add_argument("--cache", help="directory keeping each row's simulated iteration (resume)")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="print where each row's iteration goes (compute, tp, p2p, dp, idle) and memory",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    cache = Path(args.cache) if args.cache else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    with open(args.runs, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"no rows in {args.runs}", file=sys.stderr)
        return 1
    start = time.perf_counter()
    errors: list[float] = []
    inside: list[bool] = []
    flagged = failed = 0
    print(f"{'#':>3} {'model':18s} {'gpu':16s} {'gpus':>5} {'plan':38s} {'unit':21s} {'measured':>9} "
          f"{'predicted':>9} {'80% interval':>19} {'error':>7}  flags")  # fmt: skip
    for number, raw in enumerate(rows, 1):
        head = f"{number:3d} {(raw.get('model') or '?')[:18]:18s} {(raw.get('gpu') or '?')[:16]:16s}"
        try:
            run = parse_run(raw)
            device, cluster, read = cluster_of(run)
            saved = simulated(run, cluster, cache)
            predicted = in_unit(run, saved["iteration_s"], device)
            low, high = sorted(in_unit(run, t, device) for t in saved["interval_s"])
        except Exception as e:  # one bad row (an unknown GPU, a plan that does not fit): the rest go on
            failed += 1
            print(f"{head} ERROR: {type(e).__name__ + ': ' if not isinstance(e, ValueError) else ''}{e}",
                  flush=True)  # fmt: skip
            continue
        flags = run.flags + (["predicted OOM"] if saved["oom"] else [])
        flagged += bool(flags)
        flags += read + run.readings
        error = (predicted - run.measured) / run.measured * 100
        errors.append(error)
        inside.append(low <= run.measured <= high)
        plan = f"{run.strategy}" + (f",mbs={run.micro_batch}" if run.micro_batch > 1 else "")
        span = f"{low:.4g}-{high:.4g}{'' if inside[-1] else ' !'}"
        print(f"{head} {run.gpus:5d} {plan[:38]:38s} {run.unit:21s} {run.measured:9.4g} {predicted:9.4g} "
              f"{span:>19} {error:+6.1f}%  {'; '.join(flags)}", flush=True)  # fmt: skip
        if args.breakdown:
            print_breakdown(run, saved, device)
    mape = sum(abs(e) for e in errors) / len(errors) if errors else math.nan
    worst = max((abs(e) for e in errors), default=math.nan)
    print(f"({time.perf_counter() - start:.0f} s)")
    coverage = sum(inside) / len(inside) if inside else math.nan
    print(f"mape_published={mape:.2f} max_err_published={worst:.2f} coverage80_published={coverage:.2f} "
          f"rows={len(errors)} rows_flagged={flagged} rows_failed={failed}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
