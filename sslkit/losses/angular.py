"""Angular loss: bound the angle at the negative of each triplet triangle.

References:
    [0] Deep Metric Learning with Angular Loss, Wang, Zhou, Wen, Liu, Lin 2017,
        https://arxiv.org/abs/1708.01682 (triplet form and the smooth batch form, eq. 8)
    [1] pytorch-metric-learning ``AngularLoss``,
        https://kevinmusgrave.github.io/pytorch-metric-learning/losses/#angularloss
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.losses._common import (
    as_number,
    check_embeddings_labels,
    check_flag,
    full_precision,
    gather_labelled,
    mean_over_processes,
    upcast,
)


def _check_alpha_degrees(alpha_degrees: float) -> float:
    alpha_degrees = as_number(alpha_degrees, "alpha_degrees")
    if not 0 < alpha_degrees < 90:
        raise ValueError(f"alpha_degrees must be in (0, 90) degrees, got {alpha_degrees}")
    return alpha_degrees


def angular_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    alpha_degrees: float = 40.0,
    smooth: bool = True,
    normalize: bool = True,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Angular loss of Wang et al. [0], smooth batch form (default) or triplet hinge form.

    With ``x_c = (x_a + x_p) / 2`` the centre of an anchor-positive pair and
    ``t = tan^2(alpha)``, the triplet form (``smooth=False``) is::

        l(a, p, n) = max(0, ||x_a - x_p||^2 - 4 t ||x_n - x_c||^2)
        loss = mean over all triplets (a, p, n): y_p = y_a, p != a, y_n != y_a

    The smooth form ([0], eq. 8; ``smooth=True``) applies, for unit vectors, the log-sum-exp
    bound of the N-pair loss to the same quantity with its constant dropped::

        f(a, p, n) = 4 t (x_a + x_p) . x_n - 2 (1 + t) x_a . x_p
        l(a, p) = log(1 + sum_{n: y_n != y_a} exp(f(a, p, n)))
        loss = mean over all ordered positive pairs (a, p), p != a

    (For unit vectors ``||x_a - x_p||^2 - 4t ||x_n - x_c||^2 = f(a, p, n) + 2 - 6t``.) The paper
    builds its batches as N-pair batches, one positive pair per class; on a general labelled
    batch every ordered positive pair is an ``(a, p)``, which is pytorch-metric-learning's
    reading [1]. A pair whose anchor has no negative adds ``log(1) = 0`` (smooth) or no
    triplet (hinge); a batch without positive pairs gives 0.

    Embeddings are L2-normalised first when ``normalize`` (the smooth form's derivation assumes
    it). pytorch-metric-learning's ``AngularLoss`` matches the smooth form with the same mean
    over positive pairs (its non-zero mean differs only for terms that underflow to 0), but it
    normalises only the anchors and positives, not the negatives. On L2-normalised input the
    values agree, and so do the gradients along the sphere (theirs keeps a radial part from
    the unnormalised negatives); the tests compare them there.

    Memory: a (positive pairs, N) matrix, about ``n (k - 1) N`` entries for k samples per class.

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar.
    """
    check_embeddings_labels(embeddings, labels)
    alpha_degrees = _check_alpha_degrees(alpha_degrees)
    smooth, normalize = check_flag(smooth, "smooth"), check_flag(normalize, "normalize")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    t = math.tan(math.radians(alpha_degrees)) ** 2
    with full_precision(embeddings.device):
        x = upcast(embeddings)
        if normalize:
            x = F.normalize(x, dim=1)
        candidates, candidate_labels, offset = gather_labelled(x, labels, gather_distributed)
        n = x.shape[0]
        same = labels[:, None] == candidate_labels[None, :]  # (n, N)
        positive = same.clone()
        local = torch.arange(n, device=x.device)
        positive[local, local + offset] = False
        negative = ~same

        anchor_idx, positive_idx = positive.nonzero(as_tuple=True)  # (P,), (P,): one row per pair
        anchors, positives = x[anchor_idx], candidates[positive_idx]  # (P, D)
        negative_rows = negative[anchor_idx]  # (P, N)
        # (x_a + x_p) . x_n for every candidate n, as one matmul.
        centre_dot = (anchors + positives) @ candidates.T  # (P, N)
        ap_dot = (anchors * positives).sum(dim=1, keepdim=True)  # (P, 1)
        if smooth:
            f = 4 * t * centre_dot - 2 * (1 + t) * ap_dot  # (P, N)
            f = f.masked_fill(~negative_rows, float("-inf"))
            # The appended 0 is the "1 +" inside the log; it also keeps each row's logsumexp
            # finite when the anchor has no negative.
            f = torch.cat([f, torch.zeros_like(ap_dot)], dim=1)  # (P, N + 1)
            return mean_over_processes(f.logsumexp(dim=1).sum(), positive.sum(), gather_distributed)

        # ||x_a - x_p||^2 and ||x_n - x_c||^2 = |x_n|^2 - (x_a + x_p).x_n + |x_a + x_p|^2 / 4.
        ap_sq_dist = (anchors - positives).square().sum(dim=1, keepdim=True)  # (P, 1)
        centre_sq_norm = (anchors + positives).square().sum(dim=1, keepdim=True) / 4  # (P, 1)
        nc_sq_dist = candidates.square().sum(dim=1) - centre_dot + centre_sq_norm  # (P, N)
        hinge = (ap_sq_dist - 4 * t * nc_sq_dist).clamp_min(0.0)
        total = torch.where(negative_rows, hinge, torch.zeros_like(hinge)).sum()
        return mean_over_processes(total, negative_rows.sum(), gather_distributed)


class AngularLoss(nn.Module):
    """Angular loss of Wang et al. [0]: the angle at the negative of each triangle is at most alpha.

    See :func:`angular_loss` for both forms and the reduction.

    Args:
        alpha_degrees: the angle bound alpha in degrees, 0 < alpha < 90 (``tan^2`` grows without
            bound at 90). 40 is pytorch-metric-learning's default.
        smooth: the smooth batch form (eq. 8 of [0], pytorch-metric-learning's). ``False``: the
            triplet hinge form averaged over all triplets.
        normalize: L2-normalise the embeddings first.
        gather_distributed: across processes, local anchors take positives and negatives from
            every process's batch (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = AngularLoss(alpha_degrees=40)
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(
        self,
        alpha_degrees: float = 40.0,
        smooth: bool = True,
        normalize: bool = True,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.alpha_degrees = _check_alpha_degrees(alpha_degrees)
        self.smooth = check_flag(smooth, "smooth")
        self.normalize = check_flag(normalize, "normalize")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return angular_loss(
            embeddings, labels, self.alpha_degrees, self.smooth, self.normalize, self.gather_distributed
        )

    def extra_repr(self) -> str:
        return (
            f"alpha_degrees={self.alpha_degrees}, smooth={self.smooth}, normalize={self.normalize}, "
            f"gather_distributed={self.gather_distributed}"
        )
