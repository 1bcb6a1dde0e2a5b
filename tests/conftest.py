from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

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
