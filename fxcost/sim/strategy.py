"""A parallelization strategy: how one training step is spread over GPUs (Proteus §IV).

:class:`Strategy` holds the degrees of data (``dp``), tensor (``tp``, Megatron-style column and row
parallel linears in attention and MLP blocks) and pipeline (``pp``) parallelism, the micro-batches
and their schedule (GPipe or 1F1B), the ZeRO stage (1-3; 3 is FSDP), activation recomputation (whole
layers, Megatron's selective or torchtitan's per-op policy: :data:`RECOMPUTE`) and Megatron sequence
parallelism (``sp``, with ``tp``: the norms, dropouts and residual adds between
the tensor-parallel blocks split along the sequence), expert parallelism (``ep``: a mixture-of-experts
layer's experts split over ``ep`` of the data-parallel ranks, :mod:`fxcost.sim.moe`), context
parallelism (``cp``: the sequence split over ``cp`` ranks, ring attention, :mod:`fxcost.sim.context`),
interleaved pipeline stages (``vpp``) and HSDP (``shard``).
Like Proteus's strategy tree, a strategy can give modules their own settings that apply to their
children unless overridden deeper (``modules``): recomputation, and ``tp: 1`` for a module that runs
whole on every tensor-parallel rank instead of split (the data and pipeline degrees, which decide
the device groups, hold for the whole model).

It is written as ``"dp=2,tp=4,pp=2,mb=8,zero=1"`` on the command line, or as YAML:

.. code-block:: yaml

    dp: 2
    tp: 4
    pp: 2
    micro_batches: 8
    schedule: 1f1b
    zero: 1
    recompute: none      # or selective, ops, full
    sp: false
    ep: 1
    cp: 1
    vpp: 1
    shard: 0
    modules:
      transformer.h.0: {recompute: full}
      transformer.h.1: {tp: 1}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from fxcost._checks import positive_int
from fxcost.zoo.routing import Routing

__all__ = ["RECOMPUTE", "SCHEDULES", "Recompute", "Strategy"]

Schedule = Literal["gpipe", "1f1b"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b")

Recompute = Literal["none", "selective", "ops", "full"]
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "ops", "full")
"""What a layer runs again before its backward instead of keeping (activation checkpointing):

- ``"none"``: nothing; it keeps every activation.
- ``"selective"``: Megatron-LM's selective recomputation (Korthikanti et al. 2022, §5): the core
  attention, the ops on the ``seq x seq`` scores (``Q K^T``, mask, softmax, dropout, the product with
  ``V``) or a fused attention's forward; it keeps the rest.
- ``"ops"``: torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``): it keeps the
  outputs of its fused attention and of every other linear product (``mm``, or ``addmm`` with a bias:
  the first, third, ...) and its input, and runs every other op of its forward again, with the
  tensor-parallel collectives whose outputs it does not keep (:func:`fxcost.sim.recompute.rerun_collectives`).
- ``"full"``: its whole forward, every collective inside it included (Megatron ``full``,
  ``torch.utils.checkpoint`` of each block); it keeps only its input.
