"""``fxcost.sim.pricing``: a step's plan pricing, kept on its node batch per device."""

from __future__ import annotations

import dataclasses

import numpy as np

from fxcost import zoo
from fxcost.estimator import default_estimator
from fxcost.gpus import get_device
from fxcost.sim import pricing
from fxcost.sim.shard import shard_node


def test_the_kept_pricing_is_the_devices_whatever_its_name() -> None:
    model, inputs = zoo.build("gpt2", 4, seq=32, dim=64, heads=4, layers=2, vocab=256)
    captured = default_estimator().capture(model, inputs, batch_size=4)
    batch, counts = captured.node_batch(), captured.counts.sum(axis=1)
    h100 = get_device("H100-SXM")
    slow = dataclasses.replace(h100, mem_bandwidth_gbps=h100.mem_bandwidth_gbps / 10)  # same name
    fast_ms, slow_ms = (sum(pricing.priced(batch, captured.chain, d, counts)[2]) for d in (h100, slow))
    assert slow_ms > 1.5 * fast_ms
    again = pricing.priced(batch, captured.chain, h100, counts)
    assert again is pricing.priced(batch, captured.chain, h100, counts)  # kept, not priced again
    assert sum(again[2]) == fast_ms

    def split(n: object) -> object:
        return shard_node(n, 2, 64, 4 * 32)  # type: ignore[arg-type]

    found, ms = pricing.shards(batch, "layer", split, 2, captured.chain, h100)
    assert found and set(ms) == set(found) and all(np.isfinite(list(ms.values())))
    _, slow_shards = pricing.shards(batch, "layer", split, 2, captured.chain, slow)
    assert sum(slow_shards.values()) > sum(ms.values())
    assert pricing.shards(batch, "layer", split, 1, captured.chain, h100) == ({}, {})  # tp=1 splits nothing
