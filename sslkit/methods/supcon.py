"""Supervised contrastive learning (Khosla et al. 2020, https://arxiv.org/abs/2004.11362):
two views and labels through backbone and projector, then a label loss.

SupCon (the default, eq. 2 ``L_out``) or any other loss of kind ``"label"`` from the registry
(triplet, circle, multi-similarity style pair losses): the 2B projected views are the
embeddings and the labels are repeated for the second view, so each image's other view is
one of its positives (SupCon's "multiviewed batch").
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit import losses
from sslkit.methods.common import encode
from sslkit.models import build_mlp


class SupCon(nn.Module):
    """``loss(g(f([v1; v2])), [y; y])``.

    Shape:
        view1, view2: (B, C, H, W); labels: (B,) int; returns a scalar loss.
    """

    needs_labels = True
    loss_names = tuple(name for name, kind in losses.KIND.items() if kind == "label")  # embeddings, labels -> loss
    min_batch_size = 2  # every other sample of the batch is a candidate: one image alone leaves none

    def __init__(self, backbone: nn.Module, projector: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.backbone, self.projector, self.loss = backbone, projector, loss
        self.backbone_frozen = False

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int) -> "SupCon":
        m = cfg.model
        projector = build_mlp(backbone.feature_dim, m.projector_hidden, m.projector_out, m.projector_layers)
        return cls(backbone, projector, losses.build(cfg.loss.name, **cfg.loss.kwargs))

    def forward(self, view1: torch.Tensor, view2: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        z = self.projector(encode(self.backbone, torch.cat([view1, view2]), self.backbone_frozen))  # (2B, D)
        return self.loss(z, torch.cat([labels, labels]))
