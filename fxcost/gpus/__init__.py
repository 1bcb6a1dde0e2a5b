"""GPUs: the spec database (canonical names, aliases, spec-sheet facts), which GPUs are held out, and
CUDA occupancy (``occupancy``).

The data lives in one file, ``gpus.csv`` beside this module, seeded from the spec table in
``shared/data/devices/gpu_specs.csv`` (spec-sheet facts only, no measurements). A value written with a
trailing ``?`` there is unconfirmed; it is parsed and its field is listed in ``Device.uncertain``.

Lookup accepts canonical keys (``"H100-SXM"``), their aliases, ``torch.cuda.get_device_name()`` strings
(``"NVIDIA H100 80GB HBM3"``) and their underscore forms (``"NVIDIA_H100_80GB_HBM3"``): names are
compared after dropping case and every non-alphanumeric character.

``fxcost.devices()`` is :func:`device_names`.

Example:
    >>> device_names()[:3]
    ['P4', 'P4000', 'P100-PCIE-16GB']
    >>> get_device("Tesla T4").name
    'T4'
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import functools
import json
import os
import re
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from fxcost.gpus.fallbacks import (
    DEFAULT_FLOOR_MS,
    DEFAULT_OVERHEAD_MS,
    FALLBACK_SOURCES,
    bandwidth_fraction,
    bandwidth_source,
)

__all__ = [
    "DEFAULT_DEVICES",
    "HELD_OUT_DEVICES",
    "Device",
    "DeviceFileError",
    "UnknownDeviceError",
    "all_devices",
    "device_names",
    "get_device",
    "load_devices",
    "shipped_devices",
]

DEFAULT_DEVICES: tuple[str, ...] = ("H100-SXM", "A100-SXM4-80GB", "L4")
"""The GPUs predicted when none are named."""

HELD_OUT_DEVICES = frozenset({"H100-SXM", "H100-PCIE", "L4", "A100-PCIE-80GB", "A100-SXM4-80GB"})
"""GPUs nothing shipped is fit on (DESIGN.md), so accuracy on unseen GPUs stays measurable."""

_lock = threading.Lock()


class UnknownDeviceError(KeyError, ValueError):
    """Raised for a device name that matches no entry of the database."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class Device:
    """Facts about one GPU. Units are in the names; ``None`` means unknown or not applicable.

    Spec-sheet values come from ``gpus.csv``; the calibration columns (achieved bandwidth, kernel
    overhead, launch floor) are measured where ``calibration_source`` says so, and otherwise the
    properties below fall back to documented defaults. ``source_of(field)`` says where a value came from.
    """

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
    max_threads_per_block: int | None
    reg_alloc_unit: int | None  # registers are allocated per warp in these units
    smem_alloc_unit_bytes: int | None  # shared memory is allocated per block in these units
    smem_reserved_per_block_bytes: int | None  # reserved by the driver per block (from CC 8.0)
    nvlink_bandwidth_gbps: float | None
    pcie_gen: int | None
    tdp_w: float | None
    price_usd_per_hr: float | None
    achieved_bandwidth_gbps: float | None = None
    kernel_overhead_ms: float | None = None
    launch_floor_ms: float | None = None
    # Tensor-core throughput `fxcost calibrate` measured with Triton's tl.dot (TFLOP/s, fp32 accumulation):
    # the sustained rate of half-precision GEMMs on a calibrated GPU (cost_models.heads.tensor_core).
    dot_bf16_tflops: float | None = None
    dot_fp16_tflops: float | None = None
    # GPUs one NVLink (or Infinity Fabric) domain joins when bridges rather than a switch connect them:
    # 2 for bridged pairs of PCIe cards, None where every GPU of a node has a switched port.
    nvlink_domain: int | None = None
    tensor_clock_mhz: float | None = None  # a large tensor-core GEMM's at the TDP (gpus.power), where stated
    calibration_source: str = ""
    memory_type: str = ""  # HBM2e, GDDR6X...: with the compute capability, a GPU never calibrated's share
    aliases: tuple[str, ...] = ()
    sources: str = ""
    uncertain: frozenset[str] = field(default_factory=frozenset)

    def __hash__(self) -> int:  # equal devices share a name; Device-keyed caches hash it on every price
        return hash(self.name)

    # -- calibration, with documented fallbacks -------------------------------------------------------

    @property
    def bandwidth_gbps(self) -> float | None:
        """Achieved DRAM bandwidth: calibrated where measured, else the spec times the share the
        calibrated GPUs of its memory controller class achieve (:func:`bandwidth_fraction`)."""
        if self.achieved_bandwidth_gbps is not None:
            return self.achieved_bandwidth_gbps
        if self.mem_bandwidth_gbps is None:
            return None
        return self.mem_bandwidth_gbps * bandwidth_fraction(self.memory_type, self.compute_capability)

    @property
    def l2_bytes(self) -> float | None:
        """The L2 cache in bytes (its megabytes are binary, as the GPU reports them), None if unknown."""
        return self.l2_cache_mb * 2**20 if self.l2_cache_mb else None

    @property
    def overhead_ms(self) -> float:
        """Fixed time per kernel on top of its work (launch and host dispatch, as CUDA events see it)."""
        return self.kernel_overhead_ms if self.kernel_overhead_ms is not None else DEFAULT_OVERHEAD_MS

    @property
    def floor_ms(self) -> float:
        """The shortest time any kernel takes, as CUDA events around one PyTorch op see it."""
        return self.launch_floor_ms if self.launch_floor_ms is not None else DEFAULT_FLOOR_MS

    def source_of(self, name: str) -> str:
        """Where the value of field or property ``name`` comes from."""
        if name in {"achieved_bandwidth_gbps", "kernel_overhead_ms", "launch_floor_ms", "bandwidth_gbps",
                    "overhead_ms", "floor_ms", "dot_bf16_tflops", "dot_fp16_tflops"}:  # fmt: skip
            stored = {"bandwidth_gbps": "achieved_bandwidth_gbps", "overhead_ms": "kernel_overhead_ms",
                      "floor_ms": "launch_floor_ms"}.get(name, name)  # fmt: skip
            if getattr(self, stored) is not None:
                return self.calibration_source
            if stored == "achieved_bandwidth_gbps":
                return bandwidth_source(self.memory_type, self.compute_capability)
            return FALLBACK_SOURCES[stored]
        if name in _OCCUPANCY_FIELDS:
            return f"CUDA occupancy calculator, compute capability {self.compute_capability}"
        if name not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"Device has no field {name!r}")
        return self.sources + (" (unconfirmed)" if name in self.uncertain else "")


