"""Lifted structured loss: each positive pair against every negative of either of its ends.

References:
    [0] Deep Metric Learning via Lifted Structured Feature Embedding, Song, Xiang, Jegelka,
        Savarese 2016, https://arxiv.org/abs/1511.06452 (eq. 4)
    [1] pytorch-metric-learning ``LiftedStructureLoss``,
        https://kevinmusgrave.github.io/pytorch-metric-learning/losses/#liftedstructureloss
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import distributed
from sslkit.losses._common import (
    References,
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

# Reference rows per block when the memory's own negative sums are computed: a (1024, M) temporary.
_MEMORY_ROWS = 1024


def _negative_lse(dist: torch.Tensor, negative: torch.Tensor, margin: float) -> torch.Tensor:
    """``log sum_{k in neg(i)} exp(m - d_ik)`` per row; the most negative finite number for a row without negatives.

    That number stands for log(0): a logsumexp over only -inf has a NaN gradient, and so does
    ``logaddexp(-inf, -inf)``; this gives J far below 0, so the hinge is 0 with a zero gradient.

    Shape:
        dist, negative: (n, M); returns (n,).
    """
    has_negative = negative.any(dim=1, keepdim=True)  # (n, 1)
    logits = (margin - dist).masked_fill(~negative, float("-inf"))  # (n, M)
    logits = torch.where(has_negative, logits, torch.zeros_like(logits))  # finite rows, overwritten below
    log_zero = torch.finfo(dist.dtype).min
    return torch.where(has_negative[:, 0], logits.logsumexp(dim=1), dist.new_full(has_negative[:, 0].shape, log_zero))


@torch.no_grad()
def _memory_negative_lse(references: References, margin: float) -> torch.Tensor:
    """``log sum_{l in neg(j)} exp(m - d_jl)`` of every memory entry ``j`` over the memory, in row blocks.

    Shape:
        returns (M,), detached.
    """
    memory, memory_labels = references.embeddings, references.labels
    sums = []
    for start in range(0, memory.shape[0], _MEMORY_ROWS):
        rows = slice(start, start + _MEMORY_ROWS)
        negative = memory_labels[rows, None] != memory_labels[None, :]  # (rows, M)
        sums.append(_negative_lse(pairwise_distance(memory[rows], memory), negative, margin))
    return torch.cat(sums)


def lifted_structure_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    margin: float = 1.0,
    normalize: bool = True,
    miner: str | None = None,
    epsilon: float = 0.1,
    memory: CrossBatchMemory | None = None,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Smooth lifted structured loss, eq. 4 of [0].

    For the set P of positive pairs ``(i, j)`` (same label, ``i != j``), with
    ``d`` the (non-squared) Euclidean distance and ``neg(i)`` the samples whose label differs
    from ``i``'s::

        J_ij = log( sum_{k in neg(i)} exp(m - d_ik) + sum_{l in neg(j)} exp(m - d_jl) ) + d_ij
        loss = 1 / (2 |P|) sum_{(i, j) in P} max(0, J_ij)^2

    The log of the sum is a logsumexp of the two per-sample logsumexps, so nothing is
    exponentiated directly. ``J_ij`` is symmetric, so reading P as ordered or unordered pairs
    gives the same loss; here it holds ordered pairs. A pair whose two ends have no negative
    at all (a batch of one class) has ``J_ij = -inf`` and adds 0; a batch without positive
    pairs gives 0.

    Embeddings are L2-normalised first when ``normalize``; the paper leaves this open, and
    pytorch-metric-learning's default distance (``LpDistance(normalize_embeddings=True)``) does
    it. pytorch-metric-learning's ``LiftedStructureLoss(neg_margin=m, pos_margin=0)`` [1]
    implements this same eq. 4 (its mean over ordered pairs of ``max(0, J)^2 / 2`` is the
    ``1 / (2|P|)`` above); the tests compare against it.

    With a ``miner`` (see :mod:`sslkit.losses.miners`), P holds the positive pairs it keeps and
    ``neg(i)`` the negatives it keeps for ``i`` (as an anchor). With ``memory`` (a
    :class:`~sslkit.losses.memory.CrossBatchMemory`) the batch is enqueued and the same loss is
    added with ``j`` and ``neg(i)`` from the memory; a memory entry ``j`` is no anchor, so
    ``neg(j)`` is every memory entry of another label (its sum detached, computed in blocks of
    the (M, M) distances: memory sizes of a few thousand are cheap next to the network).

    Across processes: a local anchor ``i`` pairs with positives ``j`` from every process, and
    ``j``'s negative sum comes from the process that holds ``j`` (each process computes the
    sums of its own samples and gathers them with gradient), so no process builds the full
    (N, N) distance matrix.

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar.
    """
    check_embeddings_labels(embeddings, labels)
    margin = check_nonnegative(margin, "margin")
    normalize = check_flag(normalize, "normalize")
    miner, epsilon = check_miner(miner, epsilon)
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(embeddings.device):
        x = upcast(embeddings)
        if normalize:
            x = F.normalize(x, dim=1)
        batch, *past = reference_sets(x, labels, gather_distributed, memory)
        total = 0.0
        for references in (batch, *past):
            positive, negative = pair_masks(labels, references)
            mined = mine(miner, epsilon, x, references, positive, negative)
            dist = pairwise_distance(x, references.embeddings)  # (n, M)
            negative_lse = _negative_lse(dist, mined.negative, margin)  # (n,) the anchors' sums
            if references is not batch:
                reference_lse = _memory_negative_lse(references, margin)  # (M,)
            elif gather_distributed and distributed.is_distributed():
                reference_lse = distributed.gather_with_grad(negative_lse, check=False)  # (N,) sizes checked
            else:
                reference_lse = negative_lse  # (N,)
            j = torch.logaddexp(negative_lse[:, None], reference_lse[None, :]) + dist  # (n, M)
            per_pair = torch.where(mined.positive, j.clamp_min(0.0).square(), torch.zeros_like(j))
            total = total + mean_over_processes(per_pair.sum() / 2, mined.positive.sum(), gather_distributed)
        return total


