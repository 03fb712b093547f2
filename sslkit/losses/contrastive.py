"""Contrastive loss over every pair of the batch (Hadsell, Chopra, LeCun).

References:
    [0] Dimensionality Reduction by Learning an Invariant Mapping, Hadsell, Chopra, LeCun 2006,
        http://yann.lecun.com/exdb/publis/pdf/hadsell-chopra-lecun-06.pdf (eq. 4; no arXiv version)
    [1] pytorch-metric-learning ``ContrastiveLoss``,
        https://kevinmusgrave.github.io/pytorch-metric-learning/losses/#contrastiveloss
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
from sslkit.losses.miners import check_miner, mine


def _check_margins(pos_margin: float, neg_margin: float) -> tuple[float, float]:
    pos_margin, neg_margin = check_nonnegative(pos_margin, "pos_margin"), check_nonnegative(neg_margin, "neg_margin")
    if not neg_margin > pos_margin:
        raise ValueError(
            f"neg_margin must be greater than pos_margin (different-label pairs are pushed beyond "
            f"neg_margin, same-label pairs pulled within pos_margin), got neg_margin={neg_margin}, "
            f"pos_margin={pos_margin}"
        )
    return pos_margin, neg_margin


def contrastive_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    pos_margin: float = 0.0,
    neg_margin: float = 1.0,
    squared: bool = True,
    normalize: bool = True,
    miner: str | None = None,
    epsilon: float = 0.1,
    memory: CrossBatchMemory | None = None,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Contrastive loss averaged over every ordered pair ``(i, j)``, ``i != j``, of the batch.

    With ``y_ij = 1`` when ``i`` and ``j`` share a label, ``d_ij = ||x_i - x_j||_2`` and
    ``squared=True`` ([0], eq. 4, without its factor 1/2, which only rescales the loss)::

        l_ij = y_ij max(0, d_ij - m_pos)^2 + (1 - y_ij) max(0, m_neg - d_ij)^2
        loss = 1 / (N (N - 1)) sum_{i != j} l_ij

    ``m_pos = 0`` is the paper's form (``y d^2``). ``squared=False`` drops the squares, which is
    pytorch-metric-learning's form [1]. Each unordered pair appears twice with the same term,
    so this is also the mean over unordered pairs. Every pair counts, including those already
    beyond the margin (they add 0): that is the paper's sum over pairs. pytorch-metric-learning
    instead averages by default over the *non-zero* positive terms and, separately, over the
    non-zero negative terms, then adds the two; with ``reducer=SumReducer()`` its sum divided
    by ``N (N - 1)`` is this loss.

    ``x`` is L2-normalised first when ``normalize`` (so ``d`` lies in [0, 2] and ``m_neg = 1``
    is a meaningful default); the paper uses raw outputs. Across processes each process
    takes its local samples as ``i`` and every process's samples as ``j``.

    With a ``miner`` the mean runs over the pairs it keeps (see :mod:`sslkit.losses.miners`);
    with ``memory`` (a :class:`~sslkit.losses.memory.CrossBatchMemory`) the batch is enqueued
    and the same loss of the samples against the memory is added (``j`` over the memory).

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar (0 for a batch of one sample).
    """
    check_embeddings_labels(embeddings, labels)
    pos_margin, neg_margin = _check_margins(pos_margin, neg_margin)
    squared, normalize = check_flag(squared, "squared"), check_flag(normalize, "normalize")
    miner, epsilon = check_miner(miner, epsilon)
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(embeddings.device):
        x = upcast(embeddings)
        if normalize:
            x = F.normalize(x, dim=1)
        total = 0.0
        for references in reference_sets(x, labels, gather_distributed, memory):
            positive, negative = pair_masks(labels, references)
            mined = mine(miner, epsilon, x, references, positive, negative)
            dist = pairwise_distance(x, references.embeddings)  # (n, M)
            pos = (dist - pos_margin).clamp_min(0.0)
            neg = (neg_margin - dist).clamp_min(0.0)
            if squared:
                pos, neg = pos.square(), neg.square()
            # where, not multiply: a pair left out (the self-distance among them) must give no gradient.
            per_pair = torch.where(mined.positive, pos, torch.where(mined.negative, neg, torch.zeros_like(neg)))
            count = mined.positive.sum() + mined.negative.sum()
            total = total + mean_over_processes(per_pair.sum(), count, gather_distributed)
        return total


class ContrastiveLoss(nn.Module):
    """Contrastive loss of Hadsell, Chopra and LeCun [0] over all pairs of a labelled batch.

    Pulls same-label pairs within ``pos_margin`` of each other and pushes different-label
    pairs at least ``neg_margin`` apart; see :func:`contrastive_loss` for the exact form and
    the reduction (mean over all ordered pairs).

    Args:
        pos_margin: m_pos >= 0; same-label pairs closer than this cost nothing (paper: 0).
        neg_margin: m_neg > pos_margin; different-label pairs farther than this cost nothing.
            1.0 on L2-normalised embeddings (distances in [0, 2]), as pytorch-metric-learning.
        squared: square each pair's term (the paper's eq. 4). ``False`` gives
            pytorch-metric-learning's unsquared ``ContrastiveLoss``.
        normalize: L2-normalise the embeddings before measuring distances.
        miner: which pairs count: ``None`` (every pair), ``"multi_similarity"``, ``"batch_hard"``,
            ``"semi_hard"`` or ``"distance_weighted"`` (see :mod:`sslkit.losses.miners`).
        epsilon: the miner's margin: multi-similarity's epsilon, the semi-hard window.
        memory_size: > 0 keeps the embeddings of that many earlier samples as extra references
            (cross-batch memory, see :mod:`sslkit.losses.memory`); 0: the batch only.
        gather_distributed: across processes, compare local samples with every process's
            samples (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = ContrastiveLoss(neg_margin=1.0)
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(
        self,
        pos_margin: float = 0.0,
        neg_margin: float = 1.0,
        squared: bool = True,
        normalize: bool = True,
        miner: str | None = None,
        epsilon: float = 0.1,
        memory_size: int = 0,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.pos_margin, self.neg_margin = _check_margins(pos_margin, neg_margin)
        self.squared = check_flag(squared, "squared")
        self.normalize = check_flag(normalize, "normalize")
        self.miner, self.epsilon = check_miner(miner, epsilon)
        self.memory = memory_of(memory_size)
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return contrastive_loss(
            embeddings,
            labels,
            self.pos_margin,
            self.neg_margin,
            self.squared,
            self.normalize,
            self.miner,
            self.epsilon,
            self.memory,
            self.gather_distributed,
        )

    def extra_repr(self) -> str:
        return (
            f"pos_margin={self.pos_margin}, neg_margin={self.neg_margin}, squared={self.squared}, "
            f"normalize={self.normalize}, miner={self.miner!r}, epsilon={self.epsilon}, "
            f"gather_distributed={self.gather_distributed}"
        )
