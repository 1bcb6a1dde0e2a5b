"""A model for ``fxcost profile examples.my_models:build``: any callable that returns ``(model, inputs)``
(and takes ``batch`` if it has a batch size) can be profiled from the command line this way."""

from __future__ import annotations

import torch
from torch import nn


def build(batch: int = 8) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A two-layer MLP and a batch of ``batch`` inputs."""
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 10))
    return model, (torch.randn(batch, 256),)
