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
from sslkit.losses._common import check_flag, check_positive, check_queries_keys, full_precision, upcast


def _ctr(q: torch.Tensor, k: torch.Tensor, temperature: float, gather_distributed: bool) -> torch.Tensor:
    """``ctr(q, k)`` of [0]: cross-entropy of each query against every key, the same row's key positive.

    Shape:
        q, k: (n, D); returns a scalar.
    """
    q = F.normalize(upcast(q), dim=1)
    k = k.detach()
    # Without gradient: keys come from the momentum encoder. (NT-Xent's candidates are trained
    # embeddings and need sslkit.distributed.gather_with_grad.)
    k = distributed.gather_no_grad(k) if gather_distributed else k
    keys = F.normalize(upcast(k).to(q.dtype), dim=1)  # (W n, D)
    n = q.shape[0]
    logits = (q / temperature) @ keys.T  # (n, W n)
    positive = torch.arange(n, device=q.device) + (distributed.local_offset(n) if gather_distributed else 0)
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

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, gather_distributed={self.gather_distributed}"
