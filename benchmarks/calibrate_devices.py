"""Calibrate the device database from measured elementwise kernels: achieved bandwidth and overheads.

For each GPU in ``<data>/ops/{add,mul,...}/<Device>.csv`` (the training rows, never ops_test), fits

    latency = kernel_overhead + bytes / achieved_bandwidth        (rows with >= 2^20 elements)

by least squares on relative error, and takes the launch floor as the median latency of the tiny
kernels (< 4096 elements). Held-out GPUs (H100, L4, A100-80GB) are refused: nothing measured on them
is fit into what fxcost ships (DESIGN.md).

It then fits the L2 ramp of wave scaling (``fxcost.cost_models.wave_scaling.L2_RAMP``): the working
set, in units of L2, where the row re-reads of softmax and layer norm start and stop missing L2, by
grid search on cross-GPU pairs of the training rows with many waves (B >= 8192, >= 2^22 elements).

    python benchmarks/calibrate_devices.py --data ../shared/data [--write]

With ``--write`` the values go into fxcost/gpus/gpus.csv with their source.
Last line: ``calibrated=N bandwidth_fraction_mean=.. bandwidth_fraction_hbm=..
bandwidth_fraction_hbm_pascal=.. bandwidth_fraction_gddr=..``
(the fallbacks of :mod:`fxcost.gpus.fallbacks`, which are these means over the table's whole GB/s, and
may differ in the third decimal from the unrounded fits printed here)
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from fxcost.data.datasets import ELEMENTWISE, read_ops
from fxcost.gpus import HELD_OUT_DEVICES, get_device
from fxcost.gpus.fallbacks import BANDWIDTH_FRACTIONS, memory_family

LARGE, TINY = 2**20, 4096
TABLE = Path(__file__).resolve().parents[1] / "fxcost" / "gpus" / "gpus.csv"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--write", action="store_true", help=f"update {TABLE.name}")
    args = parser.parse_args()

    rows = read_ops(args.data, ELEMENTWISE)
    fits = {}
    columns = ("rows", "BW GB/s", "spec", "frac", "overhead ms", "floor ms")
    print(f"{'device':18s} " + " ".join(f"{c:>11s}" for c in columns))

    for device, group in rows.groupby("device"):
        if device in HELD_OUT_DEVICES:
            print(f"{device}: held out, not calibrated")
            continue
        large = group[group["numel"] >= LARGE]
        weight = 1.0 / large["Latency"].to_numpy()
        design = np.c_[np.ones(len(large)), large["bytes"].to_numpy() / 1e6] * weight[:, None]
        intercept, ms_per_mb = np.linalg.lstsq(design, large["Latency"].to_numpy() * weight, rcond=None)[0]
        floor = float(group.loc[group["numel"] < TINY, "Latency"].median())
        bandwidth = 1.0 / ms_per_mb
        spec = get_device(device).mem_bandwidth_gbps
        fits[device] = (bandwidth, float(intercept), floor, len(large))
        values = (f"{len(large)}", f"{bandwidth:.0f}", f"{spec:.0f}", f"{bandwidth / spec:.2f}",
                  f"{intercept:.4f}", f"{floor:.4f}")  # fmt: skip
        print(f"{device:18s} " + " ".join(f"{v:>11s}" for v in values))
    if args.write:
        _write(fits, args.data)
    print(f"L2 ramp fit on training rows: {_fit_l2_ramp(args.data)} (wave_scaling.L2_RAMP)")
    fractions = {d: fits[d][0] / get_device(d).mem_bandwidth_gbps for d in fits}
    family_of = {d: memory_family(get_device(d).memory_type, get_device(d).compute_capability) for d in fits}
    by_family = {  # fxcost.gpus.BANDWIDTH_FRACTIONS: a GPU nobody calibrated takes its class's
        family: np.mean([f for d, f in fractions.items() if family_of[d] == family])
        for family in BANDWIDTH_FRACTIONS
    }
    keys = {family: "bandwidth_fraction_" + family.lower().replace("-", "_") for family in by_family}
    print(f"calibrated={len(fits)} bandwidth_fraction_mean={np.mean(list(fractions.values())):.3f} "
          + " ".join(f"{keys[family]}={f:.3f}" for family, f in by_family.items()) + " "
          f"overhead_median_ms={np.median([f[1] for f in fits.values()]):.4f} "
          f"floor_median_ms={np.median([f[2] for f in fits.values()]):.4f}")  # fmt: skip
    return 0


def _fit_l2_ramp(data: str) -> tuple[float, float]:
    from fxcost.cost_models import NodeBatch
    from fxcost.cost_models import wave_scaling as ws
    from fxcost.data.datasets import kernel_alike_node

    rows = read_ops(data, ["ln", "softmax"]).query("B >= 8192 and numel >= 2**22")
    rows = rows[~rows["device"].isin(HELD_OUT_DEVICES)]
    pairs = rows.merge(rows, on=["OPName", "B", "H"], suffixes=("_o", "_d"))
    pairs = pairs[pairs["device_o"] != pairs["device_d"]]
    batches = []
    for (origin, dest), group in pairs.groupby(["device_o", "device_d"]):
        nodes = []
        for op, b, h, latency in group[["OPName", "B", "H", "Latency_o"]].itertuples(index=False):
            node = kernel_alike_node(op, b, h)
            node.origin_ms = latency
            nodes.append(node)
        batch = NodeBatch.of(nodes, get_device(origin))
        batches.append((batch, get_device(dest), group["Latency_d"].to_numpy()))
    model, saved, best = ws.WaveScaling(), ws.L2_RAMP, (np.inf, ws.L2_RAMP)
    try:
        for low in np.arange(0.0, 1.01, 0.1):
            for high in np.arange(low + 0.2, 5.01, 0.25):
                ws.L2_RAMP = (float(low), float(high))
                errors = [np.mean(np.abs(model.predict(b, d) / y - 1)) for b, d, y in batches]
                best = min(best, (float(np.mean(errors)), ws.L2_RAMP))
    finally:
        ws.L2_RAMP = saved
    return round(best[1][0], 2), round(best[1][1], 2)


def _write(fits: dict[str, tuple[float, float, float, int]], data: str) -> None:
    with TABLE.open(newline="") as f:
        table = list(csv.DictReader(f))
    for row in table:
        if row["key"] in fits:
            bandwidth, overhead, floor, n = fits[row["key"]]
            row["achieved_bandwidth_gbps"] = f"{bandwidth:.0f}"
            row["kernel_overhead_ms"] = f"{overhead:.4f}"
            row["launch_floor_ms"] = f"{floor:.4f}"
            row["calibration_source"] = (
                f"fit on neusight/ops elementwise training rows ({n} rows >= 2^20 elements; floor: "
                f"median of rows < {TINY} elements) by benchmarks/calibrate_devices.py"
            )
    with TABLE.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)
    print(f"wrote {len(fits)} calibrations to {TABLE}")


if __name__ == "__main__":
    sys.exit(main())
