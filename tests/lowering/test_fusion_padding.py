"""Inductor's shape padding of unaligned GEMMs (fxcost.lowering.fusion_padding) and the compiled step's
choice between the padded and the unpadded GEMM (fxcost.propagate.compiled)."""

from __future__ import annotations

import numpy as np
import pytest

from fxcost.gpus import get_device
from fxcost.lowering.fusion import FusedKernel
from fxcost.lowering.fusion_padding import alignment, compute_bound, padded_gemm
from fxcost.propagate import fused_kernel_ms
from fxcost.records import NodeCost

DEVICE = get_device("H100-SXM")


def _mm(
    a: tuple[int, ...], b: tuple[int, ...], dtype: str = "bfloat16", op: str = "aten.mm.default"
) -> NodeCost:
    out = (*a[:-1], b[-1])
    return NodeCost("mm", op, "fw", in_shapes=[a, b], in_dtypes=[dtype] * 2, out_shapes=[out],
                    out_dtypes=[dtype], flops=2 * int(np.prod(out)) * a[-1])  # fmt: skip


def test_an_unaligned_dimension_is_padded_to_a_multiple_of_16_bytes() -> None:
    assert (alignment("bfloat16"), alignment("float32"), alignment("int64")) == (8, 4, 0)
    # GPT-2's lm_head: 50,257 words padded to 50,264; only the weight needs a copy.
    padded = padded_gemm(_mm((16384, 1024), (1024, 50257)))
    assert padded is not None
    assert padded.gemm.in_shapes == [(16384, 1024), (1024, 50264)]
    assert padded.gemm.out_shapes == [(16384, 50264)]
    assert padded.gemm.flops == 2 * 16384 * 50264 * 1024
    assert padded.copy_bytes == ((1024 * 50257 + 1024 * 50264) * 2,)
    # The backward's GEMM over the vocabulary pads both operands along k.
    both = padded_gemm(_mm((16384, 50257), (50257, 1024)))
    assert both is not None and len(both.copy_bytes) == 2
    assert padded_gemm(_mm((16384, 1024), (1024, 4096))) is None  # aligned already
    assert padded_gemm(_mm((16384, 1024), (1024, 50257), dtype="int64")) is None
    assert padded_gemm(_mm((1, 1024), (1024, 4096))) is None  # a dimension of 1 stays
    batched = padded_gemm(_mm((12, 512, 63), (12, 63, 512), op="aten.bmm.default"))
    assert batched is not None and batched.gemm.in_shapes == [(12, 512, 64), (12, 64, 512)]


def test_only_a_compute_bound_gemm_is_padded() -> None:
    assert compute_bound(_mm((16384, 1024), (1024, 50257)), DEVICE)
    assert not compute_bound(_mm((16384, 3), (3, 16384)), DEVICE)  # a thin outer product: memory bound


def test_the_compiled_step_runs_the_padded_gemm_where_it_is_faster() -> None:
    node = _mm((16384, 1024), (1024, 50257))
    kernel = FusedKernel("extern", (0,), ((0, 0),), ((True,),))
    slow = fused_kernel_ms([node], [kernel], np.array([17.5]), DEVICE)[0]  # the narrow-load kernel
    assert 0 < slow < 17.5 / 1.1
    fast = fused_kernel_ms([node], [kernel], np.array([slow * 1.05]), DEVICE)[0]
    assert fast == pytest.approx(slow * 1.05)  # not 1.1 times faster padded: left as it is
    aligned = _mm((16384, 1024), (1024, 4096))
    assert fused_kernel_ms([aligned], [kernel], np.array([9.0]), DEVICE)[0] == 9.0
