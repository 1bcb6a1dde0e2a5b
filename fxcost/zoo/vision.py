"""Models of a wider zoo in plain PyTorch: torchvision-style architectures and the edge cases users hit.

torchvision's wheels on the package index are built against CUDA and do not import beside a CPU build
of PyTorch (nor does timm, which imports torchvision), so their architectures are written out here
at small sizes, or come from Hugging Face configs (``benchmarks/coverage.py``):

- ``mobilenet_v3``: MobileNetV3-small's blocks (hardswish, squeeze-excitation with hardsigmoid,
  depthwise convolutions);
- ``unet``: a U-Net whose decoder upsamples by bilinear interpolation;
- ``fcn``: an FCN segmentation head on a ResNet backbone, upsampled to the image (as torchvision's
  FCN-ResNet50), with a per-pixel cross-entropy;
- ``detector``: a CenterNet-style detection head: peaks of a heatmap found against its rolled
  neighbours, the top-k of them, their boxes gathered and sorted by size;
- ``ctc_lstm``: a speech-style model: convolutions, a bidirectional LSTM and a CTC loss;
- ``embedding_bag``: a bag-of-words classifier on ``nn.EmbeddingBag``.

Each ``build(name, batch)`` returns ``(model, inputs)``; the model returns its training loss.

Example:
    >>> model, inputs = build("unet", batch=2)
    >>> model(*inputs).shape
    torch.Size([])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxcost.zoo.builtin import Bottleneck

__all__ = ["MODELS", "build"]

Inputs = tuple[Any, ...]


def build(name: str, batch: int = 2) -> tuple[nn.Module, Inputs]:
    """Build model ``name`` of :data:`MODELS` with inputs of batch size ``batch`` (seeded)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")
    if batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return MODELS[name](batch)


def _conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]


# -- MobileNetV3 ---------------------------------------------------------------------------------


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(scale))))


