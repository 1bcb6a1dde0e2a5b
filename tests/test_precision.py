"""The shared vocabulary: precisions, element sizes, the registry of named entries."""

from __future__ import annotations

import pytest
import torch

from fxcost._registry import Registry
from fxcost.precision import PRECISIONS, Precision, float_itemsize, itemsize, parse_precision


def test_itemsize_is_torchs_for_every_dtype() -> None:
    dtypes = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
    assert len(dtypes) > 20
    for name, dtype in dtypes.items():
        assert itemsize(name) == dtype.itemsize, name
    assert itemsize("no_such_dtype") == 4  # unknown: counted as fp32, as the records always were


def test_float_itemsize_reads_only_floating_dtypes() -> None:
    assert float_itemsize(["int64", "bfloat16", "bool"]) == 2
    assert float_itemsize(["float16", "float32"]) == 4
    assert float_itemsize(["int64", "bool"]) is None
    assert float_itemsize([]) is None


def test_a_precision_is_parsed_once_into_what_it_means() -> None:
    bf16 = parse_precision("bf16")
    assert bf16 is PRECISIONS["bf16"] and (bf16.dtype, bf16.itemsize, bf16.tf32) == ("bfloat16", 2, False)
    assert parse_precision(bf16) is bf16  # an object passes through: nothing is checked twice
    assert parse_precision(None) is None
    assert parse_precision("tf32") == Precision("tf32", "float32", tf32=True)
    with pytest.raises(ValueError, match="unknown precision 'int8'; accepted: fp32, tf32, fp16, bf16"):
        parse_precision("int8")


def test_a_registry_refuses_a_name_twice_and_lists_the_known_ones() -> None:
    registry: Registry[int] = Registry("widget", sort=False)
    registry.register("b")(1)
    registry.register("a")(2)
    with pytest.raises(ValueError, match="widget 'b' is already registered"):
        registry.register("b")(3)
    assert registry.get("a") == 2 and registry.names() == ["b", "a"]
    with pytest.raises(ValueError, match="unknown widget 'c'; registered: b, a"):
        registry.get("c")
