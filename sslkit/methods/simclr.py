"""SimCLR (Chen et al. 2020, https://arxiv.org/abs/2002.05709): backbone -> MLP projector -> a two-view loss.

Any two-view loss from the registry plugs in (NT-Xent by default; DCL, DCLW, NCE too). With
multi-crop's local views (``augment.local_views``), NT-Xent over every view
(:func:`~sslkit.losses.ntxent.multi_view_ntxent_loss`).
:class:`ProjectedViews` is the part SimCLR shares with :class:`~sslkit.methods.SupCon`.
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit import losses
from sslkit.errors import UserError
from sslkit.methods.base import Method
from sslkit.models import build_mlp


class ProjectedViews(Method):
    """Both views through backbone ``f`` and MLP projector ``g`` in one batch of 2B, then the loss.

    One pass is faster than two, and BatchNorm sees both views together, as in SimCLR's
    implementation. Local views (multi-crop) go through the backbone in a second batch, since
    they are smaller, and the projector sees every view's features in one batch (as DINO's
    multi-crop wrapper). The loss takes the views' projections, ``loss(z1, z2)``, or with local
    views its multi-view form, ``loss.multi_view(z1, z2, l1, ...)``; a subclass whose loss takes
    them otherwise (SupCon's labels) says so in its own ``forward``.
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

    def project(self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor) -> torch.Tensor:
        """``g([f([v1; v2]); f([l1; ...])])``: (VB, D), view by view, the first view's rows first."""
        return self.projector(self.encode_views(view1, view2, *local_views))

    def forward(
        self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        z = self.project(view1, view2, *local_views).chunk(2 + len(local_views))
        if local_views:
            return self.loss.multi_view(*z)
        return self.loss(*z)


class SimCLR(ProjectedViews):
    """``loss(g(f(v1)), g(f(v2)))`` with ``f`` the backbone and ``g`` the projector.

    With local views (multi-crop, NT-Xent only): ``NTXentLoss.multi_view`` of every view's
    projection, each view against every other; for two views this is the two-view loss exactly.

    Shape:
        view1, view2: (B, C, H, W) float; local_views: (B, C, L, L) each; returns a scalar loss.
    """

    loss_names = tuple(losses.BY_KIND["two_view"])  # z1, z2 -> loss
    takes_local_views = True

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        if cfg.augment.local_views and cfg.loss.name != "ntxent":
            raise UserError(
                f"{source}: method 'simclr' with local views (augment.local_views={cfg.augment.local_views}) "
                f"contrasts every view with every other by NT-Xent: set loss.name=ntxent, got '{cfg.loss.name}'"
            )
