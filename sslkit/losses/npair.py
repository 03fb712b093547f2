"""Multi-class N-pair loss: one positive per anchor, the other classes' positives as negatives.

Pairwise softmax cross-entropy over a batch (PSCE, the "image x image" softmax,
``-sum_i sum_{j: y_j = y_i} log softmax_k(z_i . z_k)_j``) is this family: N-pair is PSCE with one
positive per anchor and raw dot products as logits, and SupCon is PSCE with every positive and a
temperature. Classification softmax cross-entropy against class weights (CSCE) solves the same
problem (Boudiaf et al. 2020); PSCE is the choice when there are only relative labels or too many
classes to hold a weight matrix.

References:
    [0] Improved Deep Metric Learning with Multi-class N-pair Loss Objective, Sohn 2016,
        https://papers.nips.cc/paper/6199-improved-deep-metric-learning-with-multi-class-n-pair-loss-objective
        (the multi-class N-pair loss and its L2 regulariser on the embeddings; no arXiv version)
    [1] A unifying mutual information view of metric learning: cross-entropy vs. pairwise
        losses, Boudiaf et al. 2020, https://arxiv.org/abs/2003.08983
    [2] pytorch-metric-learning ``NPairsLoss``,
        https://kevinmusgrave.github.io/pytorch-metric-learning/losses/#npairsloss
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
    upcast,
)


def first_pair_per_class(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each label with at least two samples, its first two samples in batch order.

    Shape:
        labels: (N,); returns anchor and positive indices, (M,) each, M = number of such labels,
        sorted by label.
    """
    sorted_labels, order = torch.sort(labels, stable=True)  # stable: keeps batch order in a class
    starts = torch.ones_like(sorted_labels, dtype=torch.bool)
    starts[1:] = sorted_labels[1:] != sorted_labels[:-1]
    first = starts.nonzero().squeeze(1)  # (C,) position of each label's first sample
    second = (first + 1).clamp_max(len(labels) - 1)
    has_pair = (first + 1 < len(labels)) & (sorted_labels[second] == sorted_labels[first])
    return order[first[has_pair]], order[second[has_pair]]


def npair_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    l2_reg: float = 0.0,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Multi-class N-pair loss of Sohn [0] on a labelled batch.

    The batch is read as M pairs ``(f_i, f_i+)``: for each label with at least two samples,
    its first sample (in batch order) is the anchor and its second the positive. Further
    samples of that label, and labels with a single sample, are not used (they are not even
    negatives). This is how pytorch-metric-learning's ``NPairsLoss`` reads a batch [2]; Sohn's
    sampler draws exactly two samples from each of N classes, where the two readings agree.
    With unnormalised dot products, as in the paper::

        l_i = log(1 + sum_{j != i} exp(f_i . f_j+ - f_i . f_i+))
            = -log( exp(f_i . f_i+) / sum_j exp(f_i . f_j+) )         (a cross-entropy)
        loss = 1/M sum_i l_i + l2_reg * 1/M sum_i (|f_i|^2 + |f_i+|^2) / 2

    The second term is Sohn's L2 regulariser on the embeddings [0]: without normalisation
    the first term alone can be lowered just by growing the norms. TensorFlow's ``npairs_loss``
    writes it ``reg_lambda / 4 * (mean |f_i|^2 + mean |f_i+|^2)``, i.e. ``l2_reg = reg_lambda / 2``.

    pytorch-metric-learning's ``NPairsLoss`` uses ``DotProductSimilarity()``, which
    L2-normalises the embeddings by default; ``DotProductSimilarity(normalize_embeddings=False)``
    gives the paper's (and this) form. Its ``embedding_regularizer`` is a different penalty
    (norms of every sample of the batch, not squared by default).

    Across processes the pairs are taken from the whole gathered batch (so the first two
    samples of a class may sit on different processes); each process computes the terms of
    the anchors it holds, against every pair's positive.

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar (0 when no label has two samples).
    """
    check_embeddings_labels(embeddings, labels)
    l2_reg = check_nonnegative(l2_reg, "l2_reg")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(embeddings.device):
        x = upcast(embeddings)
        candidates, candidate_labels, offset = gather_labelled(x, labels, gather_distributed)
        n = x.shape[0]
        anchor_idx, positive_idx = first_pair_per_class(candidate_labels)  # (M,), (M,) global rows
        mine = (anchor_idx >= offset) & (anchor_idx < offset + n)  # (M,) pairs anchored here
        anchors = x[anchor_idx[mine] - offset]  # (m, D)
        # Dot products can exceed fp16's range; they run in fp32 here (autocast is off).
        logits = anchors @ candidates[positive_idx].T  # (m, M)
        target = mine.nonzero().squeeze(1)  # column of each local anchor's own positive
        total = F.cross_entropy(logits, target, reduction="sum")
        if l2_reg > 0:
            # Each positive's norm is charged once, by the process that holds it.
            positive_is_local = (positive_idx >= offset) & (positive_idx < offset + n)
            local_positives = x[positive_idx[positive_is_local] - offset]
            squared_norms = anchors.square().sum() + local_positives.square().sum()
            total = total + l2_reg * squared_norms / 2
        return mean_over_processes(total, mine.sum(), gather_distributed)


class NPairLoss(nn.Module):
    """Multi-class N-pair loss of Sohn [0]: softmax cross-entropy over one positive per class.

    A member of the pairwise softmax cross-entropy family (PSCE, next to SupCon);
    see the module docstring and :func:`npair_loss` for how the batch is read.

    Args:
        l2_reg: weight >= 0 of the L2 penalty on the embeddings' squared norms [0]. Default 0;
            enable it when the model does not normalise its embeddings (TensorFlow's
            ``npairs_loss`` default ``reg_lambda=0.002`` is ``l2_reg=0.001`` here).
        gather_distributed: across processes, local anchors compete against every process's
            positives (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = NPairLoss(l2_reg=0.001)
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(self, l2_reg: float = 0.0, gather_distributed: bool = True) -> None:
        super().__init__()
        self.l2_reg = check_nonnegative(l2_reg, "l2_reg")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return npair_loss(embeddings, labels, self.l2_reg, self.gather_distributed)

    def extra_repr(self) -> str:
        return f"l2_reg={self.l2_reg}, gather_distributed={self.gather_distributed}"
