"""The rate cuDNN's NCHW/NHWC layout transposes reach on the recorded GPUs, beside the rate the model
streams them at.

A tensor-core convolution of NCHW tensors runs cuDNN's NHWC kernels between transposes of its tensors
(``nchwToNhwcKernel``, ``nhwcToNchwKernel``), which the tensor-core model prices as memory passes at
the GPU's bandwidth (:func:`fxcost.cost_models.heads.tensor_work.tensor_work`). Each recorded
transpose kernel is matched to the tensor it moves by its grid (one block per 32 x 32 tile of a
``[C, H*W]`` image: ``(ceil(H*W / 32), ceil(C / 32), N)``), and its rate read as the bytes it reads
and writes over its time; a grid two of the node's tensors of different sizes share is left out.
Only kernels moving more than ``--min-mb`` count (smaller ones are bound by their launch). A rate
above the DRAM's is a tensor the previous kernel left in L2. Recordings validate; nothing is fit on
them (DESIGN.md).

    python benchmarks/layout_transposes.py [--fixtures benchmarks/fixtures/gpu] [--min-mb 20]

One line per GPU and dtype (kernels, median and range of the recorded TB/s, the model's), and last:
``transpose_tbps_<gpu>_<dtype>=..`` (median recorded) and ``model_tbps_<gpu>=..`` per GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from fxcost.cost_models.heads.tensor_work import CONVOLUTIONS
from fxcost.gpus import get_device
from fxcost.precision import itemsize
from fxcost.records import NodeCost
from fxcost.report import Report

sys.path.insert(0, str(Path(__file__).parent))
from gpu_pairs import slug  # a sibling script: the summary's short GPU names

TRANSPOSES = ("nchwToNhwc", "nhwcToNchw")
TILE = 32


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, default=Path(__file__).parent / "fixtures" / "gpu")
    parser.add_argument("--min-mb", type=float, default=20.0, help="smallest transpose counted (MB moved)")
    args = parser.parse_args(argv)
    rates: dict[tuple[str, str], list[float]] = defaultdict(list)
    model: dict[str, float] = {}
    for meta_path in sorted(args.fixtures.glob("*/*.meta.json")):
        meta = json.loads(meta_path.read_text())
        device = get_device(meta["gpu"])
        model[device.name] = (device.bandwidth_gbps or math.nan) / 1e3
        for node in Report.load(meta_path.parent / meta["trace"]).nodes:
            for moved, ms in transposes(node):
                if moved >= args.min_mb * 1e6:
                    rates[(device.name, node.in_dtypes[0])].append(moved / ms / 1e9)
    if not rates:
        print("no recorded layout transposes under", args.fixtures)
        print("rows=0")
        return 0
    print(f"{'GPU':18s} {'dtype':9s} {'kernels':>7s} {'median TB/s':>11s} {'range':>11s} {'model TB/s':>10s}")
    summary = []
    for (gpu, dtype), found in sorted(rates.items()):
        median = statistics.median(found)
        print(f"{gpu:18s} {dtype:9s} {len(found):7d} {median:11.2f} {min(found):5.2f}-{max(found):<5.2f} "
              f"{model[gpu]:10.2f}")  # fmt: skip
        summary.append(f"transpose_tbps_{slug(gpu)}_{dtype}={median:.2f}")
    summary += [f"model_tbps_{slug(gpu)}={tbps:.2f}" for gpu, tbps in sorted(model.items())]
    print(" ".join(summary))
    return 0


def transposes(node: NodeCost) -> list[tuple[int, float]]:
    """(bytes read and written, ms) of each layout transpose a convolution node's kernels hold whose
    grid matches one of its tensors."""
    if node.op not in CONVOLUTIONS or not node.kernels or len(node.in_shapes) < 2:
        return []
    if node.op == "aten.convolution_backward.default":
        tensors = node.in_shapes[:3]
    else:
        tensors = [node.in_shapes[0], node.in_shapes[1], *node.out_shapes[:1]]
    size = itemsize(node.in_dtypes[0])
    moved: dict[tuple[int, int, int], set[int]] = defaultdict(set)
    for shape in tensors:
        if len(shape) == 4:
            moved[_grid(shape)].add(2 * math.prod(shape) * size)
    found = []
    for kernel in node.kernels:
        sizes = moved.get(kernel.grid, set()) if kernel.grid is not None else set()
        if any(t in kernel.name for t in TRANSPOSES) and len(sizes) == 1 and kernel.duration_ms > 0:
            found.append((next(iter(sizes)), kernel.duration_ms))
    return found


def _grid(shape: tuple[int, ...]) -> tuple[int, int, int]:
    n, c, h, w = shape
    return (math.ceil(h * w / TILE), math.ceil(c / TILE), n)


if __name__ == "__main__":
    sys.exit(main())
