"""DCL: NT-Xent with the positive pair taken out of the denominator.

References:
    [0] Decoupled Contrastive Learning, Yeh et al. 2021 (ECCV 2022), https://arxiv.org/abs/2110.06848 (eq. 6)
    [1] SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709 (eq. 1)
    [2] MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722 (eq. 1)
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit import distributed
from sslkit.losses._common import check_flag, check_negatives, check_positive, check_two_views, full_precision, upcast
from sslkit.losses._fused import bank_softmax_ce, two_view_softmax_ce


def dcl_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float = 0.1,
    negatives: torch.Tensor | None = None,
    gather_distributed: bool = True,
    positive_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decoupled contrastive loss over 2N anchors, or over N queries against a bank of ``negatives``.

    Without ``negatives`` (eq. 6 of [0], with ``w = 1`` unless ``positive_weight`` is given):
    every one of the 2N embeddings is an anchor ``z_i^(k)``, its positive ``z_i^(3-k)`` is the
    other view of the same image, and the denominator holds the 2N - 2 embeddings of the
    *other* images only (the positive is removed: the "decoupling")::

        L_i^(k) = -w_i s(z_i^(1), z_i^(2)) / T + log sum_{l in {1,2}, j != i} exp(s(z_i^(k), z_j^(l)) / T)

        loss = 1/(2N) sum_{k, i} L_i^(k)

    The paper writes the sum over ``k`` and ``i``; this is its mean over the 2N anchors, the
    same scale as :func:`~sslkit.losses.ntxent.ntxent_loss`. lightly's ``DCLLoss`` returns the
    mean of the two view directions, each a mean over N anchors, which is the same number.

    With ``negatives`` (MoCo-style bank): ``z1`` are queries, ``z2`` their keys, and the
    denominator is the bank only (the positive is never in it)::

        l_i = -w_i s(q_i, k_i) / T + log sum_j exp(s(q_i, n_j) / T),   loss = mean_i l_i

    ``s`` is the cosine similarity (inputs are L2-normalised here). Across processes the
    candidates are gathered with gradient and the positives offset by ``rank * N``; see
    :mod:`sslkit.distributed` for the gradient convention.

    Cost: one (2n, 2N) matmul forward, an in-place ``exp`` and a row sum (and a row maximum
    when T < 1/60); backward, two matmuls, or in one process one matmul and one pass over the
    (2N, 2N) matrix, which is symmetric there (see :mod:`sslkit.losses._fused`).

    Args:
        z1, z2: the two views.
        temperature: T > 0.
        negatives: optional bank of negatives (detach them if they are constants).
        gather_distributed: compare local anchors with every process's embeddings.
        positive_weight: ``w_i`` of eq. 6, one weight per image of this process, applied to the
            positive term of both of its anchors. ``None`` is ``w = 1`` (plain DCL).
            :func:`~sslkit.losses.dclw.dclw_loss` passes the von Mises-Fisher weights here.

    Shape:
        z1, z2: (N, D) embeddings of two views of the same N images.
        negatives: (K, D), K >= 1, optional.
        positive_weight: (N,), optional.
        returns: scalar.

    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> dcl_loss(z1, z2, temperature=0.1).shape
    torch.Size([])
    """
    check_two_views(z1, z2)
    temperature = check_positive(temperature, "temperature")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    check_negatives(negatives, z1.shape[1])
    if negatives is not None and negatives.shape[0] < 1:
        raise ValueError("negatives must hold at least one embedding: DCL's denominator has only negatives")
    n = z1.shape[0]
    if positive_weight is not None and positive_weight.shape != (n,):
        raise ValueError(f"positive_weight must have shape ({n},), got {tuple(positive_weight.shape)}")
    inv_t = 1.0 / temperature
    with full_precision(z1.device):
        dtype = torch.promote_types(upcast(z1).dtype, upcast(z2).dtype)
        z1, z2 = upcast(z1).to(dtype), upcast(z2).to(dtype)
        weight = None if positive_weight is None else positive_weight.to(dtype)
        if negatives is not None:
            # the bank alone is the denominator: the key never enters it
            bank = upcast(negatives).to(dtype)
            return bank_softmax_ce(z1, z2, bank, inv_t, exclude_positive=True, positive_weight=weight)
        images = n * distributed.world_size() if gather_distributed else n  # in the denominators, all processes
        if images < 2:
            # With one image the denominator is empty: log(0) = -inf is no loss to train on.
            raise ValueError("z1 and z2 must hold at least 2 samples in all (DCL needs a negative), got 1")
        # The anchor and its positive are left out of the denominator.
        return two_view_softmax_ce(
            z1, z2, inv_t, exclude_positive=True, gather_distributed=gather_distributed, positive_weight=weight
        )


class DCLLoss(nn.Module):
    """Decoupled contrastive loss (DCL, eq. 6 of [0] with ``w = 1``).

    NT-Xent without the positive in the denominator, which removes the negative-positive
    coupling that makes NT-Xent's gradient shrink for small batches ([0], section 3).
    With ``negatives``, a MoCo-style bank is the denominator.

    Args:
        temperature: T > 0 dividing the cosine similarities. 0.1 is the paper's and lightly's
            default.
        gather_distributed: across processes, compare local anchors with every process's
            embeddings. lightly defaults to ``False``; sslkit defaults to ``True`` because
            the paper's batch is the global batch, and the gradient flows through the gather
            (see :mod:`sslkit.distributed`).

    Shape:
        z1, z2: (N, D); negatives: (K, D) or None; returns a scalar.

    >>> loss_fn = DCLLoss(temperature=0.1)
    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss_fn(z1, z2).shape
    torch.Size([])
    """

    def __init__(self, temperature: float = 0.1, gather_distributed: bool = True) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, z1: torch.Tensor, z2: torch.Tensor, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return dcl_loss(z1, z2, self.temperature, negatives, self.gather_distributed)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, gather_distributed={self.gather_distributed}"
