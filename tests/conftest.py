"""Fixtures shared across the suite. The suite mirrors the package: ``tests/<stage>/`` tests
``fxcost/<stage>/``."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

# Without a CUDA GPU, Triton kernels run under its CPU interpreter. The variable must be set before
# anything imports Triton (torch.compile does; importing torch does not): Triton's own library
# functions are built in one mode at import, and interpreted kernels cannot call compiled ones.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared measurement data (``FXCOST_DATA``, default ``../shared/data`` beside the repo)."""
    path = Path(os.environ.get("FXCOST_DATA", REPO.parent / "shared" / "data"))
    if not path.is_dir():
        pytest.skip(f"no measurement data at {path}")
    return path


TINY_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 1, "n_embd": 64,
             "n_head": 2, "vocab_size": 128, "n_positions": 64}  # fmt: skip


@pytest.fixture
def tiny_gpt2_config(tmp_path: Path) -> Path:
    """A one-layer GPT-2 Hugging Face config.json (skips without transformers)."""
    import json

    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_GPT2))
    return path


@pytest.fixture
def fresh_database() -> Iterator[ModuleType]:
    """The GPU database module, reloaded before and after the test: device files change the
    process-wide table."""
    import fxcost.gpus

    fxcost.gpus._database.cache_clear()
    yield fxcost.gpus
    fxcost.gpus._database.cache_clear()


@pytest.fixture(scope="session")
def load_script() -> Callable[[str], ModuleType]:
    """``load_script("benchmarks/gpu_pairs.py")``: a script of the repository imported as a module."""

    def load(relative: str) -> ModuleType:
        path = REPO / relative
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    return load


def _small_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


@pytest.fixture(scope="session")
def small_model() -> Callable[[], nn.Module]:
    """Makes a small model with a matmul, an elementwise op and a norm: linear, GELU, layer norm,
    linear, for inputs of shape (batch, 16)."""
    return _small_model


@pytest.fixture(scope="module")
def report(small_model: Callable[[], nn.Module]):  # type: ignore[no-untyped-def]
    """A training step of ``small_model()`` at batch 8, measured on this CPU, predicted on H100-SXM
    and T4."""
    import fxcost

    torch._dynamo.reset()
    return fxcost.profile(small_model(), (torch.randn(8, 16),), devices=["H100-SXM", "T4"], budget_ms=0.2)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch, so no test sees another's cached graphs."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
