"""ArcFace / AAM-Softmax: an additive angular margin, ``s cos(theta_y + m)``.

References:
    [0] ArcFace, Deng et al. 2019, https://arxiv.org/abs/1801.07698 (eq. 3)
    [1] insightface's reference implementation (the ``th`` / ``mm`` fallback for theta + m > pi)
    [2] Partial FC, An et al. 2022, https://arxiv.org/abs/2203.15565
"""

from __future__ import annotations

import math

import torch

from sslkit.losses._common import as_number, check_flag, check_positive
from sslkit.losses.margin_softmax import MarginSoftmaxHead
from sslkit.losses.partial_fc import partial_fc_repr, sharding_of

# sin(theta) = sqrt(1 - cos^2) has an infinite derivative at cos = +-1; below this the sine is
# held constant, so an embedding exactly on (or opposite) its class weight gets finite gradients.
_SIN_SQUARED_EPS = 1e-12


def arcface_target_logit(cos_target: torch.Tensor, margin: float, easy_margin: bool = False) -> torch.Tensor:
    """``cos(theta + m)`` from ``cos theta`` without ``acos``, with ArcFace's fallbacks.

    ``cos(theta + m) = cos theta cos m - sin theta sin m`` with
    ``sin theta = sqrt(clamp(1 - cos^2 theta, eps))`` (theta in [0, pi], so the sine is >= 0).
    For ``theta + m > pi`` the curve would turn back up and reward moving away from the class;
    there the target is ``cos theta - m sin m`` instead ([1]; pytorch-metric-learning does the
    same), or, with ``easy_margin``, the margin is applied only where ``cos theta > 0``.

    Shape:
        cos_target: (N,); returns (N,).
    """
    easy_margin = check_flag(easy_margin, "easy_margin")
    sin_target = torch.sqrt(torch.clamp(1 - cos_target * cos_target, min=_SIN_SQUARED_EPS))
    cos_plus_m = cos_target * math.cos(margin) - sin_target * math.sin(margin)
    if easy_margin:
        return torch.where(cos_target > 0, cos_plus_m, cos_target)
    # theta < pi - m  <=>  cos theta > cos(pi - m) = -cos m.
    return torch.where(cos_target > -math.cos(margin), cos_plus_m, cos_target - margin * math.sin(margin))


class ArcFaceHead(MarginSoftmaxHead):
    """Additive angular margin loss, eq. 3 of [0] (arXiv 1801.07698)::

        loss_i = -log( exp(s cos(theta_y + m)) / (exp(s cos(theta_y + m)) + sum_{j != y} exp(s cos theta_j)) )

    ``theta_j`` is the angle between the normalised embedding and the normalised class weight
    ``W_j``; see :func:`arcface_target_logit` for how ``cos(theta + m)`` is formed without
    ``acos`` and for ``theta + m > pi``. Defaults ``s = 64, m = 0.5`` are the paper's.
    pytorch-metric-learning's ``ArcFaceLoss`` takes the margin in **degrees** with default 28.6
    (0.4992 rad, not quite 0.5) and ``scale=64``.

    Args:
        embedding_dim: D.
        num_classes: C.
        scale: s > 0.
        margin: m in radians, in [0, pi/2).
        easy_margin: apply the margin only where ``cos theta_y > 0`` instead of the fallback.
        partial_fc: shard the class weights across processes and sample them each step
            (Partial FC, :mod:`sslkit.losses.partial_fc`); the ``state_dict`` still holds all C rows.
        sample_rate: with ``partial_fc``, the share of each process's classes kept per step,
            the batch's own classes always among them (0.1 in [2]'s recipes); 1 is the full head.

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar; ``logits``: (N, C) = s cos.

    >>> head = ArcFaceHead(embedding_dim=16, num_classes=10)
    >>> head(torch.randn(8, 16), torch.randint(0, 10, (8,))).shape
    torch.Size([])
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        scale: float = 64.0,
        margin: float = 0.5,
        easy_margin: bool = False,
        partial_fc: bool = False,
        sample_rate: float = 1.0,
    ) -> None:
        super().__init__(embedding_dim, num_classes, sharding_of(num_classes, partial_fc, sample_rate))
        self.scale = check_positive(scale, "scale")
        margin = as_number(margin, "margin")
        if not 0 <= margin < math.pi / 2:
            raise ValueError(f"margin must be in [0, pi/2) radians, got {margin}")
        self.margin = margin
        self.easy_margin = check_flag(easy_margin, "easy_margin")

    def target_logit(self, cos_target: torch.Tensor) -> torch.Tensor:
        return arcface_target_logit(cos_target, self.margin, self.easy_margin)

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, scale={self.scale}, "
            f"margin={self.margin}, easy_margin={self.easy_margin}" + partial_fc_repr(self.partial_fc)
        )
