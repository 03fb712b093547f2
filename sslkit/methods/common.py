"""Small pieces the methods share."""

from __future__ import annotations

import torch
from torch import nn


def encode(backbone: nn.Module, images: torch.Tensor, frozen: bool) -> torch.Tensor:
    """Backbone features; with ``frozen`` no gradient reaches the backbone and its BatchNorm keeps its statistics.

    Freezing this way (no graph through the backbone, rather than ``requires_grad_(False)``)
    can be switched on and off between epochs under DDP, and the optimizer skips parameters
    whose gradient is None, so momentum buffers are not touched while frozen.
    """
    if not frozen:
        return backbone(images)
    was_training = backbone.training
    backbone.eval()
    with torch.no_grad():
        features = backbone(images)
    backbone.train(was_training)
    return features
