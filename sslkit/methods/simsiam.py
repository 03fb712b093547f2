"""SimSiam (Chen and He 2020): a predictor and a stop-gradient, no momentum encoder.

References:
    [0] SimSiam, Chen and He 2020, https://arxiv.org/abs/2011.10566 (Algorithm 1, section 4 and appendix D)
    [1] The authors' code, https://github.com/facebookresearch/simsiam (simsiam/builder.py)
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from sslkit import losses
from sslkit.errors import UserError
from sslkit.methods.base import Method
from sslkit.models import build_mlp


@dataclasses.dataclass
class SimSiamOptions:
    """SimSiam's options.

    Attributes:
        predictor_hidden: Hidden width of the 2-layer predictor, a bottleneck (SimSiam: 512 for a 2048-d
            projection, section 4.4).
    """

    predictor_hidden: int = 512


class SimSiam(Method):
    """SimSiam [0]: ``D(p1, stopgrad(z2)) / 2 + D(p2, stopgrad(z1)) / 2`` with ``D`` the negative cosine.

    Projection ``z = g(f(x))`` (backbone ``f``, projector ``g``), prediction ``p = h(z)``; the
    same encoder gives both, and :class:`~sslkit.losses.SimSiamLoss` stops the gradient through
    ``z`` (without it SimSiam collapses, [0] section 4.1). No momentum encoder and no negatives.

    Heads as [1]: the projector has an affine-free BatchNorm after its last layer
    (``model.projector_layers``; 3 in [0], 2048 wide), the predictor is 2 layers with a
    ``predictor_hidden`` bottleneck and no BatchNorm at its output. Both views go through the
    encoder in one batch, as in :class:`~sslkit.methods.SimCLR`.

    Multi-crop (``augment.local_views``): every view is predicted (the local views through the
    backbone in a batch of their own, :meth:`~sslkit.methods.base.Method.encode_views`), the
    targets are the stopped projections of the two global views only, and the prediction of every
    view meets the target of each global view but its own:
    :func:`~sslkit.losses.simsiam.multi_view_simsiam_loss`, the mean over those pairs, which for
    two views is the loss above.

    Shape:
        view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; returns a scalar loss.
    """

    loss_names = ("simsiam",)
    takes_local_views = True
    min_batch_size = 2  # BatchNorm in the projector and predictor: one image has no batch statistics
    min_batch_reason = "normalises its projector's and predictor's features by BatchNorm over the batch"
    Options = SimSiamOptions

    def __init__(self, backbone: nn.Module, projector: nn.Module, predictor: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.backbone, self.projector, self.predictor, self.loss = backbone, projector, predictor, loss

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        hidden = cls.options_of(cfg).predictor_hidden
        if hidden < 1:
            raise UserError(f"{source}: method.predictor_hidden must be >= 1, got {hidden} (SimSiam: 512)")

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> SimSiam:
        m, model = cls.options_of(cfg), cfg.model
        projector = build_mlp(
            backbone.feature_dim, model.projector_hidden, model.projector_out, model.projector_layers, True
        )
        predictor = build_mlp(model.projector_out, m.predictor_hidden, model.projector_out, 2)
        return cls(backbone, projector, predictor, losses.build(cfg.loss.name, **cfg.loss.kwargs))

    def forward(
        self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        projections = self.projector(self.encode_views(view1, view2, *local_views))  # (VB, D): [z1; z2; ...]
        predictions = self.predictor(projections)
        if local_views:  # the targets: the global views' projections, [z1; z2]
            return self.loss.multi_view(predictions, projections[: 2 * view1.shape[0]])
        return self.loss(predictions, projections)  # the loss detaches the projections
