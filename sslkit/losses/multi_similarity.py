"""Multi-Similarity loss: each pair weighted by its own, its positive and its negative similarities (Wang et al.).

References:
    [0] Multi-Similarity Loss with General Pair Weighting for Deep Metric Learning, Wang, Han, Huang,
        Dong, Scott 2019, https://arxiv.org/abs/1904.06627 (the MS loss and its pair mining)
    [1] pytorch-metric-learning ``MultiSimilarityLoss``,
        https://kevinmusgrave.github.io/pytorch-metric-learning/losses/#multisimilarityloss
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.losses._common import (
    References,
    as_number,
    check_embeddings_labels,
    check_flag,
    check_positive,
    full_precision,
    mean_over_processes,
    pair_masks,
    upcast,
)
from sslkit.losses.memory import CrossBatchMemory, memory_of, reference_sets
from sslkit.losses.miners import check_miner, mine


def _log1p_sum_exp(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log(1 + sum_{mask} exp(logits))`` per row, as a logsumexp with a 0 logit for the 1.

    The 0 column keeps every row finite, so a row with no pair is exactly 0 with a zero
    gradient (a logsumexp over only -inf would have a NaN one).

    Shape:
        logits, mask: (n, M); returns (n,).
    """
    padded = torch.cat([logits.new_zeros(logits.shape[0], 1), logits.masked_fill(~mask, float("-inf"))], dim=1)
    return padded.logsumexp(dim=1)


def _terms(z, labels, references: References, alpha, beta, base, miner, epsilon):
    """Sum of the unit anchors' terms against the unit ``references``, and how many anchors they are."""
    positive, negative = pair_masks(labels, references)
    mined = mine(miner, epsilon, z, references, positive, negative)
    sim = z @ references.embeddings.T  # (n, M): both sides unit rows
    pulls = _log1p_sum_exp(-alpha * (sim - base), mined.positive) / alpha  # (n,)
    pushes = _log1p_sum_exp(beta * (sim - base), mined.negative) / beta  # (n,)
    return (pulls + pushes).sum(), torch.tensor(z.shape[0], device=z.device)


def multi_similarity_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
    miner: str | None = None,
    epsilon: float = 0.1,
    memory: CrossBatchMemory | None = None,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Multi-Similarity loss of [0] (its pair-weighting loss), mean over every anchor.

    For anchor ``i`` with cosine similarities ``S_ik``, positives ``P_i`` (other samples of
    its class) and negatives ``N_i`` (other classes), over ``m`` anchors::

        l_i = 1/alpha log(1 + sum_{k in P_i} exp(-alpha (S_ik - lambda)))
            + 1/beta  log(1 + sum_{k in N_i} exp( beta (S_ik - lambda)))
        loss = 1/m sum_i l_i

    ``lambda`` is ``base``. Each ``log(1 + sum exp)`` is a logsumexp with a 0 logit, so
    ``beta = 50`` cannot overflow. ``P_i`` and ``N_i`` are every pair, or the pairs ``miner``
    keeps: ``miner="multi_similarity"`` with ``epsilon`` is the paper's own pair mining,
    which with this loss is the whole method of [0] (see :mod:`sslkit.losses.miners`).

    Reduction: the mean runs over all ``m`` anchors, an anchor with an empty ``P_i`` or
    ``N_i`` adding the other term (an empty sum is ``log 1 = 0``). That is the paper's equation as written
    and pytorch-metric-learning's ``MultiSimilarityLoss`` [1] (which the tests compare with);
    the authors' code skips an anchor that lacks a mined positive or a mined negative, but
    still divides by the batch size.

    With ``memory`` (a :class:`~sslkit.losses.memory.CrossBatchMemory`) the batch is enqueued
    and the same loss of the anchors against the memory is added. Across processes, local
    anchors are compared with every process's embeddings and each process's loss is scaled so
    that their mean is the loss of the whole batch (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar.
    """
    check_embeddings_labels(embeddings, labels)
    alpha, beta, base = check_positive(alpha, "alpha"), check_positive(beta, "beta"), _check_base(base)
    miner, epsilon = check_miner(miner, epsilon)
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(embeddings.device):
        z = F.normalize(upcast(embeddings), dim=1)
        total = 0.0
        for references in reference_sets(z, labels, gather_distributed, memory):
            local_sum, count = _terms(z, labels, references, alpha, beta, base, miner, epsilon)
            total = total + mean_over_processes(local_sum, count, gather_distributed)
        return total


def _check_base(base: float) -> float:
    base = as_number(base, "base")
    if not 0.0 <= base <= 1.0:
        raise ValueError(f"base must be a similarity in [0, 1] (lambda of the paper, 0.5 there), got {base}")
    return base


class MultiSimilarityLoss(nn.Module):
    """Multi-Similarity loss of Wang et al. [0], on cosine similarities.

    Weighs every positive pair by how much less similar it is than ``base`` (``alpha``) and
    every negative pair by how much more similar (``beta``), each relative to the anchor's
    other pairs (a softmax over them); see :func:`multi_similarity_loss` for the formula and
    the reduction. The paper's method is this loss with ``miner="multi_similarity"``.

    Args:
        alpha: alpha > 0, the scale of the positive pairs (paper: 2).
        beta: beta > 0, the scale of the negative pairs (paper: 50).
        base: lambda in [0, 1], the similarity that pairs are measured from (paper: 0.5;
            pytorch-metric-learning's ``base``).
        miner: which pairs count: ``None`` (every pair), ``"multi_similarity"``, ``"batch_hard"``,
            ``"semi_hard"`` or ``"distance_weighted"`` (see :mod:`sslkit.losses.miners`).
        epsilon: the miner's margin: multi-similarity's epsilon (paper: 0.1), the semi-hard window.
        memory_size: > 0 keeps the embeddings of that many earlier samples as extra references
            (cross-batch memory, see :mod:`sslkit.losses.memory`); 0: the batch only.
        gather_distributed: across processes, compare local anchors with every process's
            embeddings. Off: each process sees its own batch.

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = MultiSimilarityLoss(miner="multi_similarity")
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(
        self,
        alpha: float = 2.0,
        beta: float = 50.0,
        base: float = 0.5,
        miner: str | None = None,
        epsilon: float = 0.1,
        memory_size: int = 0,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.alpha, self.beta = check_positive(alpha, "alpha"), check_positive(beta, "beta")
        self.base = _check_base(base)
        self.miner, self.epsilon = check_miner(miner, epsilon)
        self.memory = memory_of(memory_size)
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return multi_similarity_loss(
            embeddings,
            labels,
            self.alpha,
            self.beta,
            self.base,
            self.miner,
            self.epsilon,
            self.memory,
            self.gather_distributed,
        )

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha}, beta={self.beta}, base={self.base}, miner={self.miner!r}, "
            f"epsilon={self.epsilon}, gather_distributed={self.gather_distributed}"
        )