class _InvertedResidual(nn.Module):
    """Expand (1x1), depthwise (kxk), squeeze-excite, project (1x1), with a residual where shapes allow."""

    def __init__(self, cin: int, expanded: int, cout: int, kernel: int, stride: int, se: bool, act: type):
        super().__init__()
        layers = [*_conv_bn(cin, expanded, 1), act(), *_conv_bn(expanded, expanded, kernel, stride, expanded)]
        layers += [act(), _SqueezeExcite(expanded, max(expanded // 4, 8))] if se else [act()]
        self.body = nn.Sequential(*layers, *_conv_bn(expanded, cout, 1))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV3(nn.Module):
    """MobileNetV3-small's first blocks at a width multiplier; ``classes`` logits."""

    def __init__(self, classes: int = 10, width: float = 0.5):
        super().__init__()

        def c(channels: int) -> int:
            return max(8, int(channels * width) // 8 * 8)

        blocks = [  # (expanded, out, kernel, stride, squeeze-excite, activation), as in the paper's Table 2
            (16, 16, 3, 2, True, nn.ReLU), (72, 24, 3, 2, False, nn.ReLU), (88, 24, 3, 1, False, nn.ReLU),
            (96, 40, 5, 2, True, nn.Hardswish), (240, 40, 5, 1, True, nn.Hardswish),
            (120, 48, 5, 1, True, nn.Hardswish), (288, 96, 5, 2, True, nn.Hardswish),
        ]  # fmt: skip
        layers: list[nn.Module] = [*_conv_bn(3, c(16), 3, 2), nn.Hardswish()]
        cin = c(16)
        for expanded, cout, kernel, stride, se, act in blocks:
            layers.append(_InvertedResidual(cin, c(expanded), c(cout), kernel, stride, se, act))
            cin = c(cout)
        self.features = nn.Sequential(*layers, *_conv_bn(cin, c(576), 1), nn.Hardswish())
        self.classifier = nn.Sequential(
            nn.Linear(c(576), 256), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(256, classes)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))
        return F.cross_entropy(logits, labels)


def _mobilenet_v3(batch: int) -> tuple[nn.Module, Inputs]:
    return MobileNetV3(), (torch.randn(batch, 3, 64, 64), torch.randint(0, 10, (batch,)))


# -- U-Net -----------------------------------------------------------------------------------------


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(*_conv_bn(cin, cout), nn.ReLU(), *_conv_bn(cout, cout), nn.ReLU())


class UNet(nn.Module):
    """Encoder of max-pooled double convolutions; decoder upsampling bilinearly and concatenating the
    encoder's features at each scale; per-pixel class logits and their cross-entropy."""

    def __init__(self, classes: int = 4, width: int = 8, depth: int = 3):
        super().__init__()
        widths = [width * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList(
            _double_conv(a, b) for a, b in zip([3, *widths[:-2]], widths[:-1], strict=True)
        )
        self.bottom = _double_conv(widths[-2], widths[-1])
        self.up = nn.ModuleList(
            _double_conv(widths[i + 1] + widths[i], widths[i]) for i in reversed(range(depth))
        )
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for block, skip in zip(self.up, reversed(skips), strict=True):
            x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            x = block(torch.cat([x, skip], dim=1))
        return F.cross_entropy(self.head(x), masks)


def _unet(batch: int) -> tuple[nn.Module, Inputs]:
    return UNet(), (torch.randn(batch, 3, 64, 64), torch.randint(0, 4, (batch, 64, 64)))


# -- FCN on a ResNet backbone ------------------------------------------------------------------------


class FCN(nn.Module):
    """torchvision's FCN: a ResNet's features at 1/16 of the image, a 3x3 convolution head with
    dropout, 1x1 class logits upsampled bilinearly to the image, and a per-pixel cross-entropy."""

    def __init__(self, classes: int = 5, width: int = 8, blocks: tuple[int, ...] = (1, 1, 1)):
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, width, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        inplanes = width
        for i, count in enumerate(blocks):
            for j in range(count):
                layers.append(Bottleneck(inplanes, width * 2**i, stride=2 if (j == 0 and i > 0) else 1))
                inplanes = width * 2**i * Bottleneck.expansion
        self.backbone = nn.Sequential(*layers)
        inner = inplanes // 4
        self.head = nn.Sequential(
            *_conv_bn(inplanes, inner), nn.ReLU(), nn.Dropout(0.1), nn.Conv2d(inner, classes, 1)
        )

    def forward(self, x: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.backbone(x))
        logits = F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return F.cross_entropy(logits, masks)


def _fcn(batch: int) -> tuple[nn.Module, Inputs]:
    return FCN(), (torch.randn(batch, 3, 64, 64), torch.randint(0, 5, (batch, 64, 64)))


# -- CenterNet-style detection head ------------------------------------------------------------------


class Detector(nn.Module):
    """A small strided backbone; per location a class heatmap and a box (width, height). Training
    loss: a focal-style loss on the heatmap, and on the ``k`` strongest peaks (a score above its
    neighbours, found by rolling the map one step each way; ``topk``) an L1 loss of their boxes
    against targets, the boxes ordered by area (``sort``) for a rank-consistency term."""

    def __init__(self, classes: int = 3, width: int = 16, k: int = 16):
        super().__init__()
        self.k = k
        self.backbone = nn.Sequential(
            *_conv_bn(3, width, 3, 2), nn.ReLU(), *_conv_bn(width, 2 * width, 3, 2), nn.ReLU()
        )
        self.heatmap, self.boxes = (
            nn.Conv2d(2 * width, classes, 3, padding=1),
            nn.Conv2d(2 * width, 2, 3, padding=1),
        )

    def forward(self, x: torch.Tensor, heat: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        features = self.backbone(x)
        scores, boxes = self.heatmap(features).sigmoid(), self.boxes(features)
        peaks = scores
        for shift, dim in ((1, -1), (-1, -1), (1, -2), (-1, -2)):
            peaks = peaks * (scores >= scores.roll(shift, dims=dim))
        top, where = peaks.flatten(2).amax(1).topk(self.k, dim=1)  # [B, k] strongest locations
        picked = boxes.flatten(2).gather(2, where.unsqueeze(1).expand(-1, 2, -1))  # [B, 2, k]
        area, _ = (picked[:, 0] * picked[:, 1]).sort(dim=1)
        focal = -(heat * (1 - scores).pow(2) * scores.clamp_min(1e-6).log()).mean()
        return focal + (picked - sizes).abs().mean() + (area - area.detach().mean()).abs().mean() * top.mean()


def _detector(batch: int) -> tuple[nn.Module, Inputs]:
    heat = (torch.rand(batch, 3, 16, 16) > 0.95).float()
    return Detector(), (torch.randn(batch, 3, 64, 64), heat, torch.rand(batch, 2, 16))


# -- CTC-loss LSTM ---------------------------------------------------------------------------------


class CTCModel(nn.Module):
    """Convolutions over a spectrogram's time axis, a bidirectional LSTM, per-frame log-probabilities
    of ``tokens`` + blank, and the CTC loss against target sequences."""

    def __init__(self, features: int = 16, hidden: int = 32, tokens: int = 12):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(features, hidden, 3, padding=1), nn.ReLU())
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, tokens + 1)

    def forward(self, spectrogram: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.conv(spectrogram).transpose(1, 2))
        log_probs = self.out(h).log_softmax(-1).transpose(0, 1)  # [T, B, C]
        frames, batch = log_probs.shape[:2]
        input_lengths = torch.full((batch,), frames, dtype=torch.long)
        target_lengths = torch.full((batch,), targets.shape[1], dtype=torch.long)
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths)


def _ctc_lstm(batch: int) -> tuple[nn.Module, Inputs]:
    # Few frames: a captured CPU LSTM is unrolled into ops per time step.
    return CTCModel(), (torch.randn(batch, 16, 12), torch.randint(1, 13, (batch, 4)))


# -- EmbeddingBag classifier ---------------------------------------------------------------------


class BagOfWords(nn.Module):
    """fastText-style: the mean embedding of each document's tokens (``nn.EmbeddingBag``), a hidden
    layer and class logits."""

    def __init__(self, vocab: int = 1000, dim: int = 32, classes: int = 4):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, tokens: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.mlp(self.bag(tokens, offsets)), labels)


def _embedding_bag(batch: int) -> tuple[nn.Module, Inputs]:
    lengths = torch.randint(3, 20, (batch,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    tokens = torch.randint(0, 1000, (int(lengths.sum()),))
    return BagOfWords(), (tokens, offsets, torch.randint(0, 4, (batch,)))


MODELS: dict[str, Callable[[int], tuple[nn.Module, Inputs]]] = {
    "mobilenet_v3": _mobilenet_v3,
    "unet": _unet,
    "fcn": _fcn,
    "detector": _detector,
    "ctc_lstm": _ctc_lstm,
    "embedding_bag": _embedding_bag,
}
"""The models by name: each builds ``(model, inputs)`` for a batch size."""
