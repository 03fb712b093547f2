"""Backbones (torchvision ResNets, optionally narrow and with a CIFAR stem) and MLP heads.

Why a subclass of torchvision's ``ResNet`` rather than a hand-written network: the blocks,
initialisation and ``state_dict`` keys stay torchvision's, so an exported backbone loads
into ``torchvision.models.resnet18()`` (with ``fc = nn.Identity()``, and the same stem).
torchvision hard-codes 64 channels in the first stage; ``width`` scales every stage so a
ResNet-18 small enough for a CPU (width 16: 0.7M parameters) is the same architecture.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

BACKBONES = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


class ScaledResNet(ResNet):
    """torchvision ResNet whose stage widths are ``width * (1, 2, 4, 8)`` instead of 64 * (...).

    The classifier ``fc`` is replaced by ``nn.Identity``: ``forward`` returns pooled features.

    Shape:
        x: (B, in_channels, H, W) -> (B, feature_dim) with ``feature_dim = 8 * width * expansion``.
    """

    def __init__(self, block, layers: list[int], width: int = 64, in_channels: int = 3, cifar_stem: bool = False):
        self._width = width
        super().__init__(block, layers)
        # torchvision built the stem for 3 -> 64 channels; rebuild it for in_channels -> width.
        if cifar_stem:
            # 3x3 stride 1 and no max-pool: a 32x32 image keeps enough resolution (SimCLR appendix B.9).
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.feature_dim = 8 * width * block.expansion
        self.in_channels = in_channels
        self.fc = nn.Identity()

    def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
        if planes == 64:  # the first stage: its input is the stem's output
            self.inplanes = self._width
        return super()._make_layer(block, planes * self._width // 64, blocks, stride, dilate)


def build_backbone(name: str, width: int = 64, cifar_stem: bool = False, in_channels: int = 3) -> ScaledResNet:
    """A ResNet by name (see ``BACKBONES``) returning pooled features; ``.feature_dim`` says their size."""
    if name not in BACKBONES:
        raise ValueError(f"backbone must be one of {sorted(BACKBONES)}, got {name!r}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    block, layers = BACKBONES[name]
    return ScaledResNet(block, layers, width=width, in_channels=in_channels, cifar_stem=cifar_stem)


def build_mlp(
    in_dim: int, hidden_dim: int, out_dim: int, num_layers: int = 2, last_batch_norm: bool = False
) -> nn.Sequential:
    """Projection / prediction head: ``num_layers`` linear layers, BatchNorm + ReLU between them.

    SimCLR uses 2 layers (2048 -> 128), MoCo v3 3 layers with a BatchNorm after the last
    (``last_batch_norm``, affine-free as in its code).

    Shape:
        (B, in_dim) -> (B, out_dim)
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        # No bias before BatchNorm: the norm's shift makes it redundant.
        layers += [nn.Linear(dim, hidden_dim, bias=False), nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim, bias=not last_batch_norm))
    if last_batch_norm:
        layers.append(nn.BatchNorm1d(out_dim, affine=False))
    return nn.Sequential(*layers)


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def to_channels_last(module: nn.Module) -> nn.Module:
    """channels_last memory format: faster convolutions on GPUs with tensor cores (and oneDNN on CPU)."""
    return module.to(memory_format=torch.channels_last)