class LiftedStructureLoss(nn.Module):
    """Lifted structured loss of Song et al. [0] (the smooth form, eq. 4).

    Every positive pair is pushed to be ``margin`` closer than the closest (softly: logsumexp)
    negative of either of its two samples. See :func:`lifted_structure_loss`.

    Args:
        margin: m >= 0 (``alpha`` in [0]); 1.0 as pytorch-metric-learning's ``neg_margin``.
        normalize: L2-normalise the embeddings first.
        miner: which pairs count: ``None`` (every pair), ``"multi_similarity"``, ``"batch_hard"``,
            ``"semi_hard"`` or ``"distance_weighted"`` (see :mod:`sslkit.losses.miners`).
        epsilon: the miner's margin: multi-similarity's epsilon, the semi-hard window.
        memory_size: > 0 keeps the embeddings of that many earlier samples as extra references
            (cross-batch memory, see :mod:`sslkit.losses.memory`); 0: the batch only.
        gather_distributed: across processes, pair local samples with every process's
            samples (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = LiftedStructureLoss(margin=1.0)
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(
        self,
        margin: float = 1.0,
        normalize: bool = True,
        miner: str | None = None,
        epsilon: float = 0.1,
        memory_size: int = 0,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.margin = check_nonnegative(margin, "margin")
        self.normalize = check_flag(normalize, "normalize")
        self.miner, self.epsilon = check_miner(miner, epsilon)
        self.memory = memory_of(memory_size)
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return lifted_structure_loss(
            embeddings,
            labels,
            self.margin,
            self.normalize,
            self.miner,
            self.epsilon,
            self.memory,
            self.gather_distributed,
        )

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, normalize={self.normalize}, miner={self.miner!r}, epsilon={self.epsilon}, "
            f"gather_distributed={self.gather_distributed}"
        )
