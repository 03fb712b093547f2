"""SimCLR (Chen et al. 2020, https://arxiv.org/abs/2002.05709): backbone -> MLP projector -> a two-view loss.

Any two-view loss from the registry plugs in (NT-Xent by default; DCL, DCLW, NCE too).
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit import losses
from sslkit.methods.common import encode
from sslkit.models import build_mlp


class SimCLR(nn.Module):
    """``loss(g(f(v1)), g(f(v2)))`` with ``f`` the backbone and ``g`` the projector.

    Both views go through the backbone in one batch of 2B: one pass is faster than two, and
    BatchNorm sees both views together, as in SimCLR's implementation.

    Shape:
        view1, view2: (B, C, H, W) float; returns a scalar loss.
    """

    needs_labels = False
    loss_names = tuple(name for name, kind in losses.KIND.items() if kind == "two_view")  # z1, z2 -> loss
    min_batch_size = 2  # the negatives are the batch's other images: one image alone gives a loss of exactly 0

    def __init__(self, backbone: nn.Module, projector: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector
        self.loss = loss
        self.backbone_frozen = False

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int) -> "SimCLR":
        m = cfg.model
        projector = build_mlp(backbone.feature_dim, m.projector_hidden, m.projector_out, m.projector_layers)
        return cls(backbone, projector, losses.build(cfg.loss.name, **cfg.loss.kwargs))

    def forward(self, view1: torch.Tensor, view2: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        z = self.projector(encode(self.backbone, torch.cat([view1, view2]), self.backbone_frozen))  # (2B, D)
        z1, z2 = z.chunk(2)
        return self.loss(z1, z2)
