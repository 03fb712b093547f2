"""NT-Xent / InfoNCE: the SimCLR loss, with an optional bank of negatives (MoCo form).

References:
    [0] SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709 (eq. 1)
    [1] InfoNCE, van den Oord et al. 2018, https://arxiv.org/abs/1807.03748
    [2] MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722 (eq. 1)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import distributed
from sslkit.losses._common import check_negatives, check_positive, check_two_views, full_precision, upcast


def ntxent_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float = 0.5,
    negatives: torch.Tensor | None = None,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """NT-Xent over 2N anchors, or MoCo's InfoNCE when ``negatives`` is given.

    Without ``negatives`` (SimCLR, eq. 1 of [0]): every one of the 2N embeddings is an anchor
    whose positive is the other view of the same image and whose candidates are all 2N - 1
    other embeddings::

        l_i = -log( exp(s_ip / T) / sum_{k != i} exp(s_ik / T) ),   loss = mean_i l_i

    With ``negatives`` (MoCo, eq. 1 of [2]): ``z1`` are queries, ``z2`` their keys, and the
    negatives come from the bank only::

        l_i = -log( exp(q_i.k_i / T) / (exp(q_i.k_i / T) + sum_j exp(q_i.n_j / T)) )

    ``s`` is the cosine similarity (inputs are L2-normalised here). Across processes the
    candidates are gathered with gradient and the positives offset by ``rank * N``; see
    :mod:`sslkit.distributed` for the gradient convention.

    Shape:
        z1, z2: (N, D) embeddings of two views of the same N images.
        negatives: (K, D), optional, treated as constants by the caller's choice (detach them).
        returns: scalar.
    """
    check_two_views(z1, z2)
    check_negatives(negatives, z1.shape[1])
    inv_t = 1.0 / temperature
    with full_precision(z1.device):
        z1 = F.normalize(upcast(z1), dim=1)
        z2 = F.normalize(upcast(z2), dim=1)
        n = z1.shape[0]
        if negatives is not None:
            negatives = F.normalize(upcast(negatives).to(z1.dtype), dim=1)
            positive = (z1 * z2).sum(dim=1, keepdim=True)  # (N, 1)
            logits = torch.cat([positive, z1 @ negatives.T], dim=1) * inv_t  # (N, 1 + K)
            target = torch.zeros(n, dtype=torch.long, device=z1.device)
            return F.cross_entropy(logits, target)

        anchors = torch.cat([z1, z2])  # (2n, D)
        if gather_distributed and distributed.is_distributed():
            candidates = torch.cat([distributed.gather_with_grad(z1), distributed.gather_with_grad(z2)])
        else:
            candidates = anchors
        total = candidates.shape[0] // 2  # N over all processes
        offset = distributed.local_offset(n) if candidates is not anchors else 0

        # Scale the (2n, D) side rather than the (2n, 2N) product: one pass over fewer elements.
        logits = (anchors * inv_t) @ candidates.T  # (2n, 2N)
        local = torch.arange(n, device=z1.device)
        self_col = torch.cat([local + offset, local + offset + total])  # (2n,)
        positive_col = torch.cat([local + offset + total, local + offset])  # (2n,)
        rows = torch.arange(2 * n, device=z1.device)
        # -inf (not a large negative) is safe here: logits are fp32/fp64 and each row keeps its positive.
        logits[rows, self_col] = float("-inf")
        return F.cross_entropy(logits, positive_col)


class NTXentLoss(nn.Module):
    """NT-Xent / InfoNCE loss (SimCLR [0]); MoCo's InfoNCE [2] when given ``negatives``.

    Args:
        temperature: T > 0 dividing the cosine similarities. The default 0.5 is SimCLR's
            CIFAR-10 value ([0], appendix B.9); MoCo uses 0.2 (v2) and 0.07 (v1).
        gather_distributed: across processes, compare local anchors with every process's
            embeddings (the SimCLR paper's large-batch setting). Off: each process only
            sees its own batch.

    Shape:
        z1, z2: (N, D); negatives: (K, D) or None; returns a scalar.

    >>> loss_fn = NTXentLoss(temperature=0.2)
    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss_fn(z1, z2).shape
    torch.Size([])
    """

    def __init__(self, temperature: float = 0.5, gather_distributed: bool = True) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.gather_distributed = gather_distributed

    def forward(self, z1: torch.Tensor, z2: torch.Tensor, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return ntxent_loss(z1, z2, self.temperature, negatives, self.gather_distributed)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, gather_distributed={self.gather_distributed}"
