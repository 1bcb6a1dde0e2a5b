"""How often the origin-free heads predict a larger problem faster than a smaller one of the same op.

A search loop that prices candidates with fxcost (``examples/automl_optuna.py``) would exploit such
dips, e.g. by picking the batch size whose prediction dips. For random problems of each op class
and every GPU in the database with the spec values the heads need, the problem is doubled along
its batch-like dimension (GEMM rows, batched GEMM batch, convolution and batch norm batch,
elementwise and normalization rows; for a memory pass, its bytes), and a GEMM along each of its
other dims too (``linear_n``, ``linear_k``, ``bmm_m``, ``bmm_k``, in fp32 and bf16: a weight
gradient carries the batch in K), and both are predicted with the heads. Printed per class: the
pairs where the larger problem is predicted faster, and the worst ratio of the larger problem's
time to the smaller's.

    python benchmarks/monotonicity.py [--pairs 300] [--seed 0] [--heads DIR]

GEMMs are monotone in every dim by construction (tiles and waves are ceilings of the dims, the
fastest of fixed candidates: ``fxcost/cost_models/heads/tiling.py``); every other head is read as a
non-decreasing curve over its batch-like dimension: the elementwise head, and with it every
memory-bound op priced as elementwise passes, through isotonic size tables per class of bytes per
element; broadcasting elementwise ops (whose bytes per element change as they grow: ``bias_add``,
``outer_add``), convolutions, layer norm and softmax through the running maximum along their
batch-like axis (``fxcost/cost_models/heads/axis.py``). No dips by construction; this benchmark
checks it.

Last line: ``<class>_violation_pct=..`` per class, then ``pairs=N``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.heads import Heads
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import device_names, get_device
from fxcost.lowering.nodes import batch_norm_node, conv_node, gemm_node, memory_pass
from fxcost.records import NodeCost

Pair = Callable[[np.random.Generator], tuple[NodeCost, NodeCost]]


def _dim(rng: np.random.Generator, high: int = 4096) -> int:
    return int(rng.integers(1, high))


def _alike(op: str) -> Pair:
    def pair(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
        rows, width = _dim(rng), _dim(rng)
        return kernel_alike_node(op, rows, width), kernel_alike_node(op, 2 * rows, width)

    return pair


def _linear(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
    m, n, k = _dim(rng), _dim(rng), _dim(rng)
    return gemm_node("linear", 1, m, n, k), gemm_node("linear", 1, 2 * m, n, k)


def _bmm(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
    b, m, n, k = _dim(rng, 32), _dim(rng, 1024), _dim(rng, 1024), _dim(rng, 1024)
    return gemm_node("bmm", b, m, n, k), gemm_node("bmm", 2 * b, m, n, k)


def _gemm_along(axis: int, op: str = "linear") -> Pair:
    """A GEMM doubled along ``axis`` of (batch, M, N, K): N a layer's width, K its reduction (a weight
    gradient's K is the batch), in every precision a step runs it."""

    def pair(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
        dims = [_dim(rng, 32) if op == "bmm" else 1, _dim(rng), _dim(rng), _dim(rng)]
        grown = [2 * d if i == axis else d for i, d in enumerate(dims)]
        dtype = str(rng.choice(["float32", "bfloat16"]))
        return gemm_node(op, *dims, dtype=dtype), gemm_node(op, *grown, dtype=dtype)  # type: ignore[misc]

    return pair


def _conv(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
    b, c, o, size = _dim(rng, 32), _dim(rng, 256), _dim(rng, 256), int(rng.integers(4, 64))
    return conv_node(b, c, o, 3, size, 1, 1), conv_node(2 * b, c, o, 3, size, 1, 1)


def _broadcast(a: tuple[int, int], b: tuple[int, int]) -> NodeCost:
    """``x + y`` of fp32 tensors of shapes ``a`` and ``b`` broadcast together."""
    out = (max(a[0], b[0]), max(a[1], b[1]))
    return NodeCost(name="add", op="aten.add.Tensor", phase="fw", in_shapes=[a, b],
                    in_dtypes=["float32"] * 2, out_shapes=[out], out_dtypes=["float32"],
                    flops=out[0] * out[1], bytes_read=4 * (a[0] * a[1] + b[0] * b[1]),
                    bytes_written=4 * out[0] * out[1])  # fmt: skip


def _bias_add(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
    rows, width = _dim(rng), _dim(rng)
    return _broadcast((rows, width), (1, width)), _broadcast((2 * rows, width), (1, width))


def _outer_add(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
    rows, width = _dim(rng), _dim(rng)
    return _broadcast((rows, 1), (1, width)), _broadcast((2 * rows, 1), (1, width))


def _memory_pass(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
    elements = int(2 ** rng.uniform(0, 26))
    return memory_pass(8 * elements, "float32"), memory_pass(16 * elements, "float32")


def _batch_norm(rng: np.random.Generator) -> tuple[NodeCost, NodeCost]:
    b, c, size, backward = _dim(rng, 64), _dim(rng, 1024), _dim(rng, 64), bool(rng.integers(2))
    return batch_norm_node((b, c, size, size), backward=backward), batch_norm_node(
        (2 * b, c, size, size), backward=backward
    )


CLASSES: dict[str, Pair] = {
    "linear": _linear,
    "linear_n": _gemm_along(2),
    "linear_k": _gemm_along(3),
    "bmm": _bmm,
    "bmm_m": _gemm_along(1, "bmm"),
    "bmm_k": _gemm_along(3, "bmm"),
    "conv": _conv,
    "gelu": _alike("gelu"),
    "add": _alike("add"),
    "bias_add": _bias_add,
    "outer_add": _outer_add,
    "ln": _alike("ln"),
    "softmax": _alike("softmax"),
    "memory_pass": _memory_pass,
    "batch_norm": _batch_norm,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=300, help="random problems per class")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heads", help="directory of trained heads (default: the shipped ones)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    gpus = [get_device(d) for d in device_names()]
    gpus = [g for g in gpus if g.fp32_tflops and g.mem_bandwidth_gbps and g.num_sms and g.l2_cache_mb]
    heads = Heads.load(args.heads) if args.heads else Heads()
    print(f"{len(gpus)} GPUs, {args.pairs} random problems per class, each doubled")
    print(f"{'class':12s} {'pairs':>6s} {'larger faster':>13s} {'worst ratio':>11s}")
    summary = []
    total = 0
    for name, make in CLASSES.items():
        pairs = [node for _ in range(args.pairs) for node in make(rng)]
        batch = NodeBatch.of(pairs)
        ms = [heads.predict(batch, g) for g in gpus]
        ratios = np.concatenate([m[1::2] / m[0::2] for m in ms])
        ratios = ratios[np.isfinite(ratios)]
        if not len(ratios):
            print(f"{name:12s} no predictions")
            continue
        pct = 100 * float((ratios < 1.0).mean())
        total += len(ratios)
        print(f"{name:12s} {len(ratios):6d} {pct:12.1f}% {ratios.min():11.3f}")
        summary.append(f"{name}_violation_pct={pct:.1f}")
    print(" ".join(summary) + f" pairs={total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
