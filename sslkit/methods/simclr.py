"""SimCLR (Chen et al. 2020, https://arxiv.org/abs/2002.05709): backbone -> MLP projector -> a two-view loss.

Any two-view loss from the registry plugs in (NT-Xent by default; DCL, DCLW, NCE too).
:class:`ProjectedViews` is the part SimCLR shares with :class:`~sslkit.methods.SupCon`.
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit import losses
from sslkit.methods.base import Method
from sslkit.models import build_mlp


class ProjectedViews(Method):
    """Both views through backbone ``f`` and MLP projector ``g`` in one batch of 2B, then the loss.

    One pass is faster than two, and BatchNorm sees both views together, as in SimCLR's
    implementation. A subclass says in ``forward`` how the (2B, D) projections meet its loss.
    """

    min_batch_size = 2  # the negatives are the batch's other images: one image alone gives a loss of exactly 0

    def __init__(self, backbone: nn.Module, projector: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.backbone, self.projector, self.loss = backbone, projector, loss

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> ProjectedViews:
        m = cfg.model
        projector = build_mlp(backbone.feature_dim, m.projector_hidden, m.projector_out, m.projector_layers)
        return cls(backbone, projector, losses.build(cfg.loss.name, **cfg.loss.kwargs))

    def project(self, view1: torch.Tensor, view2: torch.Tensor) -> torch.Tensor:
        """``g(f([v1; v2]))``: (2B, D), the first view's rows first."""
        return self.projector(self.encode(torch.cat([view1, view2])))


class SimCLR(ProjectedViews):
    """``loss(g(f(v1)), g(f(v2)))`` with ``f`` the backbone and ``g`` the projector.

    Shape:
        view1, view2: (B, C, H, W) float; returns a scalar loss.
    """

    loss_names = tuple(losses.BY_KIND["two_view"])  # z1, z2 -> loss

    def forward(self, view1: torch.Tensor, view2: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        z1, z2 = self.project(view1, view2).chunk(2)
        return self.loss(z1, z2)
