"""GPU spec database: canonical device names, aliases and spec-sheet facts.

The data lives in one file, ``gpus.csv`` beside this module, seeded from the spec table in
``shared/data/devices/gpu_specs.csv`` (spec-sheet facts only, no measurements). A value written with a
trailing ``?`` there is unconfirmed; it is parsed and its field is listed in ``Device.uncertain``.

Lookup accepts canonical keys (``"H100-SXM"``), their aliases, ``torch.cuda.get_device_name()`` strings
(``"NVIDIA H100 80GB HBM3"``) and their underscore forms (``"NVIDIA_H100_80GB_HBM3"``): names are
compared after dropping case and every non-alphanumeric character.

The module itself is callable: ``fxcost.devices()`` lists the canonical names. (The public API names
a function ``fxcost.devices`` and the layout a package ``fxcost/devices/``; once the package is
imported Python binds ``fxcost.devices`` to it, so the package answers the call.)

Example:
    >>> import fxcost
    >>> fxcost.devices()[:3]
    ['P4', 'P4000', 'P100-PCIE-16GB']
    >>> fxcost.get_device("Tesla T4").name
    'T4'
"""

from __future__ import annotations

import csv
import difflib
import functools
import re
import sys
import types
from dataclasses import dataclass, field
from importlib import resources

__all__ = ["Device", "UnknownDeviceError", "device_names", "get_device"]


class UnknownDeviceError(KeyError, ValueError):
    """Raised for a device name that matches no entry of the database."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class Device:
    """Spec-sheet facts for one GPU. Units are in the names; ``None`` means unknown or not applicable."""

    name: str
    full_name: str
    vendor: str
    architecture: str
    compute_capability: str | None
    num_sms: int | None
    boost_clock_mhz: float | None
    base_clock_mhz: float | None
    memory_gb: float | None
    mem_bandwidth_gbps: float | None
    l2_cache_mb: float | None
    fp32_tflops: float | None
    tf32_tflops: float | None
    fp16_tflops: float | None
    bf16_tflops: float | None
    max_threads_per_sm: int | None
    max_blocks_per_sm: int | None
    regs_per_sm: int | None
    max_regs_per_thread: int | None
    smem_per_sm_kb: float | None
    smem_per_block_optin_kb: float | None
    warp_size: int | None
    nvlink_bandwidth_gbps: float | None
    pcie_gen: int | None
    tdp_w: float | None
    price_usd_per_hr: float | None
    aliases: tuple[str, ...] = ()
    sources: str = ""
    uncertain: frozenset[str] = field(default_factory=frozenset)


# CSV column -> Device field, for the columns whose names differ.
_RENAMED = {
    "name": "full_name",
    "tf32_tensor_tflops_dense": "tf32_tflops",
    "fp16_tensor_tflops_dense": "fp16_tflops",
    "bf16_tensor_tflops_dense": "bf16_tflops",
    "cloud_price_usd_per_hr": "price_usd_per_hr",
}
_TEXT_FIELDS = {"name", "full_name", "vendor", "architecture", "compute_capability", "sources"}
_INT_FIELDS = {
    "num_sms", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "max_regs_per_thread",
    "warp_size", "pcie_gen",
}  # fmt: skip
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _parse_number(text: str) -> tuple[float | None, bool]:
    """Parse a cell like ``"1202?"`` or ``"2.49 (AWS; 2024)"``: (value or None, value is uncertain)."""
    text = text.strip()
    if text in {"", "NA", "?"}:
        return None, text == "?"
    match = _NUMBER.match(text)
    if match is None:
        return None, True
    # A price cell reads "price (provider; date)"; a trailing "?" anywhere marks the value unconfirmed.
    return float(match.group()), "?" in text


def _normalize(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _row_to_device(row: dict[str, str]) -> Device:
    values: dict[str, object] = {}
    uncertain = set()
    for column, text in row.items():
        if column in {"key", "aliases", "memory_type"}:
            continue
        name = _RENAMED.get(column, column)
        if name in _TEXT_FIELDS:
            values[name] = text.strip()
            continue
        number, unsure = _parse_number(text)
        if unsure:
            uncertain.add(name)
        values[name] = int(number) if (number is not None and name in _INT_FIELDS) else number
    if values["compute_capability"] in {"", "NA"}:  # AMD parts have none
        values["compute_capability"] = None
    aliases = tuple(a for a in row["aliases"].split(";") if a)
    return Device(name=row["key"], aliases=aliases, uncertain=frozenset(uncertain), **values)  # type: ignore[arg-type]


@functools.cache
def _database() -> tuple[dict[str, Device], dict[str, str]]:
    """Load the spec table once: (devices by canonical name, normalized alias -> canonical name)."""
    text = resources.files(__package__).joinpath("gpus.csv").read_text(encoding="utf-8")
    devices: dict[str, Device] = {}
    index: dict[str, str] = {}
    for row in csv.DictReader(text.splitlines()):
        device = _row_to_device(row)
        if device.name in devices:
            raise ValueError(f"gpus.csv lists {device.name!r} twice")
        devices[device.name] = device
        for alias in (device.name, device.full_name, *device.aliases):
            key = _normalize(alias)
            owner = index.setdefault(key, device.name)
            if owner != device.name:
                raise ValueError(f"gpus.csv: alias {alias!r} names both {owner} and {device.name}")
    return devices, index


def device_names() -> list[str]:
    """Canonical names of every GPU in the database, in table order."""
    return list(_database()[0])


def get_device(name: str | Device) -> Device:
    """Look up a GPU by canonical name, alias or ``torch.cuda.get_device_name()`` string.

    Raises:
        UnknownDeviceError: no entry matches; the message lists the closest known names.
    """
    if isinstance(name, Device):
        return name
    if not isinstance(name, str):
        raise TypeError(f"device name must be a str, got {type(name).__name__}")
    devices, index = _database()
    canonical = index.get(_normalize(name))
    if canonical is not None:
        return devices[canonical]
    close = difflib.get_close_matches(_normalize(name), list(index), n=5, cutoff=0.5)
    suggestions = list(dict.fromkeys(index[c] for c in close))
    hint = f"; closest: {', '.join(suggestions)}" if suggestions else ""
    raise UnknownDeviceError(
        f"unknown device {name!r}{hint}. Known devices: {', '.join(devices)} "
        "(aliases and torch.cuda.get_device_name() strings are accepted too)"
    )


class _CallableModule(types.ModuleType):
    def __call__(self) -> list[str]:
        """Canonical names of every GPU in the database (``fxcost.devices()``)."""
        return device_names()


sys.modules[__name__].__class__ = _CallableModule
