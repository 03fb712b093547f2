"""Triplet margin loss with in-batch mining: all triplets, batch-hard, or semi-hard.

References:
    [0] FaceNet, Schroff, Kalenichenko, Philbin 2015, https://arxiv.org/abs/1503.03832
        (triplet loss, Sec. 3; semi-hard negatives, Sec. 3.2)
    [1] In Defense of the Triplet Loss for Person Re-Identification, Hermans, Beyer, Leibe 2017,
        https://arxiv.org/abs/1703.07737 (batch hard, Sec. 2)
    [2] pytorch-metric-learning ``TripletMarginLoss``, ``TripletMarginMiner``, ``BatchHardMiner``,
        https://kevinmusgrave.github.io/pytorch-metric-learning/losses/#tripletmarginloss
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.losses._common import (
    check_embeddings_labels,
    check_flag,
    check_nonnegative,
    full_precision,
    gather_labelled,
    mean_over_processes,
    pairwise_distance,
    upcast,
)

MINING = ("all", "hard", "semihard")
REDUCTIONS = ("mean", "mean_nonzero")


def triplet_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    margin: float = 0.2,
    mining: str = "all",
    squared_distance: bool = True,
    normalize: bool = True,
    reduction: str = "mean",
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Triplet loss over triplets mined from a labelled batch.

    For an anchor ``a``, a positive ``p != a`` with its label and a negative ``n`` with
    another label ([0], Sec. 3)::

        l(a, p, n) = max(0, d(a, p) - d(a, n) + m)

    ``d`` is the squared Euclidean distance (FaceNet's choice, ``squared_distance=True``) or
    the plain one (Hermans et al.'s choice for batch-hard, [1]) between L2-normalised
    embeddings (``normalize``, FaceNet's unit hypersphere). Which triplets count:

    - ``"all"``: every valid ``(a, p, n)`` of the batch. FaceNet's loss is the sum over all
      triplets; ``reduction="mean"`` divides by their number.
    - ``"hard"`` (batch hard, [1]): one triplet per anchor, its farthest positive and its
      closest negative: ``max(0, max_p d(a, p) - min_n d(a, n) + m)``.
    - ``"semihard"`` ([0], Sec. 3.2): for each pair ``(a, p)``, every negative with
      ``d(a, p) < d(a, n) < d(a, p) + m`` (farther than the positive but inside the margin).

    ``reduction="mean"`` averages over the selected triplets (the paper's form);
    ``"mean_nonzero"`` averages over those with a non-zero loss only, which is
    pytorch-metric-learning's default ``AvgNonZeroReducer`` [2] (it keeps the loss from
    shrinking as more triplets are satisfied). Anchors without a positive or without a
    negative give no triplet; with no triplet at all the loss is 0, not NaN.

    Differences from peers: pytorch-metric-learning's ``TripletMarginLoss`` defaults to
    non-squared distances, ``margin=0.05`` and the non-zero mean; its "semihard"
    ``TripletMarginMiner`` selects the same triplets as here and its ``BatchHardMiner`` the
    same as ``"hard"`` (tests compare all three). TensorFlow Addons' ``TripletSemiHardLoss``
    differs: it keeps one negative per ``(a, p)``, the closest semi-hard one, and falls back
    to the farthest negative when none is farther than the positive.

    Memory: ``"all"`` and ``"semihard"`` build a (positive pairs, N) matrix, about
    ``n (k - 1) N`` entries for k samples per class.

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar.
    """
    check_embeddings_labels(embeddings, labels)
    margin = check_nonnegative(margin, "margin")
    # Checked here too: a misspelt mode must not fall through to "all".
    if mining not in MINING:
        raise ValueError(f"mining must be one of {MINING}, got {mining!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    squared_distance = check_flag(squared_distance, "squared_distance")
    normalize = check_flag(normalize, "normalize")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(embeddings.device):
        x = upcast(embeddings)
        if normalize:
            x = F.normalize(x, dim=1)
        candidates, candidate_labels, offset = gather_labelled(x, labels, gather_distributed)
        n = x.shape[0]
        dist = pairwise_distance(x, candidates, squared=squared_distance)  # (n, N)
        same = labels[:, None] == candidate_labels[None, :]  # (n, N)
        local = torch.arange(n, device=x.device)
        positive = same.clone()
        positive[local, local + offset] = False  # an anchor is not its own positive
        negative = ~same

        if mining == "hard":
            valid = positive.any(dim=1) & negative.any(dim=1)  # (n,)
            # +-inf fills are safe: rows without a positive or negative are dropped by `valid`,
            # and max/min send gradient only to the selected (real) entry of the others.
            hardest_positive = dist.masked_fill(~positive, float("-inf")).max(dim=1).values  # (n,)
            hardest_negative = dist.masked_fill(~negative, float("inf")).min(dim=1).values  # (n,)
            violation = torch.where(valid, hardest_positive - hardest_negative + margin, torch.zeros_like(dist[:, 0]))
        else:
            # One row per (anchor, positive) pair instead of an (n, N, N) cube.
            anchor_idx, positive_idx = positive.nonzero(as_tuple=True)  # (P,), (P,)
            d_ap = dist[anchor_idx, positive_idx][:, None]  # (P, 1)
            d_an = dist[anchor_idx]  # (P, N)
            valid = negative[anchor_idx]  # (P, N)
            if mining == "semihard":
                valid = valid & (d_an > d_ap) & (d_an < d_ap + margin)
            violation = torch.where(valid, d_ap - d_an + margin, torch.zeros_like(d_an))

        losses = violation.clamp_min(0.0)
        count = (losses > 0).sum() if reduction == "mean_nonzero" else valid.sum()
        return mean_over_processes(losses.sum(), count, gather_distributed)


class TripletLoss(nn.Module):
    """FaceNet's triplet margin loss [0] with all, batch-hard [1] or semi-hard [0] mining.

    See :func:`triplet_loss` for the formula, the triplet sets and the reductions.

    Args:
        margin: m >= 0 by which a negative must be farther than the positive. 0.2 is FaceNet's
            value for squared distances on unit vectors (``[0]``, Sec. 3); Hermans et al. [1]
            use non-squared distances (``squared_distance=False``) with margins 0.1 to 1.
        mining: ``"all"``, ``"hard"`` (batch hard) or ``"semihard"``.
        squared_distance: squared Euclidean distance (FaceNet) or plain Euclidean (Hermans,
            pytorch-metric-learning's default).
        normalize: L2-normalise the embeddings first.
        reduction: ``"mean"`` over the selected triplets, or ``"mean_nonzero"`` over those with a
            non-zero loss (pytorch-metric-learning's default).
        gather_distributed: across processes, local anchors take positives and negatives from
            every process's batch (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = TripletLoss(margin=0.2, mining="hard")
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(
        self,
        margin: float = 0.2,
        mining: str = "all",
        squared_distance: bool = True,
        normalize: bool = True,
        reduction: str = "mean",
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.margin = check_nonnegative(margin, "margin")
        if mining not in MINING:
            raise ValueError(f"mining must be one of {MINING}, got {mining!r}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.mining = mining
        self.squared_distance = check_flag(squared_distance, "squared_distance")
        self.normalize = check_flag(normalize, "normalize")
        self.reduction = reduction
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return triplet_loss(
            embeddings,
            labels,
            self.margin,
            self.mining,
            self.squared_distance,
            self.normalize,
            self.reduction,
            self.gather_distributed,
        )

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, mining={self.mining!r}, squared_distance={self.squared_distance}, "
            f"normalize={self.normalize}, reduction={self.reduction!r}, gather_distributed={self.gather_distributed}"
        )
