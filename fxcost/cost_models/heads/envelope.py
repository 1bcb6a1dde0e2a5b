"""Tables of the heads' times per GPU, never above those of a GPU it beats on every strength spec.

The heads read each class of node on a grid of sizes (:mod:`~fxcost.cost_models.heads.elementwise`,
:mod:`~fxcost.cost_models.heads.axis`). A network fit on five GPUs can still predict a stronger GPU
slower than a weaker one somewhere on that grid; :class:`Envelope` takes, for a GPU, the smallest of
its own table and those of every database GPU it matches or beats on each spec that sets speed
(:func:`fxcost.gpus.order.weaker_than`). If a GPU beats another, its set of weaker GPUs holds that
one and all of that one's, so its table is never above the other's: a stronger GPU is never
predicted slower, by construction. A table that never falls with size keeps that property, since
the minimum of non-decreasing tables is non-decreasing.

A class is first read on the GPU asked for and the GPUs it beats. When a second GPU asks for it, it
is read on every GPU of the database at once, in one network call over a few dozen GPUs' grids
(under a second for GPT-2's classes on a 2-core machine), and every GPU priced after that finds its
tables built. A new batch size adds a few classes on the GPU it is priced on (a weight gradient's
GEMM, whose batch-like dimension is its inner one, is a new class at every batch).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np

from fxcost.cost_models.heads.features import device_features
from fxcost.gpus import Device, all_devices
from fxcost.gpus.order import comparable, same_gpus, weaker_than

__all__ = ["Envelope", "Reader"]

K = TypeVar("K", bound=Hashable)

Reader = Callable[[Sequence[K], Sequence[Device]], dict[tuple[Device, K], np.ndarray]]
"""Reads the log-ms tables of classes (keys) on GPUs: one array per (GPU, key), on a grid of sizes
that depends on the key alone."""


class Envelope(Generic[K]):
    """The enveloped tables of one heads model, per GPU at most ``max_tables`` of each kind, least
    recently used dropped first; thread-safe."""

    def __init__(self, max_tables: int) -> None:
        self.max_tables = max_tables
        self._raw: dict[Device, OrderedDict[K, np.ndarray]] = {}
        self._tables: dict[Device, OrderedDict[K, np.ndarray]] = {}
        self._database: list[Device] = []  # the database the tables were enveloped over (same_gpus)
        self._weaker: dict[Device, list[Device]] = {}  # readable GPUs each one beats, in it
        self._everyone: list[Device] = []  # every readable GPU of it
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._tables.values())

    def tables(self, keys: Sequence[K], device: Device, read: Reader[K]) -> dict[K, np.ndarray]:
        """The tables of ``keys`` on ``device``: each the smallest, size by size, of the device's own
        and those of the GPUs it beats."""
        database = all_devices()
        with self._lock:
            if not same_gpus(database, self._database):  # GPUs added or changed (load_devices): again
                self._tables.clear()
                self._weaker.clear()
                self._everyone = [d for d in comparable() if _readable(d)]
                self._database = database
            mine = self._tables.setdefault(device, OrderedDict())
            found = {k: mine[k] for k in keys if k in mine}
            weaker = self._weaker.get(device)
            everyone = self._everyone
        missing = [k for k in keys if k not in found]
        if missing:
            if weaker is None:
                weaker = [d for d in weaker_than(device) if _readable(d)]
                with self._lock:
                    self._weaker[device] = weaker
            devices = [device, *weaker]
            # Classes a second GPU asks for are read on every GPU of the database at once: a strong
            # GPU needs most of them, and the GPUs priced after it find them read.
            with self._lock:
                again = any(k in cache for cache in self._raw.values() for k in missing)
            raw = self._read(missing, list(dict.fromkeys([*devices, *everyone])) if again else devices, read)
            built = {k: np.fmin.reduce([raw[d][k] for d in devices]) for k in missing}
            found.update(built)
            with self._lock:
                _store(mine, built, self.max_tables)
            if again:
                # Every GPU's raw tables are at hand: envelope them for every GPU now (tens of ms),
                # and a GPU priced later finds its tables (looking them up among its weaker GPUs'
                # raw tables at each new GPU took 1.5 of GPT-2's 2.3 ms per new GPU).
                for other in everyone:
                    if other is not device:
                        self._envelope(other, missing, raw)
        with self._lock:
            for k in found:
                if k in mine:
                    mine.move_to_end(k)
        return found

    def _envelope(self, device: Device, keys: Sequence[K], raw: dict[Device, dict[K, np.ndarray]]) -> None:
        """Store ``device``'s tables of ``keys`` it has not got, from ``raw`` (which holds its own and
        those of every GPU it beats)."""
        with self._lock:
            weaker = self._weaker.get(device)
        if weaker is None:
            weaker = [d for d in weaker_than(device) if _readable(d)]
            with self._lock:
                self._weaker[device] = weaker
        with self._lock:
            mine = self._tables.setdefault(device, OrderedDict())
            todo = [k for k in keys if k not in mine]
        built = {k: np.fmin.reduce([raw[d][k] for d in (device, *weaker)]) for k in todo}
        with self._lock:
            _store(mine, built, self.max_tables)

    def _read(
        self, keys: Sequence[K], devices: Sequence[Device], read: Reader[K]
    ) -> dict[Device, dict[K, np.ndarray]]:
        """The raw tables of ``keys`` on ``devices``, those not read yet read in one call."""
        with self._lock:
            caches = [self._raw.setdefault(d, OrderedDict()) for d in devices]
            raw = {
                d: {k: cache[k] for k in keys if k in cache} for d, cache in zip(devices, caches, strict=True)
            }
        todo = [d for d in devices if len(raw[d]) < len(keys)]
        if todo:
            wanted = [k for k in keys if any(k not in raw[d] for d in todo)]
            fresh = read(wanted, todo)
            with self._lock:
                for (d, k), table in fresh.items():
                    raw[d][k] = table
                for d in todo:
                    _store(self._raw[d], {k: t for (e, k), t in fresh.items() if e is d}, self.max_tables)
        return raw


def _readable(device: Device) -> bool:
    """Whether the heads can read ``device`` (it has every spec value they need)."""
    try:
        device_features(device)
    except ValueError:
        return False
    return True


def _store(cache: OrderedDict[K, np.ndarray], items: dict[K, np.ndarray], limit: int) -> None:
    for key, table in items.items():
        cache[key] = table
        cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)
