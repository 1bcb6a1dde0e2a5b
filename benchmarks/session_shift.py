"""How much faster a GPU ran its held-out rows than its training rows of the same shapes.

The held-out rows (``ops_test``) were measured apart from the training rows (``ops``). Where a
held-out configuration has a training configuration of the same GPU and op within a factor of 1.1 in
every dim, the two times per unit of work (the product of the dims: FLOPs for a GEMM, elements for a
row op) are compared, against the nearest such configuration (the median of its repeats); the median
of those ratios and their quartiles, per GPU and op class, are printed. 1.00
means the two measurements agree; 0.80 means the held-out rows ran 20% faster than the training rows
of the same shapes, so that a model reproducing the training rows exactly is 25% slow on them
(``1 / ratio - 1``, printed as ``bias %``): an error no model that reproduces the training rows
removes.

Convolutions are left out: their held-out rows are a hashed share of the training file, one
measurement. Memory-bound elementwise ops are the control: a change of the GPU's clock between the two
sessions (heat, a power cap) would slow compute-bound kernels and leave those at DRAM bandwidth
alone.

    python benchmarks/session_shift.py --data ../shared/data

Last line: ``shift_<class>=..`` per op class (the median over its GPUs, each GPU counted once however
many pairs it has), then ``pairs=N``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from fxcost.gpus import HELD_OUT_DEVICES
from fxcost.train.heads import CONFIG_COLUMNS, split

sys.path.insert(0, str(Path(__file__).parent))
from generalization import NAMES  # a sibling script: the op classes' short names

CLASSES = {head: name for head, name in NAMES.items() if head != "conv"}
TOLERANCE = 1.1  # the largest factor between two configurations' dims for them to count as one
_CHUNK = 512  # held-out rows matched at once (the distance table is chunk x training rows x dims)


def matched_ratios(train: pd.DataFrame, test: pd.DataFrame, dims: list[str]) -> np.ndarray:
    """Per held-out row with a training row of the same op within a factor of :data:`TOLERANCE` in
    every dim, its ms per unit of work over the nearest training rows' (the median of the rows at the
    nearest distance: a configuration's repeats, or configurations as near); rows of one GPU."""
    ratios = []
    for op, held in test.groupby("OPName"):
        seen = train[train["OPName"] == op]
        if seen.empty:
            continue
        known = np.log(seen[dims].to_numpy(dtype=np.float64))
        known_ms_per_unit = seen["Latency"].to_numpy(dtype=np.float64) / np.exp(known.sum(axis=1))
        asked = np.log(held[dims].to_numpy(dtype=np.float64))
        ms_per_unit = held["Latency"].to_numpy(dtype=np.float64) / np.exp(asked.sum(axis=1))
        for start in range(0, len(asked), _CHUNK):
            block = asked[start : start + _CHUNK]
            distance = np.abs(block[:, None, :] - known[None, :, :]).max(axis=2)
            nearest = distance.min(axis=1, keepdims=True)
            tied = np.where(distance == nearest, known_ms_per_unit, np.nan)  # the nearest rows only
            close = nearest[:, 0] < math.log(TOLERANCE)
            own = ms_per_unit[start : start + _CHUNK]
            ratios.append(own[close] / np.nanmedian(tied[close], axis=1))
    return np.concatenate(ratios) if ratios else np.empty(0)


def session_shift(data: str) -> pd.DataFrame:
    """Rows (op class, GPU, matched pairs, the median ratio of held-out to training pace and its
    quartiles); a class without training or held-out files in ``data`` is skipped."""
    rows = []
    for head, name in CLASSES.items():
        try:
            train, test = split([data], head, exclude=HELD_OUT_DEVICES)
        except FileNotFoundError:  # a data directory without this class's files
            continue
        dims = [c for c in CONFIG_COLUMNS[head] if c != "OPName"]
        for gpu in sorted(set(test["device"])):
            ratios = matched_ratios(train[train["device"] == gpu], test[test["device"] == gpu], dims)
            if len(ratios):
                q25, median, q75 = np.quantile(ratios, [0.25, 0.5, 0.75])
                rows.append({"op_class": name, "gpu": gpu, "pairs": len(ratios), "ratio": median, "q25": q25,
                             "q75": q75})  # fmt: skip
    return pd.DataFrame(rows, columns=["op_class", "gpu", "pairs", "ratio", "q25", "q75"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data", help="data directory in the shared layout")
    args = parser.parse_args(argv)
    shifts = session_shift(args.data)
    if shifts.empty:
        print(f"no held-out configuration of {args.data} matches a training one")
        print("pairs=0")
        return 0
    print("held-out rows' time per unit of work over the training rows' of the same shapes, and the")
    print("median error of a model that reproduces the training rows exactly on them")
    print(f"  {'class':8s} {'gpu':16s} {'pairs':>5s} {'median':>6s} {'quartiles':>11s} {'bias %':>6s}")
    for row in shifts.itertuples(index=False):
        quartiles = f"{row.q25:5.2f}-{row.q75:<5.2f}"
        print(f"  {row.op_class:8s} {row.gpu:16s} {row.pairs:5d} {row.ratio:6.2f} {quartiles} "
              f"{(1 / row.ratio - 1) * 100:+6.0f}")  # fmt: skip
    medians = shifts.groupby("op_class", sort=False)["ratio"].median()
    summary = " ".join(f"shift_{c}={m:.2f}" for c, m in medians.items())
    print(f"{summary} pairs={int(shifts['pairs'].sum())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
