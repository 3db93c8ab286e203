"""The clients' networks, defined in plain torch (torchvision does not install here): the smoke MLP,
VGG16-BN and the grouped-bottleneck "ResNet50" variant of the official models/Nets.py (spec §4)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

VGG16_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
ARCHS = ("mlp", "vgg16_bn", "resnet50g")


def mlp(in_features: int, hidden: Sequence[int], classes: int) -> nn.Sequential:
    """Linear-ReLU stack; keys 0.weight, 0.bias, 2.weight, ... (the batched MLP uses the same names)."""
    layers: list[nn.Module] = []
    width = in_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


class VGG16BN(nn.Module):
    """13 conv3x3 + BN + ReLU, 5 max-pools, FC 512 → 4096 → 4096 (dropout) → classes, for 32×32 inputs."""

    def __init__(self, classes: int, in_channels: int = 3, dropout: float = 0.5):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_channels
        for item in VGG16_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(width, item, 3, padding=1), nn.BatchNorm2d(item), nn.ReLU(inplace=True)]
                width = item
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(4096, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, groups: int):
        super().__init__()
        out = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(in_ch, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=groups, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.shortcut = (
            nn.Identity()
            if stride == 1 and in_ch == out
            else nn.Sequential(nn.Conv2d(in_ch, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class GroupedResNet50(nn.Module):
    """Bottleneck blocks [3, 4, 6, 3], widths 32/64/128/256 (× 4 out), grouped 3×3 convs, final
    BN + ReLU, dropout 0.2, linear head [recon: stem and stride placement are ours]."""

    def __init__(self, classes: int, in_channels: int = 3, groups: int = 32, dropout: float = 0.2):
        super().__init__()
        blocks: list[nn.Module] = [
            nn.Conv2d(in_channels, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        ]
        width_in = 64
        for stage, (depth, width) in enumerate(zip((3, 4, 6, 3), (32, 64, 128, 256))):
            for b in range(depth):
                blocks.append(Bottleneck(width_in, width, 2 if b == 0 and stage > 0 else 1, groups))
                width_in = width * Bottleneck.expansion
        blocks += [
            nn.BatchNorm2d(width_in),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
        ]
        self.features = nn.Sequential(*blocks)
        self.fc = nn.Linear(width_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def he_init(net: nn.Module) -> nn.Module:
    """He-normal weights and zero biases on every Linear/Conv layer (`model.init: he`)."""
    for layer in net.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return net


def build_network(model: Mapping[str, Any], input_shape: Sequence[int], classes: int) -> nn.Module:
    """The network of `model.arch` with torch's default initialisation, or He's (`model.init`)."""
    net = _architecture(model, input_shape, classes)
    return he_init(net) if model["init"] == "he" else net


def _architecture(model: Mapping[str, Any], input_shape: Sequence[int], classes: int) -> nn.Module:
    arch = model["arch"]
    if arch == "mlp":
        size = 1
        for d in input_shape:
            size *= int(d)
        return mlp(size, model["hidden"], classes)
    if arch == "vgg16_bn":
        return VGG16BN(classes, in_channels=int(input_shape[0]))
    if arch == "resnet50g":
        return GroupedResNet50(classes, in_channels=int(input_shape[0]))
    raise ValueError(f"unknown model.arch {arch!r}; known: {', '.join(ARCHS)}")
