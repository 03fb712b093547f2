"""BYOL (Grill et al. 2020): an online network predicts the projection of its momentum target.

References:
    [0] BYOL, Grill et al. 2020, https://arxiv.org/abs/2006.07733 (section 3.1, appendix B and J)
    [1] solo-learn's CIFAR recipe, scripts/pretrain/cifar/byol.yaml in https://github.com/vturrisi/solo-learn
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from sslkit import losses
from sslkit.errors import UserError
from sslkit.methods.momentum import MomentumMethod, MomentumOptions, check_momentum_options
from sslkit.models import build_mlp


@dataclasses.dataclass
class BYOLOptions(MomentumOptions):
    """BYOL's options.

    Attributes:
        momentum: The target network's EMA momentum ``tau`` at the start; it follows a cosine from ``momentum`` to
            ``momentum_final`` over training (BYOL: 0.996 -> 1).
        momentum_final: The EMA momentum at the end; set it equal to ``momentum`` for a constant one.
        predictor_hidden: Hidden width of the 2-layer predictor (BYOL: 4096, output the projection's size).
    """

    momentum: float = 0.996
    momentum_final: float = 1.0
    predictor_hidden: int = 4096


class BYOL(MomentumMethod):
    """BYOL [0]: ``L(q1, z'2) + L(q2, z'1)``, the normalised MSE of :class:`~sslkit.losses.BYOLLoss`.

    Online prediction ``q = h(g(f(x)))`` (backbone ``f``, projector ``g``, predictor ``h``);
    target projection ``z' = g_m(f_m(x))`` from momentum copies of ``f`` and ``g``, without
    gradient (the stop-gradient of [0], figure 2). After every optimizer step the target moves
    towards the online network, ``xi <- tau xi + (1 - tau) theta`` with ``tau`` on a cosine from
    ``momentum`` to ``momentum_final`` (section 3.1), as MoCo v3's key encoder does.

    Heads as [0], appendix J: projector and predictor are 2-layer MLPs (Linear, BatchNorm, ReLU,
    Linear), 4096 wide with a 256-d output at ImageNet scale (``model.projector_*``,
    ``method.predictor_hidden``). Both views go through each network in one batch (faster
    than one pass per view; BatchNorm then pools the two views' statistics, as in
    :class:`~sslkit.methods.SimCLR`). Each image's term needs only its own prediction and
    target, so nothing is gathered across processes.

    Multi-crop (``augment.local_views``): the target network sees the two global views only, the
    online network every view (the local views through the backbone in a batch of their own,
    :meth:`~sslkit.methods.base.Method.encode_views`), and the prediction of every view meets the
    target of each global view but its own: :func:`~sslkit.losses.byol.multi_view_byol_loss`, the
    mean over those pairs, which for two views is the loss above.

    Shape:
        view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; returns a scalar loss.
    """

    loss_names = ("byol",)
    takes_local_views = True
    min_batch_size = 2  # BatchNorm in the projector and predictor: one image has no batch statistics
    min_batch_reason = "normalises its projector's and predictor's features by BatchNorm over the batch"
    Options = BYOLOptions

    def __init__(
        self,
        backbone: nn.Module,
        projector: nn.Module,
        predictor: nn.Module,
        loss: nn.Module | None = None,
        momentum: float = 0.996,
        momentum_final: float = 1.0,
    ) -> None:
        super().__init__()
        self.backbone, self.projector, self.predictor = backbone, projector, predictor
        self.copy_momentum_encoder(momentum, momentum_final)
        self.loss = loss if loss is not None else losses.BYOLLoss()

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        m = cls.options_of(cfg)
        check_momentum_options(m, source)
        if m.predictor_hidden < 1:
            raise UserError(f"{source}: method.predictor_hidden must be >= 1, got {m.predictor_hidden} (BYOL: 4096)")

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> BYOL:
        m, model = cls.options_of(cfg), cfg.model
        hidden, out = model.projector_hidden, model.projector_out
        projector = build_mlp(backbone.feature_dim, hidden, out, model.projector_layers)
        predictor = build_mlp(out, m.predictor_hidden, out, 2)
        loss = losses.build(cfg.loss.name, **cfg.loss.kwargs)
        return cls(backbone, projector, predictor, loss, m.momentum, m.momentum_final)

    def forward(
        self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        queries = self.predictor(
            self.projector(self.encode_views(view1, view2, *local_views))
        )  # (VB, D): [q1; q2; ...]
        keys = self.momentum_encode(torch.cat([view1, view2]))  # (2B, D): the global views' targets only
        if local_views:
            return self.loss.multi_view(queries, keys)
        return self.loss(queries, keys)  # the loss pairs q1 with z'2 and q2 with z'1
