"""Soft nearest neighbours loss (Frosst, Papernot, Hinton).

References:
    [0] Analyzing and Improving Representations with the Soft Nearest Neighbor Loss, Frosst,
        Papernot and Hinton 2019, https://arxiv.org/abs/1902.01889 (eq. 1)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.losses._common import (
    check_embeddings_labels,
    check_flag,
    check_positive,
    full_precision,
    gather_labelled,
    mean_over_processes,
    upcast,
)


def soft_nearest_neighbors_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    temperature: float = 1.0,
    normalize: bool = False,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Soft nearest neighbours loss (eq. 1 of [0]), mean over anchors that have a same-class partner.

    With ``d_ij = ||x_i - x_j||^2`` the squared Euclidean distance::

        l_i = -log( sum_{j != i, y_j = y_i} exp(-d_ij / T) / sum_{k != i} exp(-d_ik / T) )
        loss = mean over {i : some j != i has y_j = y_i} of l_i

    The paper writes ``-1/b sum_i`` over all ``b`` samples; a sample alone in its class has
    an empty numerator (``l_i = +inf``), so such anchors are skipped and the mean runs over
    the others. With no such anchor at all the loss is 0, still attached to the graph. The
    temperature is a fixed hyperparameter here.

    Distances are computed as ``2 x_i . x_j - ||x_j||^2``: the dropped ``-||x_i||^2`` is the
    same for every term of row ``i`` and cancels between numerator and denominator, so the
    value and gradient are those of eq. 1 and no clamp at 0 is needed. Both sums are
    logsumexps over the same row, the diagonal set to ``-inf``.

    Embeddings are used as they are, as in the paper; ``normalize=True`` L2-normalises them
    first (then ``d = 2 - 2 cos``). Across processes, local anchors are compared with every
    process's embeddings, scaled so that the mean of the processes' losses is the loss of
    the whole batch (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar.
    """
    check_embeddings_labels(embeddings, labels)
    temperature = check_positive(temperature, "temperature")
    normalize = check_flag(normalize, "normalize")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    inv_t = 1.0 / temperature
    with full_precision(embeddings.device):
        x = upcast(embeddings)
        if normalize:
            x = F.normalize(x, dim=1)
        candidates, candidate_labels, offset = gather_labelled(x, labels, gather_distributed)
        n = x.shape[0]
        _, class_of, class_size = torch.unique(candidate_labels, return_inverse=True, return_counts=True)
        if not (class_size > 1).any():
            # Every process sees the same gathered labels, so all of them return here together.
            return candidates.sum() * 0.0
        has_partner = class_size[class_of[offset : offset + n]] > 1  # (n,)

        # -d_ij / T up to a per-row constant; scale the thin (n, D) side, not the (n, N) product.
        logits = (x * (2.0 * inv_t)) @ candidates.T - candidates.square().sum(dim=1) * inv_t  # (n, N)
        logits.diagonal(offset).fill_(float("-inf"))
        log_denominator = torch.logsumexp(logits, dim=1)  # (n,)
        same = labels[:, None] == candidate_labels[None, :]  # (n, N), the diagonal is -inf anyway
        # Rows without a partner keep every entry, so their (unused) numerator stays finite
        # and no NaN reaches the gradient through the masked-out rows.
        keep = same | ~has_partner[:, None]
        log_numerator = torch.logsumexp(logits.masked_fill(~keep, float("-inf")), dim=1)  # (n,)
        per_anchor = log_denominator - log_numerator
        total = torch.where(has_partner, per_anchor, torch.zeros_like(per_anchor)).sum()
        return mean_over_processes(total, has_partner.sum(), gather_distributed)


class SoftNearestNeighborsLoss(nn.Module):
    """Soft nearest neighbours loss of Frosst, Papernot and Hinton [0], eq. 1.

    For each sample, minus the log of the probability that a soft nearest neighbour (drawn
    with weight ``exp(-||x_i - x_j||^2 / T)`` among the other samples) has its label. Low
    values mean the classes are entangled little in the representation; see
    :func:`soft_nearest_neighbors_loss` for the formula and the skipped anchors.

    Args:
        temperature: T > 0 dividing the squared distances. The loss depends on the scale of
            the embeddings, so T goes with it: with ``normalize=True`` distances lie in [0, 4]
            and T well below 1 keeps the neighbour weights from being nearly uniform.
        normalize: L2-normalise the embeddings first. Off by default, as in the paper.
        gather_distributed: across processes, compare local anchors with every process's
            embeddings. Off: each process sees its own batch.

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = SoftNearestNeighborsLoss(temperature=1.0)
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(self, temperature: float = 1.0, normalize: bool = False, gather_distributed: bool = True) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.normalize = check_flag(normalize, "normalize")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return soft_nearest_neighbors_loss(
            embeddings, labels, self.temperature, self.normalize, self.gather_distributed
        )

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, normalize={self.normalize}, gather_distributed={self.gather_distributed}"
        )
