"""Reference Triton kernels: results against torch under the CPU interpreter, and launches that are
known before the kernel runs and reach wave scaling unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from fxcost.cost_models import NodeBatch
from fxcost.cost_models.wave_scaling import WaveScaling, kernels_of
from fxcost.data.datasets import kernel_alike_node
from fxcost.gpus import get_device
from fxcost.kernels_triton import reference as ref
from fxcost.records import KernelRecord

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(sum(shape)))


@pytest.mark.parametrize("op", ref.EW_OPS)
def test_elementwise_matches_torch(op: str) -> None:
    x, y = _randn(3 * ref.EW_BLOCK + 5), _randn(3 * ref.EW_BLOCK + 5)  # a partial last block
    out, launch = ref.elementwise(op, x, y)
    expected = {"add": x + y, "mul": x * y, "relu": torch.relu(x)}[op]
    torch.testing.assert_close(out, expected)
    assert launch.grid == (4, 1, 1) and launch.block == (128, 1, 1)


@pytest.mark.parametrize(("rows", "cols"), [(7, 300), (3, 1), (5, 4096)])
def test_row_kernels_match_torch(rows: int, cols: int) -> None:
    x = _randn(rows, cols)
    out, launch = ref.softmax(x)
    torch.testing.assert_close(out, torch.softmax(x, -1))
    assert launch.grid == (rows, 1, 1)
    w, b = _randn(cols), _randn(cols + 1)[:cols].contiguous()
    out, launch = ref.layer_norm(x, w, b)
    torch.testing.assert_close(out, F.layer_norm(x, (cols,), w, b), atol=1e-4, rtol=1e-4)
    assert launch == ref.row_launch(rows, cols)


def test_row_launch_grows_warps_with_the_row() -> None:
    assert [ref.row_launch(10, c).block[0] for c in (1, 256, 300, 2048, 4096, 65536)] == [
        32,
        32,
        64,
        256,
        512,
        512,
    ]
    with pytest.raises(ValueError, match="exceed"):
        ref.row_launch(1, ref.MAX_ROW + 1)


def test_bad_inputs_are_named() -> None:
    x = _randn(8)
    with pytest.raises(ValueError, match="reference kernels: add, mul, relu"):
        ref.elementwise("gelu", x)
    with pytest.raises(ValueError, match=r"second tensor of shape \(8,\)"):
        ref.elementwise("add", x, _randn(9))
    with pytest.raises(ValueError, match="float32"):
        ref.softmax(x.double())
    with pytest.raises(ValueError, match="contiguous"):
        ref.softmax(_randn(4, 6).t())
    with pytest.raises(ValueError, match=r"shape \(6,\)"):
        ref.layer_norm(_randn(4, 6), _randn(5), _randn(6))


def test_wave_scaling_uses_the_known_launch() -> None:
    """A node timed as a reference kernel carries its exact grid: wave scaling counts waves from it,
    not from the lowering's guess of PyTorch's own kernel."""
    rows, cols = 4096, 1024
    launch = ref.row_launch(rows, cols)
    node = kernel_alike_node("softmax", rows, cols)
    timed = dataclasses.replace(node, kernels=[ref.kernel_record("softmax_ref", launch, 0.1)], origin_ms=0.1)
    (kernel,) = kernels_of(timed)
    assert kernel.launch.grid == launch.grid and kernel.launch.block == launch.block
    # A grid of one program: one wave everywhere, so the prediction no longer depends on the grid size
    # the lowering would have assumed; a grid of many waves does.
    one = dataclasses.replace(timed, kernels=[KernelRecord("k", 0.1, (1, 1, 1), launch.block)])
    t4, a100 = get_device("T4"), get_device("A100-SXM4-40GB")
    many_ms, one_ms = WaveScaling().predict(NodeBatch.of([timed, one], origin=t4), a100)
    assert many_ms > 0 and one_ms > 0 and many_ms != pytest.approx(one_ms, rel=0.05)


@pytest.mark.cuda
def test_profiler_sees_the_launch_we_chose() -> None:
    from fxcost.data.collect import profile_kernels

    x = torch.randn(1000, 700, device="cuda")
    _, launch = ref.softmax(x)
    ((kernel,),) = profile_kernels([lambda: lambda: ref.softmax(x)], torch.device("cuda"))
    assert kernel.grid == launch.grid and kernel.block == launch.block
