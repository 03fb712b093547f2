"""NT-Xent / InfoNCE: the SimCLR loss, with an optional bank of negatives (MoCo form).

References:
    [0] SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709 (eq. 1)
    [1] InfoNCE, van den Oord et al. 2018, https://arxiv.org/abs/1807.03748
    [2] MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722 (eq. 1)
    [3] SupCon, Khosla et al. 2020, https://arxiv.org/abs/2004.11362 (section 3.2, "multiviewed batch")
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from sslkit import distributed
from sslkit.losses._common import (
    check_flag,
    check_negatives,
    check_positive,
    check_tensor,
    check_two_views,
    full_precision,
    global_view_pairs,
    upcast,
)
from sslkit.losses._fused import bank_softmax_ce, two_view_softmax_ce
from sslkit.losses.supcon import supcon_loss


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

    Cost: one (2n, 2N) matmul forward, an in-place ``exp`` and a row sum (and a row maximum
    when T < 1/60); backward, two matmuls, or in one process one matmul and one pass over the
    (2N, 2N) matrix, which is symmetric there (see :mod:`sslkit.losses._fused`).

    Shape:
        z1, z2: (N, D) embeddings of two views of the same N images.
        negatives: (K, D), optional, treated as constants by the caller's choice (detach them).
        returns: scalar.
    """
    check_two_views(z1, z2)
    temperature = check_positive(temperature, "temperature")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    check_negatives(negatives, z1.shape[1])
    inv_t = 1.0 / temperature
    with full_precision(z1.device):
        dtype = torch.promote_types(upcast(z1).dtype, upcast(z2).dtype)
        z1, z2 = upcast(z1).to(dtype), upcast(z2).to(dtype)
        if negatives is not None:
            # the key is in its query's denominator (eq. 1 of [2]): exclude_positive=False
            return bank_softmax_ce(z1, z2, upcast(negatives).to(dtype), inv_t, exclude_positive=False)
        # The anchor itself is left out of its own denominator, its positive is kept.
        return two_view_softmax_ce(z1, z2, inv_t, exclude_positive=False, gather_distributed=gather_distributed)


def multi_view_ntxent_loss(
    views: Sequence[torch.Tensor], temperature: float = 0.5, gather_distributed: bool = True
) -> torch.Tensor:
    """NT-Xent over V >= 2 views of N images: every view against every other (SupCon's n views [3]).

    Every one of the VN embeddings is an anchor; its positives ``P(i)`` are the V - 1 other views
    of its image, its candidates every other embedding, positives and the other images' views::

        l_i = log sum_{a != i} exp(s_ia / T)  -  1/(V - 1) sum_{p in P(i)} s_ip / T,   loss = mean_i l_i

    which is :func:`~sslkit.losses.supcon_loss` with each image's index as its label, and for
    V = 2 exactly :func:`ntxent_loss`. With multi-crop's local views (SwAV, DINO) the pairs are:
    global-global, global-local and local-local views of one image positive; any two views of two
    different images negative. Across processes every process's embeddings are candidates.

    Shape:
        views: V tensors (N, D), the same N images in the same order in each.
        returns: scalar.
    """
    if len(views) < 2:
        raise ValueError(f"views must hold at least 2 views of the same images, got {len(views)}")
    for view in views[1:]:
        check_two_views(views[0], view)
    n = views[0].shape[0]
    # Image indices as labels, unique across processes (each holds N rows: checked when gathering).
    images = torch.arange(n, device=views[0].device) + (distributed.rank() * n if gather_distributed else 0)
    embeddings = torch.cat(list(views))  # (VN, D), view by view
    return supcon_loss(embeddings, images.repeat(len(views)), temperature, gather_distributed=gather_distributed)


def multi_view_infonce_loss(
    queries: torch.Tensor, keys: torch.Tensor, negatives: torch.Tensor, temperature: float = 0.5
) -> torch.Tensor:
    """MoCo's InfoNCE with multi-crop: the query of every view against the key of each global view but its own.

    The keys come from the two global views only (the momentum encoder sees nothing else); the
    queries from every view V, the global ones and multi-crop's local ones. Each pair of a view
    ``v`` and a global view ``g != v`` is eq. 1 of [2] with the bank as negatives, and the loss is
    their mean over the ``2 (V - 1)`` pairs::

        L = mean_{(g, v), v != g} mean_i -log( exp(q_vi.k_gi / T) / (exp(q_vi.k_gi / T) + sum_j exp(q_vi.n_j / T)) )

    With two views the pairs are (1, 2) and (2, 1) and this is :func:`ntxent_loss` of
    ``[q1; q2]`` against ``[k2; k1]`` with ``negatives``: MoCo's symmetric loss,
    ``(l(q1, k2) + l(q2, k1)) / 2``. The mean keeps that scale for any number of local views (a
    sum over the pairs would grow with them; DINO's code averages its pairs, and so does sslkit).

    Shape:
        queries: (V n, D), ``[q1; q2; local 1; ...]``; keys: (2n, D), ``[k1; k2]``, constants (detach them).
        negatives: (K, D), the bank (K may be 0: then every term is 0).
        returns: scalar.
    """
    check_tensor(negatives, "negatives")  # required: without a bank, ntxent_loss would be SimCLR's loss
    queries, keys = global_view_pairs(queries, keys)  # (2 (V - 1) n, D) each, row for row
    return ntxent_loss(queries, keys, temperature, negatives)


class NTXentLoss(nn.Module):
    """NT-Xent / InfoNCE loss (SimCLR [0]); MoCo's InfoNCE [2] when given ``negatives``.

    Args:
        temperature: T > 0 dividing the cosine similarities. The default 0.5 is SimCLR's
            CIFAR-10 value ([0], appendix B.9), as lightly's ``NTXentLoss``;
            pytorch-metric-learning's defaults to 0.07 (MoCo v1's; MoCo v2 uses 0.2).
        gather_distributed: across processes, compare local anchors with every process's
            embeddings (the SimCLR paper's large-batch setting). Off: each process only
            sees its own batch. lightly defaults to ``False``; sslkit to ``True``, because
            the paper's negatives are the whole global batch and a multi-process run should
            train the loss a single-process run of the same global batch trains.

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
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, z1: torch.Tensor, z2: torch.Tensor, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return ntxent_loss(z1, z2, self.temperature, negatives, self.gather_distributed)

    def multi_view(self, *views: torch.Tensor) -> torch.Tensor:
        """:func:`multi_view_ntxent_loss` of V >= 2 views (multi-crop). Shape: views: V (N, D); returns a scalar."""
        return multi_view_ntxent_loss(views, self.temperature, self.gather_distributed)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, gather_distributed={self.gather_distributed}"