"""
_RECOMPUTE_WORDS = {"0": "none", "false": "none", "no": "none", "1": "full", "true": "full", "yes": "full"}

_SHORT = {"mb": "micro_batches", "sched": "schedule", "rc": "recompute", "overlap": "overlap_grad_reduce"}
_MODULE_SETTINGS = ("recompute", "tp")
_INTEGERS = ("dp", "tp", "pp", "micro_batches", "zero", "ep", "cp", "vpp", "shard")


@dataclass(frozen=True)
class Strategy:
    """How a step is parallelized.

    Attributes:
        dp: data-parallel replicas (each takes ``batch / dp`` samples).
        tp: tensor-parallel ranks per layer (Megatron: attention heads and MLP width split).
        pp: pipeline stages (layers split evenly, embeddings on the first, the head on the last).
        micro_batches: micro-batches per step for the pipeline (each ``batch / dp / micro_batches``).
        schedule: ``"1f1b"`` (PipeDream-flush, the Megatron default) or ``"gpipe"``.
        zero: ZeRO stage: 0 none, 1 optimizer states sharded over ``dp``, 2 also gradients, 3 also
            parameters (FSDP, FSDP2, DeepSpeed ZeRO-3; :mod:`fxcost.sim.zero`).
        recompute: what every layer runs again before its backward (:data:`RECOMPUTE`); True and False
            are read as ``"full"`` and ``"none"``.
        sp: Megatron sequence parallelism (Korthikanti et al. 2022, §4.2.2), needs ``tp > 1``: each
            tensor-parallel block's all-reduce becomes an all-gather before it and a reduce-scatter
            after it, and the layer norms, dropouts and residual adds outside the blocks run on
            ``1/tp`` of the sequence, their activations kept split.
        overlap_grad_reduce: reduce each layer's gradients while the backward goes on (PyTorch DDP,
            FSDP); False reduces them all after the backward, as Megatron-LM does by default.
        modules: per-module settings by dotted path (``{"transformer.h.0": {"recompute": "full"}}``),
            inherited by the module's children unless they have their own.
        ep: expert-parallel ranks (Megatron-LM, DeepSpeed-MoE): each mixture-of-experts layer's experts
            split over ``ep`` ranks of a data-parallel group (``dp % ep == 0``; the world stays
            ``dp * tp * pp * cp``), tokens sent to their experts and back by all-to-alls. With
            ``tp > 1`` (and ``sp``, required) each expert is split over the ``tp`` ranks too.
        expert_load: the share of the routed tokens each expert gets (fractions summing to 1, one per
            expert of a layer; written ``expert_load=0.4/0.2/0.2/0.2``); None: balanced routing. The rank
            whose experts get the most bounds the step.
        cp: context-parallel ranks (Megatron-Core CP, ring attention): every layer runs on ``1/cp`` of
            the sequence, the keys and values passed around the ring; gradients reduced over ``dp * cp``.
        vpp: model chunks per pipeline stage, Megatron's interleaved 1F1B (Narayanan et al. SC21
            §2.2.2): chunk ``c`` of stage ``p`` holds the layers of virtual stage ``c * pp + p``. Needs
            ``pp > 1`` and ``micro_batches`` a multiple of ``pp``, as Megatron-LM does; 1 is plain 1F1B.
        shard: with ZeRO 3, the data-parallel ranks a parameter is sharded over: HSDP (FSDP2 on a 2-D
            mesh, FSDP1's ``HYBRID_SHARD``) shards within groups of ``shard`` consecutive replicas and
            replicates across the ``dp / shard`` groups; 0 shards over all ``dp`` (FSDP, ZeRO-3).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    schedule: Schedule = "1f1b"
    zero: int = 0
    recompute: Recompute | bool = "none"
    sp: bool = False
    overlap_grad_reduce: bool = True
    modules: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    ep: int = 1
    expert_load: tuple[float, ...] | None = None
    cp: int = 1
    vpp: int = 1
    shard: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute", recompute_mode(self.recompute))
        modules = {path: dict(settings) for path, settings in self.modules.items()}
        for path, own in modules.items():
            if "recompute" in own:
                own["recompute"] = recompute_mode(own["recompute"], f"module {path!r}: recompute")
        object.__setattr__(self, "modules", modules)
        for name in ("dp", "tp", "pp", "micro_batches", "ep", "cp", "vpp"):
            positive_int(f"strategy {name}", getattr(self, name))
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {self.schedule!r}; accepted: {', '.join(SCHEDULES)}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.sp and self.tp == 1:
            raise ValueError(f"sequence parallelism (sp) needs tensor parallelism: tp > 1, got tp={self.tp}")
        if self.sp and any(settings.get("tp") == 1 for settings in self.modules.values()):
            raise ValueError("sp with a module at tp=1 is not supported; accepted: either")
        if self.dp % self.ep:
            raise ValueError(f"ep={self.ep} does not divide dp={self.dp}: expert-parallel groups are made of "
                             f"data-parallel ranks; accepted ep: a divisor of dp")  # fmt: skip
        if self.ep > 1 and self.tp > 1 and not self.sp:
            raise ValueError(f"ep={self.ep} with tp={self.tp} needs sequence parallelism, as Megatron-LM "
                             f"does for experts split over tp; accepted: sp=1, or tp=1")  # fmt: skip
        if self.expert_load is not None:
            Routing(self.expert_load)  # raises for loads a captured model's routing would refuse
        if self.vpp > 1 and (self.pp == 1 or self.micro_batches % self.pp or self.schedule != "1f1b"):
            raise ValueError(
                f"interleaved 1F1B (vpp={self.vpp}) needs the 1f1b schedule, pp > 1 and micro-batches a "
                f"multiple of pp; got schedule={self.schedule}, pp={self.pp}, mb={self.micro_batches}"
            )
        if self.shard and self.cp > 1:
            raise ValueError(
                f"shard={self.shard} (HSDP) with cp={self.cp} is not supported; accepted: either"
            )
        if self.shard and (self.zero != 3 or self.shard < 2 or self.dp % self.shard):
            raise ValueError(
                f"shard={self.shard} (HSDP) needs zero=3 and a divisor of dp={self.dp} of at least 2 "
                f"(0: shard over all of dp); got zero={self.zero}"
            )
        for path, settings in self.modules.items():
            unknown = set(settings) - set(_MODULE_SETTINGS)
            if unknown:
                accepted = ", ".join(_MODULE_SETTINGS)
                raise ValueError(f"module {path!r} sets {sorted(unknown)}; per-module settings: {accepted}")
            if settings.get("tp", self.tp) not in (1, self.tp):
                raise ValueError(
                    f"module {path!r} sets tp={settings['tp']}; a module is split over the strategy's "
                    f"tp={self.tp} ranks or runs whole on each (tp=1)"
                )

    @property
    def world_size(self) -> int:
        """GPUs the strategy needs: ``dp * tp * pp * cp``."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def data_ranks(self) -> int:
        """The ranks a dense parameter's gradients are reduced (and ZeRO shards it) over: ``dp * cp``."""
        return self.dp * self.cp

    def micro_batch(self, batch: int) -> int:
        """The samples of one micro-batch on one rank for a global ``batch``.

        Raises:
            ValueError: ``batch`` does not split into ``dp * micro_batches`` equal parts.
        """
        parts = self.dp * self.micro_batches
        positive_int("batch", batch)
        if batch % parts:
            raise ValueError(
                f"batch {batch} does not split into dp={self.dp} x {self.micro_batches} micro-batches; "
                f"accepted: a multiple of {parts}"
            )
        return batch // parts

    def recompute_of(self, module: str) -> Recompute:
        """What ``module`` recomputes (:data:`RECOMPUTE`): the setting of its closest configured ancestor
        (itself included), else the strategy's; ``"none"`` outside the layers (``module`` empty)."""
        return self._setting(module, "recompute", self.recompute) if module else "none"  # normalized

    def tp_of(self, module: str) -> int:
        """How many ranks split ``module``: the strategy's ``tp``, or 1 where a module (or an
        ancestor) is configured to run whole on each tensor-parallel rank."""
        return int(self._setting(module, "tp", self.tp))

    def _setting(self, module: str, name: str, default: Any) -> Any:
        if not self.modules:
            return default
        parts = module.split(".") if module else []
        for depth in range(len(parts), -1, -1):
            settings = self.modules.get(".".join(parts[:depth]))
            if settings is not None and name in settings:
                return settings[name]
        return default

    @classmethod
    def parse(cls, spec: str) -> Strategy:
        """A strategy from ``"dp=2,tp=4,pp=2,mb=8,zero=1,schedule=gpipe,recompute=1,sp=1,ep=2,cp=2"``."""
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(
                    f"strategy item {item!r} is not key=value; e.g. 'dp=2,tp=4,pp=2,mb=8,zero=1'"
                )
            values[key.strip()] = value.strip()
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Strategy:
        """A strategy from its YAML/dict form (short keys ``mb``, ``sched``, ``rc`` accepted)."""
        accepted = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in d.items():
            name = _SHORT.get(key, key)
            if name not in accepted:
                raise ValueError(
                    f"unknown strategy key {key!r}; accepted: {', '.join(sorted(accepted | set(_SHORT)))}"
                )
            values[name] = _coerce(name, value)
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> Strategy:
        """A strategy from a YAML file."""
        import yaml

        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a strategy file holds a mapping, got {type(data).__name__}")
        return cls.from_dict(data)

    def __str__(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"mb={self.micro_batches}"]
        if self.pp > 1:
            parts.append(f"schedule={self.schedule}")
        if self.zero:
            parts.append(f"zero={self.zero}")
        if self.recompute != "none":
            parts.append("recompute=1" if self.recompute == "full" else f"recompute={self.recompute}")
        if self.sp:
            parts.append("sp=1")
        if not self.overlap_grad_reduce and self.data_ranks > 1:
            parts.append("overlap=0")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.expert_load is not None:
            parts.append("expert_load=" + "/".join(f"{x:g}" for x in self.expert_load))
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.vpp > 1:
            parts.append(f"vpp={self.vpp}")
        if self.shard:
            parts.append(f"shard={self.shard}")
        return ",".join(parts)


def recompute_mode(value: Any, what: str = "recompute") -> Recompute:
    """``value`` as one of :data:`RECOMPUTE`: a mode's name, or a boolean (or ``0``/``1``, ``true``/``false``,
    ``yes``/``no``) for ``"full"`` and ``"none"``.

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, bool):
        return "full" if value else "none"
    if not isinstance(value, (str, int)):
        raise ValueError(f"{what} must be one of {', '.join(RECOMPUTE)} (or true/false), got {value!r}")
    word = str(value).strip().lower()
    mode = _RECOMPUTE_WORDS.get(word, word)
    if mode not in RECOMPUTE:
        raise ValueError(f"{what} must be one of {', '.join(RECOMPUTE)} (or true/false), got {value!r}")
    return mode


def _coerce(name: str, value: Any) -> Any:
    if name == "recompute":
        return recompute_mode(value)
    if name in ("sp", "overlap_grad_reduce"):
        if isinstance(value, str):
            if value.lower() not in ("0", "1", "true", "false", "yes", "no"):
                raise ValueError(f"{name} must be true or false, got {value!r}")
            return value.lower() in ("1", "true", "yes")
        return bool(value)
    if name == "expert_load" and value is not None:
        items = value.split("/") if isinstance(value, str) else list(value)
        try:
            return tuple(float(x) for x in items)
        except (TypeError, ValueError) as e:
            raise ValueError(f"expert_load takes fractions, e.g. 0.4/0.2/0.2/0.2; got {value!r}") from e
    if name in _INTEGERS and isinstance(value, str):
        try:
            return int(value)
        except ValueError as e:
            raise ValueError(f"strategy {name} must be an integer, got {value!r}") from e
    if name == "schedule" and isinstance(value, str):
        return value.lower()
    return value