# CSV column -> Device field, for the columns whose names differ.
_RENAMED = {
    "name": "full_name",
    "tf32_tensor_tflops_dense": "tf32_tflops",
    "fp16_tensor_tflops_dense": "fp16_tflops",
    "bf16_tensor_tflops_dense": "bf16_tflops",
    "cloud_price_usd_per_hr": "price_usd_per_hr",
}
_TEXT_FIELDS = {"name", "full_name", "vendor", "architecture", "compute_capability", "sources",
                "calibration_source", "memory_type"}  # fmt: skip
_OCCUPANCY_FIELDS = {
    "max_threads_per_block", "reg_alloc_unit", "smem_alloc_unit_bytes", "smem_reserved_per_block_bytes",
}  # fmt: skip
_INT_FIELDS = _OCCUPANCY_FIELDS | {
    "num_sms", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "max_regs_per_thread",
    "warp_size", "pcie_gen", "nvlink_domain",
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
        if column in {"key", "aliases"}:
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
def shipped_devices() -> tuple[Device, ...]:
    """The GPUs of ``gpus.csv`` as fxcost ships them, before any device file is applied."""
    text = resources.files(__package__).joinpath("gpus.csv").read_text(encoding="utf-8")
    return tuple(_row_to_device(row) for row in csv.DictReader(text.splitlines()))


@functools.cache
def _database() -> tuple[dict[str, Device], dict[str, str]]:
    """The device table, loaded once: (devices by canonical name, normalized alias -> canonical name).

    Files named in the ``FXCOST_DEVICES`` environment variable (separated by ``os.pathsep``) are
    applied on top, as by :func:`load_devices`.
    """
    devices: dict[str, Device] = {}
    index: dict[str, str] = {}
    for device in shipped_devices():
        if device.name in devices:
            raise ValueError(f"gpus.csv lists {device.name!r} twice")
        _add(devices, index, device)
    for path in filter(None, os.environ.get("FXCOST_DEVICES", "").split(os.pathsep)):
        _apply_file(devices, index, Path(path))
    return devices, index


def _add(devices: dict[str, Device], index: dict[str, str], device: Device) -> None:
    devices[device.name] = device
    for alias in (device.name, device.full_name, *device.aliases):
        key = _normalize(alias)
        owner = index.setdefault(key, device.name)
        if owner != device.name:
            raise ValueError(f"device alias {alias!r} names both {owner} and {device.name}")


_EDITABLE = {f.name for f in dataclasses.fields(Device)} - {
    "name",
    "uncertain",
    "sources",
    "calibration_source",
}
_CALIBRATION = {
    "achieved_bandwidth_gbps", "kernel_overhead_ms", "launch_floor_ms", "dot_bf16_tflops", "dot_fp16_tflops",
}  # fmt: skip


def load_devices(path: str | os.PathLike[str]) -> list[str]:
    """Add GPUs, or override values of known ones, from a YAML or JSON file.

    The file maps device names to fields (the names of :class:`Device`'s fields, e.g. ``num_sms``,
    ``mem_bandwidth_gbps``, ``achieved_bandwidth_gbps``). A known name or alias overrides the given
    fields; a new name starts from ``base:`` (a known device) and overrides from there. Every value
    overridden records the file as its source. Returns the canonical names added or changed.

    Example file::

        H100-SXM:
          achieved_bandwidth_gbps: 3010      # measured with `fxcost calibrate`
        MyCloud-H100:
          base: H100-SXM
          aliases: [NVIDIA H100 80GB HBM3 (MyCloud)]
          price_usd_per_hr: 2.10

    Raises:
        DeviceFileError: the file cannot be read, or names an unknown field, base or value type.
    """
    devices, index = _database()
    with _lock:
        return _apply_file(devices, index, Path(path))


class DeviceFileError(ValueError):
    """A device file that cannot be applied; the message names the file, device and field."""


def _apply_file(devices: dict[str, Device], index: dict[str, str], path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix in {".yaml", ".yml"}:
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (OSError, ValueError) as e:
        raise DeviceFileError(f"{path}: cannot read device file ({e})") from e
    except Exception as e:  # yaml.YAMLError does not derive from ValueError
        raise DeviceFileError(f"{path}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise DeviceFileError(f"{path}: expected a mapping of device names, not {type(data).__name__}")
    changed = []
    for name, fields in data.items():
        if not isinstance(fields, dict):
            raise DeviceFileError(f"{path}: {name}: fields must be a mapping, not {type(fields).__name__}")
        fields = dict(fields)
        known = index.get(_normalize(str(name)))
        base_name = fields.pop("base", None)
        if known is not None:
            base = devices[known]
        elif base_name is not None:
            base_key = index.get(_normalize(str(base_name)))
            if base_key is None:
                raise DeviceFileError(f"{path}: {name}: unknown base device {base_name!r}")
            base = dataclasses.replace(devices[base_key], name=str(name), full_name=str(name), aliases=())
        else:
            raise DeviceFileError(
                f"{path}: {name}: not a known device; give 'base: <known device>' to start from one"
            )
        device = _override(base, fields, f"{path}: {name}")
        _add(devices, index, device)
        changed.append(device.name)
    return changed


def _override(base: Device, fields: dict[str, object], where: str) -> Device:
    unknown = set(fields) - _EDITABLE
    if unknown:
        raise DeviceFileError(f"{where}: unknown fields {sorted(unknown)}; accepted: {sorted(_EDITABLE)}")
    values: dict[str, object] = {}
    for key, value in fields.items():
        if key == "aliases":
            if not (isinstance(value, list) and all(isinstance(a, str) for a in value)):
                raise DeviceFileError(f"{where}: aliases must be a list of strings")
            values[key] = base.aliases + tuple(value)
        elif key in _TEXT_FIELDS:
            values[key] = str(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise DeviceFileError(f"{where}: {key} must be a non-negative number, got {value!r}")
        else:
            values[key] = int(value) if key in _INT_FIELDS else float(value)
    spec = sorted(set(values) - _CALIBRATION - {"aliases"})
    if spec:
        values["sources"] = f"{base.sources}; {', '.join(spec)} from {where}"
        values["uncertain"] = base.uncertain - set(spec)
    if set(values) & _CALIBRATION:
        values["calibration_source"] = where
    return dataclasses.replace(base, **values)  # type: ignore[arg-type]


def device_names() -> list[str]:
    """Canonical names of every GPU in the database, in table order."""
    return list(_database()[0])


def all_devices() -> list[Device]:
    """Every GPU in the database, in table order."""
    return list(_database()[0].values())


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
