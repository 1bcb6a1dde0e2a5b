"""What the data set's columns mean, read off the kernels its rows record."""

from __future__ import annotations

import numpy as np

from fxcost.data.datasets import read_ops, row_node
from fxcost.lowering.nodes import gemm_dims


def test_gemm_rows_reduce_n_and_write_an_m_by_k_output(data_dir) -> None:
    """Every measured GEMM kernel's grid tiles an M x K output: cuBLAS's ``*_sgemm_<a>x<b>_*`` kernel
    runs grid (ceil(K / a), ceil(B*M / b)) (column-major: the output's columns first), so N is the
    reduced dimension, whatever a reader would guess from the letters."""
    rows = read_ops(data_dir, ["linear", "bmm"])
    tile = rows["Kernel Name"].str.extract(r"sgemm_(\d+)x(\d+)_(?:nn|tn|nt)$").astype(float)
    plain = rows[tile[0].notna()].assign(a=tile[0], b=tile[1])
    assert len(plain) > 10000
    batch = np.where(plain["OPName"] == "linear", plain["B"], 1)
    covers = (np.ceil(plain["K"] / plain["a"]) == plain["Grid x"]) & (
        np.ceil(batch * plain["M"] / plain["b"]) == plain["Grid y"]
    )
    assert covers.mean() > 0.95
    row = plain.iloc[0]
    b, m, n, k = gemm_dims(row_node(row))
    assert (m, n, k) == (row["B"] * row["M"] if row["OPName"] == "linear" else row["M"], row["K"], row["N"])
    assert b == (1 if row["OPName"] == "linear" else row["B"])
