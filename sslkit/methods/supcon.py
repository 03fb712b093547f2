"""Supervised contrastive learning (Khosla et al. 2020, https://arxiv.org/abs/2004.11362):
two views and labels through backbone and projector, then a label loss.

SupCon (the default, eq. 2 ``L_out``) or any other loss of kind ``"label"`` from the registry
(triplet, circle, multi-similarity style pair losses): the 2B projected views are the
embeddings and the labels are repeated for the second view, so each image's other view is
one of its positives (SupCon's "multiviewed batch"). With multi-crop's local views, the labels
are repeated for every view: each view's positives are the other views of its image and every
view of its class. Everything but the loss call is
SimCLR's (:class:`~sslkit.methods.simclr.ProjectedViews`).
"""

from __future__ import annotations

import torch

from sslkit import losses
from sslkit.methods.simclr import ProjectedViews


class SupCon(ProjectedViews):
    """``loss(g(f([v1; v2; l1; ...])), [y; y; y; ...])``.

    Shape:
        view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; labels: (B,) int; returns a scalar loss.
    """

    needs_labels = True
    loss_names = tuple(losses.BY_KIND["label"])  # embeddings, labels -> loss
    takes_local_views = True

    def forward(
        self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.loss(self.project(view1, view2, *local_views), labels.repeat(2 + len(local_views)))
