"""Circle loss, pair-wise labels (Sun et al.).

References:
    [0] Circle Loss: A Unified Perspective of Pair Similarity Optimization, Sun et al. 2020,
        https://arxiv.org/abs/2002.10857 (eq. 6 and the gradients derived from it)
    [1] pytorch-metric-learning ``CircleLoss``,
        https://kevinmusgrave.github.io/pytorch-metric-learning/losses/#circleloss
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.losses._common import (
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


def _check_margin(margin: float) -> float:
    margin = as_number(margin, "margin")
    if not 0.0 <= margin < 1.0:  # one message for both ends: 1 itself is out too
        raise ValueError(f"margin must be in [0, 1) (D_p = 1 - m is the positives' target), got {margin}")
    return margin


def circle_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    margin: float = 0.25,
    gamma: float = 256.0,
    miner: str | None = None,
    epsilon: float = 0.1,
    memory: CrossBatchMemory | None = None,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Circle loss with pair-wise labels (eq. 6 of [0]), mean over anchors with a positive and a negative.

    For anchor ``i``, ``s_p`` runs over the cosine similarities to the other samples of its
    class and ``s_n`` over those to samples of other classes::

        l_i = log( 1 + sum_n exp(g a_n (s_n - D_n)) * sum_p exp(-g a_p (s_p - D_p)) )
        a_p = [1 + m - s_p]_+,   a_n = [s_n + m]_+,   D_p = 1 - m,   D_n = m
        loss = mean over {i : i has a positive and a negative} of l_i

    ``a_p`` and ``a_n`` are held constant in the backward pass (detached): the gradients the
    paper derives from eq. 6 are ``dL/ds_n = Z_n g a_n`` and ``dL/ds_p = -Z_p g a_p`` (``Z``
    the softmax-like factors), which are those of eq. 6 with the weights fixed;
    differentiating through them would give ``2 g s_n`` and ``2 g (s_p - 1)`` instead.
    pytorch-metric-learning [1] detaches them too.

    Computed as ``softplus(logsumexp_n + logsumexp_p)`` (softplus as ``logaddexp(0, .)``,
    exact at any size): with ``g = 256`` the terms reach ``exp(1000)``.

    Anchors without a positive or without a negative have no pair and are skipped; with none
    left the loss is 0, still attached to the graph. pytorch-metric-learning averages over
    the anchors whose loss is non-zero (``AvgNonZeroReducer``), which are the same anchors
    (a softplus is never 0 unless it underflows), so the two agree.

    With a ``miner`` the sums run over the pairs it keeps and the mean over the anchors left
    with a positive and a negative (see :mod:`sslkit.losses.miners`); with ``memory`` (a
    :class:`~sslkit.losses.memory.CrossBatchMemory`) the batch is enqueued and the same loss
    of the anchors against the memory is added. Across processes, local
    anchors are compared with every process's embeddings, scaled so that the mean of the
    processes' losses is the loss of the whole batch (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar.
    """
    check_embeddings_labels(embeddings, labels)
    margin, gamma = _check_margin(margin), check_positive(gamma, "gamma")
    miner, epsilon = check_miner(miner, epsilon)
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(embeddings.device):
        z = F.normalize(upcast(embeddings), dim=1)
        total = 0.0
        for references in reference_sets(z, labels, gather_distributed, memory):
            positive, negative = pair_masks(labels, references)
            mined = mine(miner, epsilon, z, references, positive, negative)
            has_pairs = mined.positive.any(dim=1) & mined.negative.any(dim=1)  # (n,)
            sim = z @ references.embeddings.T  # (n, M)
            alpha_p = (1.0 + margin - sim.detach()).clamp_min(0.0)
            alpha_n = (sim.detach() + margin).clamp_min(0.0)
            logit_p = -gamma * alpha_p * (sim - (1.0 - margin))  # (n, M)
            logit_n = gamma * alpha_n * (sim - margin)  # (n, M)
            # Rows without pairs keep every entry so that their (unused) logsumexps stay finite.
            skip = ~has_pairs[:, None]
            lse_p = torch.logsumexp(logit_p.masked_fill(~(mined.positive | skip), float("-inf")), dim=1)  # (n,)
            lse_n = torch.logsumexp(logit_n.masked_fill(~(mined.negative | skip), float("-inf")), dim=1)  # (n,)
            per_anchor = torch.logaddexp(torch.zeros_like(lse_p), lse_p + lse_n)  # softplus
            local_sum = torch.where(has_pairs, per_anchor, torch.zeros_like(per_anchor)).sum()
            total = total + mean_over_processes(local_sum, has_pairs.sum(), gather_distributed)
        return total


class CircleLoss(nn.Module):
    """Circle loss of Sun et al. [0] with pair-wise labels (eq. 6), on cosine similarities.

    Re-weights every within-class similarity ``s_p`` and between-class similarity ``s_n`` by
    how far it is from its optimum (``1 + m`` and ``-m``), so that the decision boundary is
    a circle; see :func:`circle_loss` for the formula, the detached weights and the reduction.

    Args:
        margin: the relaxation m in [0, 1). The paper's face-recognition setting is
            ``m = 0.25, gamma = 256`` (person re-id: 0.25, 128; fine-grained retrieval: 0.4, 80).
            pytorch-metric-learning defaults to ``m = 0.4, gamma = 80``; pass them to match.
        gamma: the scale g > 0.
        miner: which pairs count: ``None`` (every pair), ``"multi_similarity"``, ``"batch_hard"``,
            ``"semi_hard"`` or ``"distance_weighted"`` (see :mod:`sslkit.losses.miners`).
        epsilon: the miner's margin: multi-similarity's epsilon, the semi-hard window.
        memory_size: > 0 keeps the embeddings of that many earlier samples as extra references
            (cross-batch memory, see :mod:`sslkit.losses.memory`); 0: the batch only.
        gather_distributed: across processes, compare local anchors with every process's
            embeddings. Off: each process sees its own batch.

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = CircleLoss(margin=0.25, gamma=256.0)
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(
        self,
        margin: float = 0.25,
        gamma: float = 256.0,
        miner: str | None = None,
        epsilon: float = 0.1,
        memory_size: int = 0,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.margin = _check_margin(margin)
        self.gamma = check_positive(gamma, "gamma")
        self.miner, self.epsilon = check_miner(miner, epsilon)
        self.memory = memory_of(memory_size)
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return circle_loss(
            embeddings, labels, self.margin, self.gamma, self.miner, self.epsilon, self.memory, self.gather_distributed
        )

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, gamma={self.gamma}, miner={self.miner!r}, epsilon={self.epsilon}, "
            f"gather_distributed={self.gather_distributed}"
        )
