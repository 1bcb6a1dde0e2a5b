"""The occupancy calculator against hand-worked cases and the measured launch metadata."""

from __future__ import annotations

import pytest

from fxcost.gpus import get_device
from fxcost.gpus.occupancy import Launch, blocks_per_sm, wave_size


@pytest.mark.parametrize(
    ("gpu", "threads", "regs", "smem", "expected", "limit"),
    [
        ("V100-PCIE-32GB", 256, None, 0, 8, "warps: 64 / 8"),
        ("V100-PCIE-32GB", 256, 32, 0, 8, "registers: 65536 / (32*32) = 64 warps -> 8 blocks"),
        ("V100-PCIE-32GB", 256, 64, 0, 4, "registers: 65536 / 2048 = 32 warps -> 4 blocks"),
        (
            "V100-PCIE-32GB",
            256,
            33,
            0,
            6,
            "33*32 = 1056 registers a warp round to 1280: 51 warps -> 6 blocks",
        ),
        ("V100-PCIE-32GB", 32, None, 0, 32, "block limit 32"),
        ("T4", 128, None, 0, 8, "T4 has 1024 threads per SM: 32 warps / 4"),
        ("T4", 1024, None, 0, 1, "one full block"),
        ("V100-PCIE-32GB", 128, None, 48 * 1024, 2, "96 KB shared memory / 48 KB"),
        ("A100-SXM4-80GB", 128, None, 48 * 1024, 3, "164 KB / (48 KB + 1 KB reserved)"),
        ("P4", 512, None, 0, 4, "2048 threads / 512"),
    ],
)
def test_hand_worked_cases(gpu, threads, regs, smem, expected, limit) -> None:
    assert blocks_per_sm(get_device(gpu), threads, regs, smem) == expected, limit


def test_wave_size_is_blocks_per_sm_times_sms() -> None:
    launch = Launch(grid=(102400, 1, 1), block=(128, 1, 1))
    assert wave_size(get_device("V100-PCIE-32GB"), launch) == 16 * 80
    assert wave_size(get_device("A100-PCIE-40GB"), launch) == 16 * 108
    assert launch.blocks == 102400 and launch.threads_per_block == 128


def test_blocks_that_cannot_launch_are_refused() -> None:
    with pytest.raises(ValueError, match="2048 threads per block cannot launch"):
        blocks_per_sm(get_device("T4"), 2048)
    with pytest.raises(ValueError, match="exceed"):
        blocks_per_sm(get_device("T4"), 128, registers_per_thread=300)
    with pytest.raises(ValueError, match="does not fit"):
        blocks_per_sm(get_device("T4"), 128, shared_memory_bytes=200 * 1024)


def test_measured_blocks_per_sm_column_matches_sm_counts(data_dir) -> None:
    """The data's "Blocks per SM" is grid blocks / SMs: it checks every SM count in the database."""
    from fxcost.data.datasets import KERNEL_ALIKE, read_ops

    rows = read_ops(data_dir, KERNEL_ALIKE)
    sms = rows["device"].map(lambda name: get_device(name).num_sms)
    blocks = rows["Grid x"] * rows["Grid y"] * rows["Grid z"]
    ratio = (blocks / sms) / rows["Blocks per SM"]
    assert ratio.between(0.99, 1.01).all(), rows.loc[~ratio.between(0.99, 1.01), "device"].unique()
    warps = rows["Block x"] * rows["Block y"] * rows["Block z"] / 32
    assert ((rows["Blocks per SM"] * warps) / rows["Warps per SM"]).between(0.99, 1.01).all()
