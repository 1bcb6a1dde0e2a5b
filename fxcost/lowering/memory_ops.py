"""Memory passes of indexing, sorting and bag ops: scatters, index puts, roll, flip, sort, top-k, histograms
and embedding bags, as the kernels of PyTorch's CUDA sources move their bytes (see
:data:`~fxcost.lowering.kernels.MEMORY_BOUND`).

Sorting is radix sorting on a GPU: PyTorch's ``sort`` of long rows, ``topk``'s radix select and the
index sort of an accumulating ``index_put`` (and of the embedding-bag backward) make one pass over
their keys per 8-bit digit of the key. So their passes grow with the bits of the key, not with
``log n`` as a comparison sort would: a float32 key has 4 digits, and an index into ``n`` rows
``ceil(log2 n) / 8`` (cub sorts only the bits an index can use). Rows of at most 4,096 elements are
sorted in one in-place pass in shared memory instead (``sortKeyValueInplace``).
"""

from __future__ import annotations

import math

import torch

from fxcost.lowering.kernels import memory_bound, tensor_in, tensor_out
from fxcost.precision import itemsize
from fxcost.records import NodeCost

__all__ = ["SHARED_MEMORY_SORT", "radix_passes"]

aten = torch.ops.aten

SHARED_MEMORY_SORT = 4096
"""The longest row PyTorch's CUDA ``sort`` sorts in place in shared memory, in one pass."""

_INDEX_BYTES = 8  # int64 indices and positions


def radix_passes(key_bits: int) -> int:
    """Passes of a radix sort (or select) over keys of ``key_bits`` significant bits: one per 8-bit
    digit."""
    return max(math.ceil(key_bits / 8), 1)


def _index_sort(count: int, key_range: int) -> float:
    """Bytes moved sorting ``count`` int64 indices below ``key_range`` with their positions: each pass
    reads and writes both."""
    bits = max(math.ceil(math.log2(max(key_range, 2))), 1)
    return radix_passes(bits) * 2 * 2 * _INDEX_BYTES * count


def _numel(node: NodeCost, i: int) -> int:
    return math.prod(node.in_shapes[i])


@memory_bound(aten.roll.default, aten.flip.default, aten.repeat.default)
def _moved(node: NodeCost) -> list[tuple[str, float]]:
    """``roll_cuda_kernel``, ``flip_kernel``, the copy of ``repeat``: the input read, the output
    written once. Kernels are named after their op."""
    return [(node.op.split(".")[1], tensor_in(node, 0) + tensor_out(node, 0))]


@memory_bound(aten.as_strided_scatter.default)
def _copy_then_scatter(node: NodeCost) -> list[tuple[str, float]]:
    """Copy ``self`` to the output, then the source into its strided view."""
    return [("copy", 2 * tensor_in(node, 0)), ("copy", 2 * tensor_in(node, 1))]


