"""Wave scaling accuracy: predict one GPU's latency of a kernel-alike op from another GPU's measurement.

Merges the ``ops_test`` rows of every ``--data`` directory; for each ordered pair of different GPUs
that measured the same configuration, predicts the destination latency from the origin's latency
and kernel metadata (the row's grid and block) with, in the same run:

- ``fxcost``: Equation 1 on the part above the origin's per-op overhead, plus the destination's
  overhead, at least its launch floor (fxcost's default wave scaling);
- ``fxcost_heldout``: the same with the destination's calibration (achieved bandwidth, per-op
  overhead, launch floor) taken from the *other* calibrated GPUs, as for a GPU nobody measured
  (:func:`fxcost.gpus.holdout.uncalibrated_device`: the achieved/spec bandwidth fraction of those of
  its memory controller class, the median overhead and floor), without the destination's;
- ``habitat_eq1`` / ``habitat_eq2``: Habitat's equations alone (achieved bandwidth, occupancy waves);
- ``bw_ratio``: origin time x spec bandwidth ratio; ``flops_ratio``: x peak FP32 ratio (Habitat §2.3).

Also prints wave scaling applied to the kernel-varying linear/bmm rows (to show why those need MLPs)
and, on the training rows (``ops/``, in-sample for the calibration), the error by kernel size, where
launch overhead dominates small kernels.

    python benchmarks/wave_scaling.py --data ../shared/data [--data DIR2 ...] [--out rows.csv]

Last line: ``mape_ew=.. mape_softmax=.. mape_ln=.. mape_kernel_alike=.. mape_flops_ratio=..
mape_bw_ratio=.. mape_linear_bmm=.. pairs=N rows=N``; MAPEs are means over GPU pairs of the per-pair MAPE.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import pandas as pd

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.wave_scaling import WaveScaling
from fxcost.data.datasets import KERNEL_ALIKE, kernel_alike_node, op_class, read_ops, read_ops_test
from fxcost.gpus import get_device
from fxcost.gpus.holdout import uncalibrated_device
from fxcost.lowering import lower
from fxcost.records import KernelRecord, NodeCost

TEST_FILES = ("elem", "vec", "habitat", "ln", "softmax")
METHODS = ("fxcost", "fxcost_heldout", "habitat_eq1", "habitat_eq2", "bw_ratio", "flops_ratio")
MODELS = {"fxcost": WaveScaling(), "habitat_eq1": WaveScaling("eq1", extended=False),
          "habitat_eq2": WaveScaling("eq2", extended=False)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", action="append", default=None, help="data directory (repeatable)")
    parser.add_argument("--out", help="write one row per prediction to this CSV")
    args = parser.parse_args()
    dirs = args.data or ["../shared/data"]
    start = time.perf_counter()

    test = pd.concat([read_ops_test(d, TEST_FILES) for d in dirs], ignore_index=True)
    test = test[test["OPName"].isin(KERNEL_ALIKE)].drop_duplicates(["OPName", "device", "B", "H"])
    pairs = _pairs(test, ["OPName", "B", "H"])
    predicted = _predict_kernel_alike(pairs)
    print(f"kernel-alike ops_test rows: {len(test)}, ordered GPU pairs x configurations: {len(pairs)}\n")
    print("Lowering: fraction of rows whose lowered grid and block equal the measured ones")
    train = pd.concat([read_ops(d, KERNEL_ALIKE) for d in dirs], ignore_index=True)
    matches = pd.DataFrame({"ops_test": _lowering_matches(test), "ops (training)": _lowering_matches(train)})
    print(matches.to_string(float_format=lambda v: f"{v:8.4f}"), "\n")

    print("MAPE (%) by op class, mean over GPU pairs")
    summary = _table(predicted, "cls")
    print(summary.to_string(float_format=lambda v: f"{v:6.1f}"), "\n")
    print("MAPE (%) of fxcost by GPU pair (origin -> destination), per op class")
    errors = predicted[["pair", "cls"]].assign(e=_errors(predicted, "fxcost") * 100)
    by_pair = errors.groupby(["pair", "cls"])["e"].mean().unstack()
    print(by_pair.to_string(float_format=lambda v: f"{v:6.1f}"), "\n")

    varying = _kernel_varying(dirs)
    print("Wave scaling applied to kernel-varying ops (cuBLAS picks other kernels per GPU):")
    print(_table(varying, "cls").to_string(float_format=lambda v: f"{v:6.1f}"), "\n")

    print("By kernel size on the training rows (ops/; the calibration was fit on these rows):")
    print(_by_size(dirs).to_string(float_format=lambda v: f"{v:6.1f}"), "\n")

    if args.out:
        predicted.to_csv(args.out, index=False)
    overall = errors.groupby("pair")["e"].mean().mean()
    print(f"({time.perf_counter() - start:.1f} s)")
    print(
        f"mape_ew={summary.loc['ew', 'fxcost']:.2f} mape_softmax={summary.loc['softmax', 'fxcost']:.2f} "
        f"mape_ln={summary.loc['ln', 'fxcost']:.2f} mape_kernel_alike={overall:.2f} "
        f"heldout_calibration_ew={summary.loc['ew', 'fxcost_heldout']:.2f} "
        f"heldout_calibration_softmax={summary.loc['softmax', 'fxcost_heldout']:.2f} "
        f"heldout_calibration_ln={summary.loc['ln', 'fxcost_heldout']:.2f} "
        f"heldout_calibration_kernel_alike={summary.loc['all', 'fxcost_heldout']:.2f} "
        f"mape_flops_ratio={summary.loc['all', 'flops_ratio']:.2f} "
        f"mape_bw_ratio={summary.loc['all', 'bw_ratio']:.2f} "
        f"mape_linear_bmm={varying.pipe(_table, 'cls').loc['all', 'fxcost']:.2f} "
        f"pairs={predicted['pair'].nunique()} rows={len(predicted)}"
    )
    return 0


def _lowering_matches(rows: pd.DataFrame) -> pd.Series:
    """Per op, the fraction of rows whose lowered (first) kernel has the measured grid and block."""
    columns = ["OPName", "B", "H", "Grid x", "Grid y", "Grid z", "Block x", "Block y", "Block z"]
    configs = rows[columns].value_counts().reset_index(name="rows")
    match = []
    for op, b, h, *measured in configs[columns].itertuples(index=False):
        specs = lower(kernel_alike_node(op, b, h)) or []
        launch = specs[0].launch if specs else None
        match.append(launch is not None and (*launch.grid, *launch.block) == tuple(measured))
    configs["match"] = np.array(match) * configs["rows"]
    grouped = configs.groupby("OPName")[["match", "rows"]].sum()
    return grouped["match"] / grouped["rows"]


def _pairs(rows: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    merged = rows.merge(rows, on=key, suffixes=("_o", "_d"))
    merged = merged[merged["device_o"] != merged["device_d"]].reset_index(drop=True)
    merged["pair"] = merged["device_o"] + " -> " + merged["device_d"]
    merged["cls"] = merged["OPName"].map(op_class)
    return merged


def _node_with_kernel(row: pd.Series, node: NodeCost) -> NodeCost:
    """The node with the origin's measured latency and the dominant kernel's launch from the row."""
    node.origin_ms = float(row["Latency_o"])
    grid = (int(row["Grid x_o"]), int(row["Grid y_o"]), int(row["Grid z_o"]))
    block = (int(row["Block x_o"]), int(row["Block y_o"]), int(row["Block z_o"]))
    node.kernels = [KernelRecord(str(row["Kernel Name_o"]), math.nan, grid, block)]
    return node


def _predict_kernel_alike(pairs: pd.DataFrame) -> pd.DataFrame:
    nodes = {}
    for key in pairs[["OPName", "B", "H"]].drop_duplicates().itertuples(index=False):
        nodes[tuple(key)] = kernel_alike_node(*key)
    out = pairs.copy()
    for method in METHODS:
        out[method] = np.nan
    for (origin, dest), group in pairs.groupby(["device_o", "device_d"]):
        o, d = get_device(origin), get_device(dest)
        batch_nodes = [
            _node_with_kernel(row, _copy(nodes[(row["OPName"], row["B"], row["H"])]))
            for _, row in group.iterrows()
        ]
        batch = NodeBatch.of(batch_nodes, origin=o)
        for name, model in MODELS.items():
            out.loc[group.index, name] = model.predict(batch, d)
        out.loc[group.index, "fxcost_heldout"] = MODELS["fxcost"].predict(batch, uncalibrated_device(d))
        latency = group["Latency_o"].to_numpy()
        out.loc[group.index, "bw_ratio"] = latency * o.mem_bandwidth_gbps / d.mem_bandwidth_gbps
        out.loc[group.index, "flops_ratio"] = latency * o.fp32_tflops / d.fp32_tflops
    return out


def _copy(node: NodeCost) -> NodeCost:
    return NodeCost.from_json(node.to_json())


def _errors(frame: pd.DataFrame, method: str) -> pd.Series:
    """Absolute relative error of ``method`` per row."""
    return (frame[method] - frame["Latency_d"]).abs() / frame["Latency_d"]


def _table(frame: pd.DataFrame, by: str) -> pd.DataFrame:
    """MAPE (%) per ``by`` group and method: the mean over GPU pairs of each pair's MAPE."""
    result = {}
    for method in (m for m in METHODS if m in frame.columns):
        errors = frame[[by, "pair"]].assign(e=_errors(frame, method))
        column = (
            errors.groupby([by, "pair"], observed=True)["e"].mean().groupby(level=0, observed=True).mean()
        )
        column = column * 100
        column["all"] = errors.groupby("pair")["e"].mean().mean() * 100
        result[method] = column
    return pd.DataFrame(result)


