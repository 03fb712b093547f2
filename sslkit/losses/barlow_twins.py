"""Barlow Twins: the cross-correlation of the two views' standardised features driven to the identity.

References:
    [0] Barlow Twins, Zbontar et al. 2021, https://arxiv.org/abs/2103.03230 (eq. 1 and 2, Algorithm 1)
    [1] The authors' code, https://github.com/facebookresearch/barlowtwins (main.py)
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from sslkit.losses._common import (
    check_batch_for_statistics,
    check_flag,
    check_nonnegative,
    check_two_views,
    check_views,
    full_precision,
    gather_every_view,
    gather_views,
    global_view_view_pairs,
    upcast,
)

# BatchNorm's epsilon: the authors' code standardises with an affine-free BatchNorm1d.
EPS = 1e-5


def _standardise(z: torch.Tensor) -> torch.Tensor:
    """Each feature to mean 0 and variance 1 over the batch, with the biased variance (BatchNorm's).

    Shape:
        z: (N, D); returns (N, D).
    """
    centred = z - z.mean(dim=0)
    return centred / torch.sqrt(centred.square().mean(dim=0) + EPS)


def barlow_twins_loss(
    z1: torch.Tensor, z2: torch.Tensor, off_diagonal_weight: float = 5e-3, gather_distributed: bool = True
) -> torch.Tensor:
    """Eq. 1 of [0] over the global batch::

        C_ij = sum_b zn1_bi zn2_bj / N                                        (eq. 2)
        L = sum_i (1 - C_ii)^2 + lambda sum_i sum_{j != i} C_ij^2             (eq. 1)

    ``zn`` is ``z`` with each feature standardised over the N images of the batch:
    ``(z - mean) / sqrt(var + 1e-5)`` with the biased variance, as BatchNorm without affine
    parameters computes it in the authors' code and in lightly. But for the 1e-5, ``C`` is then
    eq. 2's cosine between the centred feature columns. (The paper's pseudo-code, Algorithm 1,
    divides by ``z.std(0)``, the unbiased standard deviation, which scales ``C`` by
    ``(N - 1) / N``.) ``lambda`` is ``off_diagonal_weight``.

    Across processes, the statistics and ``C`` are those of the global batch: both views are
    gathered with gradient and every process computes the loss of all of it (see
    :func:`~sslkit.losses._common.gather_views`), so two processes train what one process
    does on their concatenated batches. (lightly's ``gather_distributed`` standardises each
    process's batch by its own statistics and averages the matrices ``C``: another loss.)

    Shape:
        z1, z2: (n, D) embeddings of two views of the same n images; at least 2 images over
            all processes.
        returns: scalar.

    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> barlow_twins_loss(z1, z2).shape
    torch.Size([])
    """
    check_two_views(z1, z2)
    weight = check_nonnegative(off_diagonal_weight, "off_diagonal_weight")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(z1.device):
        dtype = torch.promote_types(upcast(z1).dtype, upcast(z2).dtype)
        z1, z2 = gather_views(upcast(z1).to(dtype), upcast(z2).to(dtype), gather_distributed)
        n = z1.shape[0]
        check_batch_for_statistics(n, "Barlow Twins standardises each feature over the batch")
        return _redundancy_reduction(_standardise(z1), _standardise(z2), weight)


def _redundancy_reduction(zn1: torch.Tensor, zn2: torch.Tensor, weight: float) -> torch.Tensor:
    """Eq. 1 of [0] on standardised features: ``C = zn1^T zn2 / N`` driven to the identity.

    Shape:
        zn1, zn2: (N, D), each feature standardised over the N images; returns a scalar.
    """
    c = zn1.T @ zn2 / zn1.shape[0]  # (D, D)
    diagonal = c.diagonal()
    on_diagonal = (1 - diagonal).square().sum()
    off_diagonal = c.square().sum() - diagonal.square().sum()
    return on_diagonal + weight * off_diagonal


def multi_view_barlow_twins_loss(
    views, off_diagonal_weight: float = 5e-3, gather_distributed: bool = True
) -> torch.Tensor:
    """Barlow Twins with multi-crop: the mean of eq. 1 of [0] over the pairs of a global view and another view.

    With two global views and L local ones (V = 2 + L) the pairs are (1, 2), (1, l) and (2, l), each
    unordered pair once (eq. 1 is symmetric in its two views), ``1 + 2 L`` of them::

        L = mean_{(g, v)} L_BT(z_g, z_v),    L_BT of :func:`barlow_twins_loss`

    Two local views are not compared with each other: as in DINO's and SwAV's multi-crop, the
    global views are the targets. Each view is standardised over the global batch (every
    process's images, gathered with gradient) once, and each pair's cross-correlation is taken
    over the global batch, as for two views. With two views this is :func:`barlow_twins_loss`
    exactly; the mean keeps its scale for any number of local views (a sum over the pairs would
    grow with them; DINO's code averages its pairs, and so does sslkit).

    Shape:
        views: V >= 2 tensors (n, D), the same n images in the same order in each, the two global
            views first; at least 2 images over all processes.
        returns: scalar.

    >>> views = torch.randn(4, 8, 16)  # 2 global and 2 local views of 8 images
    >>> multi_view_barlow_twins_loss(list(views)).shape
    torch.Size([])
    """
    check_views(views)
    weight = check_nonnegative(off_diagonal_weight, "off_diagonal_weight")
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(views[0].device):
        dtype = functools.reduce(torch.promote_types, [upcast(view).dtype for view in views])
        views = gather_every_view([upcast(view).to(dtype) for view in views], gather_distributed)
        check_batch_for_statistics(views[0].shape[0], "Barlow Twins standardises each feature over the batch")
        standardised = [_standardise(view) for view in views]
        pairs = global_view_view_pairs(len(views))
        return torch.stack([_redundancy_reduction(standardised[g], standardised[v], weight) for g, v in pairs]).mean()


class BarlowTwinsLoss(nn.Module):
    """Barlow Twins' redundancy-reduction loss [0]; see :func:`barlow_twins_loss`.

    Args:
        off_diagonal_weight: ``lambda`` of eq. 1, the weight of the redundancy term. 5e-3 is the
            paper's (tuned with 8192 features) and lightly's ``lambda_param``.
        gather_distributed: standardise and correlate over the global batch of every process, as
            the authors' code does (a synchronised BatchNorm and a summed ``C``). Off: each
            process uses its own batch's statistics.

    Shape:
        z1, z2: (N, D); returns a scalar.

    >>> loss_fn = BarlowTwinsLoss()
    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss_fn(z1, z2).shape
    torch.Size([])
    """

    def __init__(self, off_diagonal_weight: float = 5e-3, gather_distributed: bool = True) -> None:
        super().__init__()
        self.off_diagonal_weight = check_nonnegative(off_diagonal_weight, "off_diagonal_weight")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return barlow_twins_loss(z1, z2, self.off_diagonal_weight, self.gather_distributed)

    def multi_view(self, *views: torch.Tensor) -> torch.Tensor:
        """:func:`multi_view_barlow_twins_loss` of V >= 2 views. Shape: views: V (n, D); returns scalar."""
        return multi_view_barlow_twins_loss(views, self.off_diagonal_weight, self.gather_distributed)

    def extra_repr(self) -> str:
        return f"off_diagonal_weight={self.off_diagonal_weight}, gather_distributed={self.gather_distributed}"