@memory_bound(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(node: NodeCost) -> list[tuple[str, float]]:
    """Copy ``self``, then write the values (the last input) where the indices say. Accumulating
    (the backward of a gather or of upsampling) sorts the linear indices first, so equal ones are
    added in order (``index_put_with_sort_kernel``), and reads the destination it adds to."""
    indices = sum(tensor_in(node, i) for i in range(1, len(node.in_shapes) - 1))
    values = tensor_in(node, -1)
    passes: list[tuple[str, float]] = [("copy", 2 * tensor_in(node, 0))]
    if not node.args.get("accumulate"):
        return [*passes, ("index_put", 2 * values + indices)]
    # One linear index per index tuple (the indices broadcast), each addressing a slice of the
    # dimensions not indexed; its keys range over the indexed dimensions of ``self``.
    count = math.prod(torch.broadcast_shapes(*node.in_shapes[1:-1]))
    slices = max(_numel(node, len(node.in_shapes) - 1) // max(count, 1), 1)
    return [
        *passes,
        ("linear_index", indices + count * _INDEX_BYTES),
        ("sort_indices", _index_sort(count, _numel(node, 0) // slices)),
        ("index_put_with_sort", 3 * values + 2 * count * _INDEX_BYTES),
    ]


@memory_bound(aten.scatter.src, aten.scatter.value, aten.scatter_add.default)
def _scatter(node: NodeCost) -> list[tuple[str, float]]:
    """Copy ``self``, then write one element per index (reading the source's; an add reads the
    destination too)."""
    count = _numel(node, 1)
    written = count * itemsize(node.out_dtypes[0])
    source = tensor_in(node, 2) if len(node.in_shapes) > 2 else 0
    destination = written if node.op == "aten.scatter_add.default" else 0
    scatter = tensor_in(node, 1) + source + written + destination
    return [("copy", 2 * tensor_in(node, 0)), ("scatter", scatter)]


@memory_bound(aten.sort.default, aten.sort.stable)
def _sort(node: NodeCost) -> list[tuple[str, float]]:
    """Copy the values into place and number the indices, then sort both: in shared memory in one
    pass for short rows, by radix passes over the keys' digits for long ones."""
    shape = node.in_shapes[0]
    dim = int(node.args.get("dim", -1)) % len(shape) if shape else 0
    row = shape[dim] if shape else 1
    both = tensor_out(node, 0) + tensor_out(node, 1)
    passes: list[tuple[str, float]] = [
        ("copy", 2 * tensor_in(node, 0)),
        ("fill_indices", tensor_out(node, 1)),
    ]
    if row <= SHARED_MEMORY_SORT:
        return [*passes, ("sort_in_shared_memory", 2 * both)]
    digits = radix_passes(8 * itemsize(node.in_dtypes[0]))
    return [*passes, *[("radix_sort_pass", 2 * both)] * digits]


@memory_bound(aten.topk.default)
def _topk(node: NodeCost) -> list[tuple[str, float]]:
    """Radix select of the k-th value, one read of the input per digit of its key; a gather pass
    reading the input again and writing the k values and indices; then, if sorted, the k sorted."""
    x = tensor_in(node, 0)
    picked = tensor_out(node, 0) + tensor_out(node, 1)
    digits = radix_passes(8 * itemsize(node.in_dtypes[0]))
    passes: list[tuple[str, float]] = [*[("radix_select", x)] * digits, ("gather_topk", x + picked)]
    if node.args.get("sorted", True) and node.args.get("k", 2) > 1:
        passes.append(("sort_in_shared_memory", 2 * picked))
    return passes


@memory_bound(aten.histc.default)
def _histc(node: NodeCost) -> list[tuple[str, float]]:
    """Zero the bins, then one read of the input adding each element to its bin."""
    return [("fill", tensor_out(node, 0)), ("histc", tensor_in(node, 0) + tensor_out(node, 0))]


@memory_bound(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(node: NodeCost) -> list[tuple[str, float]]:
    """Number each index's bag from the offsets (a fill, a scatter of the offsets, a scan), then one
    kernel reads each index's weight row and writes the bags (sum, mean or max) and their sizes."""
    indices = tensor_in(node, 1)
    rows = _numel(node, 1) * node.in_shapes[0][-1] * itemsize(node.in_dtypes[0])
    offset2bag = tensor_out(node, 1)
    outputs = sum(tensor_out(node, i) for i in range(len(node.out_shapes)) if i != 1)
    return [
        ("fill", offset2bag),
        ("offset2bag", tensor_in(node, 2) + 2 * offset2bag),
        ("embedding_bag", indices + offset2bag + rows + outputs),
    ]


@memory_bound(aten._embedding_bag_backward.default, aten._embedding_bag_dense_backward.default)
def _embedding_bag_backward(node: NodeCost) -> list[tuple[str, float]]:
    """Zero the weight's gradient, sort the indices, then add each index's bag gradient row into the
    weight row it names (partial sums per run of equal indices, then their sum)."""
    count = _numel(node, 1)
    rows = count * node.in_shapes[0][-1] * itemsize(node.in_dtypes[0])
    num_weights = node.out_shapes[0][0] if node.out_shapes and node.out_shapes[0] else count
    return [
        ("fill", tensor_out(node, 0)),
        ("sort_indices", _index_sort(count, num_weights)),
        ("embedding_bag_backward", 2 * rows + 3 * count * _INDEX_BYTES),
    ]
