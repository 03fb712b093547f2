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
    mean_over_processes,
    pair_masks,
    pairwise_distance,
    upcast,
)
from sslkit.losses.memory import CrossBatchMemory, memory_of, reference_sets
from sslkit.losses.miners import batch_hard_pairs, check_miner, mine, mined_triplets, semi_hard_triplets

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
    miner: str | None = None,
    epsilon: float = 0.1,
    memory: CrossBatchMemory | None = None,
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

    ``mining="hard"`` and ``"semihard"`` run the cores of :mod:`sslkit.losses.miners` on the
    loss's own distance (``"semihard"`` with the loss's margin as FaceNet's window). A ``miner``
    (with ``mining="all"``) instead selects triplets as for every pair loss: a pair miner's
    kept positives with its kept negatives of the same anchor, a triplet miner's triplets
    (``"semi_hard"`` with the window ``epsilon``, on the miners' plain Euclidean distance).
    With ``memory`` (a :class:`~sslkit.losses.memory.CrossBatchMemory`) the batch is enqueued
    and the same loss over triplets whose positive and negative come from the memory is added.

    Cost: every mining builds a (positive pairs, N) matrix, about
    ``n (k - 1) N`` entries for k samples per class.

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar.
    """
    check_embeddings_labels(embeddings, labels)
    margin = check_nonnegative(margin, "margin")
    mining, reduction, miner, epsilon = _check_selection(mining, reduction, miner, epsilon)
    squared_distance = check_flag(squared_distance, "squared_distance")
    normalize = check_flag(normalize, "normalize")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(embeddings.device):
        x = upcast(embeddings)
        if normalize:
            x = F.normalize(x, dim=1)
        total = 0.0
        for references in reference_sets(x, labels, gather_distributed, memory):
            dist = pairwise_distance(x, references.embeddings, squared=squared_distance)  # (n, M)
            anchor, positive, valid = _triplets(x, labels, references, dist, margin, mining, miner, epsilon)
            d_ap = dist[anchor, positive][:, None]  # (P, 1)
            violation = torch.where(valid, d_ap - dist[anchor] + margin, torch.zeros_like(valid, dtype=dist.dtype))
            losses = violation.clamp_min(0.0)  # (P, M)
            count = (losses > 0).sum() if reduction == "mean_nonzero" else valid.sum()
            total = total + mean_over_processes(losses.sum(), count, gather_distributed)
        return total


def _check_selection(mining, reduction, miner, epsilon):
    # Checked in the functional form too: a misspelt mode must not fall through to "all".
    if mining not in MINING:
        raise ValueError(f"mining must be one of {MINING}, got {mining!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    miner, epsilon = check_miner(miner, epsilon)
    if miner is not None and mining != "all":
        raise ValueError(
            f"give mining or miner, not both: mining={mining!r} selects triplets itself, miner={miner!r} "
            f"selects them before (mining='hard' is miner='batch_hard' on the loss's own distance)"
        )
    return mining, reduction, miner, epsilon


def _triplets(x, labels, references, dist, margin, mining, miner, epsilon):
    """The selected triplets as ``(anchor, positive, valid)``: one row per (anchor, positive) pair,
    ``valid[k, j]`` when ``j`` is a negative of that pair's triplets (see :class:`~sslkit.losses.miners.Mined`)."""
    positive, negative = pair_masks(labels, references)
    if mining == "hard":  # the miner's core on the loss's own distance: the same pairs as the miner
        positive, negative = batch_hard_pairs(dist.detach(), positive, negative)
    elif mining == "semihard":  # FaceNet's window is the loss's margin, on its own distance
        return semi_hard_triplets(dist.detach(), positive, negative, margin)
    return mined_triplets(mine(miner, epsilon, x, references, positive, negative))


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
        miner: with ``mining="all"``, which triplets count: ``None`` (every one), ``"multi_similarity"``,
            ``"batch_hard"``, ``"semi_hard"`` or ``"distance_weighted"`` (see :mod:`sslkit.losses.miners`).
        epsilon: the miner's margin: multi-similarity's epsilon, the semi-hard window.
        memory_size: > 0 keeps the embeddings of that many earlier samples as extra references
            (cross-batch memory, see :mod:`sslkit.losses.memory`); 0: the batch only.
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
        miner: str | None = None,
        epsilon: float = 0.1,
        memory_size: int = 0,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.margin = check_nonnegative(margin, "margin")
        self.mining, self.reduction, self.miner, self.epsilon = _check_selection(mining, reduction, miner, epsilon)
        self.squared_distance = check_flag(squared_distance, "squared_distance")
        self.normalize = check_flag(normalize, "normalize")
        self.memory = memory_of(memory_size)
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
            self.miner,
            self.epsilon,
            self.memory,
            self.gather_distributed,
        )

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, mining={self.mining!r}, squared_distance={self.squared_distance}, "
            f"normalize={self.normalize}, reduction={self.reduction!r}, miner={self.miner!r}, "
            f"epsilon={self.epsilon}, gather_distributed={self.gather_distributed}"
        )
