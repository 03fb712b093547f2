"""DCLW: decoupled contrastive loss with the negative von Mises-Fisher weight on the positive term.

References:
    [0] Decoupled Contrastive Learning, Yeh et al. 2021 (ECCV 2022), https://arxiv.org/abs/2110.06848
        (eq. 6 with the weighting function w_vMF of section 3)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import distributed
from sslkit.losses._common import check_flag, check_positive, check_two_views, full_precision, upcast
from sslkit.losses.dcl import dcl_loss


@torch.no_grad()
def vmf_weights(
    z1: torch.Tensor, z2: torch.Tensor, sigma: float = 0.5, gather_distributed: bool = True
) -> torch.Tensor:
    """Negative von Mises-Fisher weights of [0] for this process's positive pairs (no gradient)::

        w_i = 2 - exp(s_i / sigma) / E_j[exp(s_j / sigma)] = 2 - N softmax(s / sigma)_i,   s_i = s(z_i^(1), z_i^(2))

    ``E_j`` is the mean over the N pairs of the batch; across processes it is the global batch
    (the positive similarities are gathered), so 2 processes weight exactly as 1 process on
    the concatenated batch. lightly's ``negative_mises_fisher_weights`` uses the local batch.
    The weights average to 1; pairs already closer than average get less pull.

    No gradient flows through ``w``: the paper defines it as a weight on the positive term,
    not as part of the objective to differentiate, and lightly detaches it too.

    Shape:
        z1, z2: (N, D). returns: (N,), in z1's (upcast) dtype.
    """
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(z1.device):
        positive = (F.normalize(upcast(z1), dim=1) * F.normalize(upcast(z2), dim=1)).sum(dim=1)  # (n,)
        n = positive.shape[0]
        offset = 0
        if gather_distributed and distributed.is_distributed():
            positive = distributed.gather_no_grad(positive)  # (N,)
            offset = distributed.local_offset(n)
        weights = 2 - positive.shape[0] * torch.softmax(positive / sigma, dim=0)
        return weights[offset : offset + n]


def dclw_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float = 0.1,
    sigma: float = 0.5,
    negatives: torch.Tensor | None = None,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """DCL (eq. 6 of [0]) with ``w = w_vMF`` on the positive term::

        L_i^(k) = -w_i s(z_i^(1), z_i^(2)) / T + log sum_{l in {1,2}, j != i} exp(s(z_i^(k), z_j^(l)) / T)
        w_i = 2 - exp(s_i / sigma) / E_j[exp(s_j / sigma)]

    averaged over the 2N anchors (or the N queries with a bank of ``negatives``), exactly as
    :func:`~sslkit.losses.dcl.dcl_loss`; ``w`` is computed by :func:`vmf_weights`.

    Shape:
        z1, z2: (N, D); negatives: (K, D) or None; returns a scalar.

    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> dclw_loss(z1, z2, temperature=0.1, sigma=0.5).shape
    torch.Size([])
    """
    check_two_views(z1, z2)
    sigma = check_positive(sigma, "sigma")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    weights = vmf_weights(z1, z2, sigma, gather_distributed)
    return dcl_loss(z1, z2, temperature, negatives, gather_distributed, positive_weight=weights)


class DCLWLoss(nn.Module):
    """Weighted decoupled contrastive loss (DCLW of [0]).

    Args:
        temperature: T > 0 dividing the cosine similarities (paper and lightly: 0.1).
        sigma: sigma > 0 of the von Mises-Fisher weight (paper and lightly: 0.5).
        gather_distributed: across processes, compare local anchors with every process's
            embeddings and weight over the global batch. lightly defaults to ``False``
            and weights over the local batch; see :class:`~sslkit.losses.dcl.DCLLoss`.

    Shape:
        z1, z2: (N, D); negatives: (K, D) or None; returns a scalar.

    >>> loss_fn = DCLWLoss(temperature=0.1, sigma=0.5)
    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss_fn(z1, z2).shape
    torch.Size([])
    """

    def __init__(self, temperature: float = 0.1, sigma: float = 0.5, gather_distributed: bool = True) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.sigma = check_positive(sigma, "sigma")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, z1: torch.Tensor, z2: torch.Tensor, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return dclw_loss(z1, z2, self.temperature, self.sigma, negatives, self.gather_distributed)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, sigma={self.sigma}, gather_distributed={self.gather_distributed}"
