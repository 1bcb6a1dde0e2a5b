"""Built-in example models, in plain PyTorch (no torchvision or transformers needed).

Each entry builds ``(model, example_inputs)`` for a batch size: an MLP, ResNet-50, an LSTM language
model, one transformer block, and a GPT-2-style decoder. The language models compute their own
cross-entropy loss when given targets, so a captured training step includes the loss.

Example:
    >>> model, inputs = build("mlp", batch=4)
    >>> model(*inputs).shape
    torch.Size([4, 1000])
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxcost._registry import Registry

__all__ = ["Autocast", "build", "load", "names"]

Builder = Callable[..., tuple[nn.Module, tuple[Any, ...]]]
_ZOO: Registry[Builder] = Registry("zoo model", sort=False)
_entry = _ZOO.register


def names() -> list[str]:
    """Names of the built-in example models."""
    return _ZOO.names()


def build(name: str, batch: int = 8, **config: Any) -> tuple[nn.Module, tuple[Any, ...]]:
    """Build zoo model ``name`` with example inputs of batch size ``batch`` (seeded, reproducible)."""
    builder = _ZOO.get(name)
    if batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return builder(batch, **config)


def load(spec: str | Callable[..., Any], batch: int = 8, **config: Any) -> tuple[Any, Any]:
    """``(model, inputs)`` from a zoo name, a ``"module:callable"`` path, or a callable, each called
    with the batch (if it takes one) and ``config``.

    Raises:
        ValueError: the name is no zoo entry and the path cannot be imported.
        TypeError: the callable does not return ``(model, inputs)``.
    """
    if isinstance(spec, str) and ":" not in spec:
        return build(spec, batch, **config)
    if isinstance(spec, str):
        module_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load {spec!r}: {e}; expected a zoo name or 'module:callable'") from e
    else:
        factory = spec
    takes_batch = "batch" in inspect.signature(factory).parameters
    built = factory(batch=batch, **config) if takes_batch else factory(**config)
    if not (isinstance(built, tuple) and len(built) == 2):
        raise TypeError(f"{spec!r} must return (model, inputs), got {type(built).__name__}")
    return built


class Autocast(nn.Module):
    """``model``'s forward under ``torch.autocast(device_type, dtype)``: the mixed-precision step
    (its loss and backward follow the autocast graph). On a CPU, bf16 autocast captures the graph
    CUDA's autocast runs."""

    def __init__(self, model: nn.Module, device_type: str = "cuda", dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.model, self.device_type, self.dtype = model, device_type, dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.model(*args, **kwargs)


# -- MLP -----------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, features: int = 1024, hidden: int = 4096, layers: int = 3, classes: int = 1000):
        super().__init__()
        dims = [features] + [hidden] * (layers - 1)
        self.body = nn.Sequential(*[m for a, b in pairwise(dims) for m in (nn.Linear(a, b), nn.ReLU())])
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@_entry("mlp")
def _mlp(batch: int, features: int = 1024, **config: Any) -> tuple[nn.Module, tuple[Any, ...]]:
    return MLP(features, **config), (torch.randn(batch, features),)


# -- ResNet-50 -----------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(y + identity)


class ResNet(nn.Module):
    """ResNet-v1.5 (stride in the 3x3 convolution), as in torchvision's resnet50."""

    def __init__(self, blocks: tuple[int, ...] = (3, 4, 6, 3), classes: int = 1000, width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        layers, inplanes = [], width
        for i, count in enumerate(blocks):
            planes = width * 2**i
            stage = []
            for j in range(count):
                stage.append(Bottleneck(inplanes, planes, stride=2 if (j == 0 and i > 0) else 1))
                inplanes = planes * Bottleneck.expansion
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@_entry("resnet50")
def _resnet50(batch: int, image: int = 224, **config: Any) -> tuple[nn.Module, tuple[Any, ...]]:
    return ResNet(**config), (torch.randn(batch, 3, image, image),)


# -- LSTM language model -------------------------------------------------------------------------


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int = 10000, embed: int = 512, hidden: int = 512, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        h, _ = self.lstm(self.embed(tokens))
        return _next_token_loss(self.head(h), targets)


@_entry("lstm")
def _lstm(batch: int, seq: int = 32, vocab: int = 10000, **config: Any) -> tuple[nn.Module, tuple[Any, ...]]:
    return _language_model(lambda: LSTMLanguageModel(vocab, **config), batch, seq, vocab)


# -- Transformer ---------------------------------------------------------------------------------


class Attention(nn.Module):
    """Causal multi-head self-attention written out (eager attention, as Hugging Face's GPT-2)."""

    def __init__(self, dim: int, heads: int, causal: bool = True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        y = scores.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: attention and a GELU MLP, each with a residual connection."""

    def __init__(self, dim: int = 768, heads: int = 12, dropout: float = 0.1):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


@_entry("transformer_block")
def _block(batch: int, seq: int = 128, dim: int = 768, **config: Any) -> tuple[nn.Module, tuple[Any, ...]]:
    return Block(dim, **config), (torch.randn(batch, seq, dim),)


class GPT2(nn.Module):
    """A GPT-2-style decoder: token and position embeddings, blocks, final norm, tied LM head."""

    def __init__(
        self, vocab: int = 50257, ctx: int = 1024, dim: int = 768, heads: int = 12, layers: int = 12
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return _next_token_loss(self.ln(x) @ self.tok.weight.t(), targets)


@_entry("gpt2")
def _gpt2(batch: int, seq: int = 128, vocab: int = 50257, **config: Any) -> tuple[nn.Module, tuple[Any, ...]]:
    """GPT-2 small (124M) by default; ``layers=`` and ``dim=`` make it smaller or larger."""
    return _language_model(lambda: GPT2(vocab, **config), batch, seq, vocab)


# -- language-model helpers ----------------------------------------------------------------------


def _language_model(
    model: Callable[[], nn.Module], batch: int, seq: int, vocab: int
) -> tuple[nn.Module, tuple[Any, ...]]:
    """A language model built by ``model`` after its batch of token ids is drawn, with the ids as
    inputs and, as targets, the same ids shifted by one."""
    tokens = torch.randint(0, vocab, (batch, seq + 1))
    return model(), (tokens[:, :-1], tokens[:, 1:])


def _next_token_loss(logits: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """The logits, or with targets their cross-entropy: a language model's training step has its loss."""
    if targets is None:
        return logits
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