def _kernel_varying(dirs: list[str]) -> pd.DataFrame:
    """Linear and bmm rows scaled as if kernel-alike: the origin's kernel launch, Eq. 1."""
    rows = pd.concat([read_ops_test(d, ("linear", "bmm")) for d in dirs], ignore_index=True)
    pairs = _pairs(rows, ["OPName", "B", "M", "N", "K"])
    out = pairs.copy()
    model = WaveScaling()
    for method in METHODS:
        out[method] = np.nan
    for (origin, dest), group in pairs.groupby(["device_o", "device_d"]):
        o, d = get_device(origin), get_device(dest)
        nodes = []
        for _, row in group.iterrows():
            b, m, n, k = (int(row[c]) for c in ("B", "M", "N", "K"))
            # [M, N] x [N, K], N reduced (datasets.GEMM_COLUMNS): fp32 operands read, result written
            traffic = 4 * b * (m * n + n * k), 4 * b * m * k
            node = NodeCost(name="gemm", op="aten.gemm_as_kernel_alike", phase="fw", flops=2 * b * m * n * k,
                            bytes_read=traffic[0], bytes_written=traffic[1])  # fmt: skip
            nodes.append(_node_with_kernel(row, node))
        out.loc[group.index, "fxcost"] = model.predict(NodeBatch.of(nodes, origin=o), d)
        latency = group["Latency_o"].to_numpy()
        out.loc[group.index, "bw_ratio"] = latency * o.mem_bandwidth_gbps / d.mem_bandwidth_gbps
        out.loc[group.index, "flops_ratio"] = latency * o.fp32_tflops / d.fp32_tflops
    return out[["pair", "cls", "Latency_d", "fxcost", "bw_ratio", "flops_ratio"]]


def _by_size(dirs: list[str]) -> pd.DataFrame:
    rows = pd.concat([read_ops(d, KERNEL_ALIKE) for d in dirs], ignore_index=True)
    rows = rows.drop_duplicates(["OPName", "device", "B", "H"])
    sample = rows[["OPName", "B", "H"]].drop_duplicates().sample(n=600, random_state=0)
    pairs = _pairs(rows.merge(sample), ["OPName", "B", "H"])
    predicted = _predict_kernel_alike(pairs)
    predicted["size"] = pd.cut(predicted["B"] * predicted["H"], [0, 2**12, 2**16, 2**20, 2**24, 2**30],
                               labels=["<4K", "4K-64K", "64K-1M", "1M-16M", ">16M"])  # fmt: skip
    return _table(predicted, "size")


if __name__ == "__main__":
    sys.exit(main())
