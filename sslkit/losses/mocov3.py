"""MoCo v3's loss: symmetric InfoNCE of queries against the momentum encoder's keys, scaled by 2T.

References:
    [0] MoCo v3, Chen, Xie, He 2021, https://arxiv.org/abs/2104.02057 (Algorithm 1)
    [1] InfoNCE, van den Oord et al. 2018, https://arxiv.org/abs/1807.03748
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import distributed
from sslkit.losses._common import (
    check_flag,
    check_multi_view_queries_keys,
    check_positive,
    check_queries_keys,
    full_precision,
    upcast,
)


def _ctr(q: torch.Tensor, k: torch.Tensor, temperature: float, gather_distributed: bool) -> torch.Tensor:
    """``ctr(q, k)`` of [0]: cross-entropy of each query against every key, the same image's key positive.

    ``q`` may stack several views of the keys' n images (multi-crop): row ``i`` is image ``i mod n``.

    Shape:
        q: (m n, D); k: (n, D); returns a scalar.
    """
    q = F.normalize(upcast(q), dim=1)
    k = k.detach()
    n = k.shape[0]
    # Without gradient: keys come from the momentum encoder. (NT-Xent's candidates are trained
    # embeddings and need sslkit.distributed.gather_with_grad.)
    k = distributed.gather_no_grad(k) if gather_distributed else k
    keys = F.normalize(upcast(k).to(q.dtype), dim=1)  # (W n, D)
    logits = (q / temperature) @ keys.T  # (m n, W n)
    image = torch.arange(q.shape[0], device=q.device) % n
    positive = image + (distributed.local_offset(n) if gather_distributed else 0)
    # Why 2 T (moco-v3#31 asks; the authors did not answer): the gradient of cross-entropy with
    # respect to the cosines is (softmax(s / T) - onehot) / T, so "* T" takes the 1/T out and the
    # gradient's scale, hence the tuned learning rate, does not change with T. The 2 makes ctr equal
    # plain cross-entropy at T = 0.5. It is a constant scale, not part of InfoNCE.
    return F.cross_entropy(logits, positive) * (2 * temperature)


def mocov3_loss(
    queries: torch.Tensor, keys: torch.Tensor, temperature: float = 0.2, gather_distributed: bool = True
) -> torch.Tensor:
    """``ctr(q1, k2) + ctr(q2, k1)``, MoCo v3's symmetric loss ([0], Algorithm 1).

    Each view's queries are contrasted with the other view's keys::

        ctr(q, k) = 2 T * mean_i -log( exp(q_i.k_i / T) / sum_j exp(q_i.k_j / T) )

    with ``q``, ``k`` L2-normalised and ``j`` over the keys of every process (gathered, without
    gradient; the positive of local query ``i`` is key ``rank * n + i``). The keys are constants:
    no gradient flows into them.

    Shape:
        queries: (2N, D), the predictor's outputs for both views, ``[q1; q2]``.
        keys: (2N, D), the momentum encoder's for the same images, ``[k1; k2]``.
        returns: scalar.
    """
    check_queries_keys(queries, keys)
    temperature = check_positive(temperature, "temperature")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    n = queries.shape[0] // 2
    with full_precision(queries.device):
        return _ctr(queries[:n], keys[n:], temperature, gather_distributed) + _ctr(
            queries[n:], keys[:n], temperature, gather_distributed
        )


def multi_view_mocov3_loss(
    queries: torch.Tensor, keys: torch.Tensor, temperature: float = 0.2, gather_distributed: bool = True
) -> torch.Tensor:
    """MoCo v3 with multi-crop: the queries of every view against the keys of each global view but their own.

    The keys come from the two global views only (the momentum encoder sees nothing else); the
    queries from every view V, the global ones and multi-crop's local ones. The loss is twice the
    mean of ``ctr`` over the ``2 (V - 1)`` pairs of a view ``v`` and a global view ``g != v``::

        L = 2 * mean_{(g, v), v != g} ctr(q_v, k_g),
        ctr(q, k) = 2 T * mean_i -log( exp(q_i.k_i / T) / sum_j exp(q_i.k_j / T) )

    the negatives of a query being the other images' keys of the same global view ``g`` (every
    process's, gathered without gradient), as in :func:`mocov3_loss`. With two views the pairs are
    (1, 2) and (2, 1) and this is :func:`mocov3_loss` exactly, ``ctr(q1, k2) + ctr(q2, k1)``; the
    mean keeps that scale for any number of local views (a sum over the pairs would grow with
    them; DINO's code averages its pairs, and so does sslkit). The keys are constants.

    Shape:
        queries: (V n, D), the predictor's outputs for every view, ``[q1; q2; local 1; ...]``.
        keys: (2n, D), the momentum encoder's for the global views, ``[k1; k2]``.
        returns: scalar.

    >>> queries, keys = torch.randn(4 * 3, 16), torch.randn(2 * 3, 16)  # 3 images, 2 global and 2 local views
    >>> multi_view_mocov3_loss(queries, keys).shape
    torch.Size([])
    """
    n, views = check_multi_view_queries_keys(queries, keys)
    temperature = check_positive(temperature, "temperature")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    query_views, key_views = queries.split(n), keys.split(n)
    with full_precision(queries.device):
        # Each global view's ctr over the V - 1 other views' queries is the mean of their V - 1 pairs:
        # the sum of the two is twice the mean over all pairs.
        terms = []
        for g in range(2):
            others = torch.cat([query_views[v] for v in range(views) if v != g])  # ((V - 1) n, D)
            terms.append(_ctr(others, key_views[g], temperature, gather_distributed))
        return terms[0] + terms[1]


class MoCoV3Loss(nn.Module):
    """MoCo v3's symmetric contrastive loss [0]; see :func:`mocov3_loss`.

    Args:
        temperature: T > 0 (MoCo v3: 0.2 for ViT; solo-learn's CIFAR ResNet-18: 0.2).
        gather_distributed: across processes, contrast each query with the keys of every process
            (MoCo v3's setting). Off: each process only sees its own batch's keys.

    Shape:
        queries, keys: (2N, D), both views stacked; returns a scalar.

    >>> loss_fn = MoCoV3Loss(temperature=0.2)
    >>> queries, keys = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss_fn(queries, keys).shape
    torch.Size([])
    """

    def __init__(self, temperature: float = 0.2, gather_distributed: bool = True) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return mocov3_loss(queries, keys, self.temperature, self.gather_distributed)

    def multi_view(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """:func:`multi_view_mocov3_loss` (multi-crop). Shape: queries: (V n, D); keys: (2n, D); returns a scalar."""
        return multi_view_mocov3_loss(queries, keys, self.temperature, self.gather_distributed)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, gather_distributed={self.gather_distributed}"
