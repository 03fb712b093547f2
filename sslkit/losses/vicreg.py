"""VICReg: invariance, variance and covariance terms, the statistics over the global batch.

References:
    [0] VICReg, Bardes, Ponce, LeCun 2022, https://arxiv.org/abs/2105.04906 (eq. 1-6)
    [1] The authors' code, https://github.com/facebookresearch/vicreg (main_vicreg.py)
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
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

# gamma, the target standard deviation, and epsilon inside its square root (eq. 1-2 of [0]).
GAMMA = 1.0
EPS = 1e-4


def _variance(z: torch.Tensor) -> torch.Tensor:
    """``v(Z) = 1/D sum_j max(0, gamma - sqrt(Var(z^j) + eps))`` (eq. 1-2), the unbiased variance.

    Shape:
        z: (N, D); returns a scalar.
    """
    return F.relu(GAMMA - torch.sqrt(z.var(dim=0) + EPS)).mean()


def _covariance(z: torch.Tensor) -> torch.Tensor:
    """``c(Z) = 1/D sum_{i != j} C(Z)_ij^2``, ``C(Z) = 1/(N - 1) sum_b (z_b - mean)(z_b - mean)^T`` (eq. 3-4).

    Shape:
        z: (N, D); returns a scalar.
    """
    centred = z - z.mean(dim=0)
    cov = centred.T @ centred / (z.shape[0] - 1)  # (D, D)
    return (cov.square().sum() - cov.diagonal().square().sum()) / z.shape[1]


def _checked_weights(invariance: float, variance: float, covariance: float) -> tuple[float, float, float]:
    """``(lambda, mu, nu)``, each checked to be a non-negative number."""
    return (
        check_nonnegative(invariance, "invariance_weight"),
        check_nonnegative(variance, "variance_weight"),
        check_nonnegative(covariance, "covariance_weight"),
    )


def vicreg_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    invariance_weight: float = 25.0,
    variance_weight: float = 25.0,
    covariance_weight: float = 1.0,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """VICReg's loss as the authors' code computes it::

        s = 1/(N D) sum_b ||z1_b - z2_b||^2
        v = (v(Z1) + v(Z2)) / 2,   v(Z) = 1/D sum_j max(0, 1 - sqrt(Var(z^j) + 1e-4))
        c = c(Z1) + c(Z2),         c(Z) = 1/D sum_{i != j} C(Z)_ij^2,  C(Z) = Zc^T Zc / (N - 1)
        L = lambda s + mu v + nu c

    with ``lambda, mu, nu`` the three weights, the unbiased variance, and ``Zc`` the embeddings
    centred over the batch. The paper's equations sum where this averages: eq. 5 sums the
    squared distance over the D features (``s`` here is that over D) and eq. 6 adds
    ``v(Z) + v(Z')`` (halved here). sslkit follows the code, and lightly, because the published
    weights 25 / 25 / 1 were tuned with it.

    Across processes, ``v`` and ``c`` are statistics of the global batch: both views are gathered
    with gradient and every process computes them on all of it (see
    :func:`~sslkit.losses._common.gather_views`). ``s`` is a mean over images, so each process
    takes it over its own (the mean over processes is the global one), as the authors' code does.

    Shape:
        z1, z2: (n, D) embeddings of two views of the same n images; at least 2 images over
            all processes.
        returns: scalar.

    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> vicreg_loss(z1, z2).shape
    torch.Size([])
    """
    check_two_views(z1, z2)
    weights = _checked_weights(invariance_weight, variance_weight, covariance_weight)
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    with full_precision(z1.device):
        dtype = torch.promote_types(upcast(z1).dtype, upcast(z2).dtype)
        z1, z2 = upcast(z1).to(dtype), upcast(z2).to(dtype)
        invariance = (z1 - z2).square().mean()
        z1, z2 = gather_views(z1, z2, gather_distributed)
        check_batch_for_statistics(
            z1.shape[0], "VICReg's variance and covariance are over the batch (divided by N - 1)"
        )
        variance = (_variance(z1) + _variance(z2)) / 2
        covariance = _covariance(z1) + _covariance(z2)
        return weights[0] * invariance + weights[1] * variance + weights[2] * covariance


def multi_view_vicreg_loss(
    views,
    invariance_weight: float = 25.0,
    variance_weight: float = 25.0,
    covariance_weight: float = 1.0,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """VICReg with multi-crop: the mean of :func:`vicreg_loss` over the pairs of a global view and another view.

    With two global views and L local ones (V = 2 + L) the pairs are (1, 2), (1, l) and (2, l), each
    unordered pair once (the loss is symmetric in its two views), ``1 + 2 L`` of them::

        L = mean_{(g, v)} lambda s(Z_g, Z_v) + mu (v(Z_g) + v(Z_v)) / 2 + nu (c(Z_g) + c(Z_v))

    with ``s``, ``v`` and ``c`` those of :func:`vicreg_loss`. Two local views are not compared with
    each other: as in DINO's and SwAV's multi-crop, the global views are the targets. The variance
    and covariance of a view are statistics of the global batch (every process's images, gathered
    with gradient), computed once per view; a view's terms count in every pair it is in, so a global
    view's variance and covariance weigh ``L + 1`` times, a local view's once. ``s`` is a mean over
    each process's own images, as for two views. With two views this is :func:`vicreg_loss`
    exactly; the mean keeps its scale for any number of local views (a sum over the pairs would
    grow with them; DINO's code averages its pairs, and so does sslkit).

    Shape:
        views: V >= 2 tensors (n, D), the same n images in the same order in each, the two global
            views first; at least 2 images over all processes.
        returns: scalar.

    >>> views = torch.randn(4, 8, 16)  # 2 global and 2 local views of 8 images
    >>> multi_view_vicreg_loss(list(views)).shape
    torch.Size([])
    """
    check_views(views)
    weights = _checked_weights(invariance_weight, variance_weight, covariance_weight)
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    pairs = global_view_view_pairs(len(views))
    with full_precision(views[0].device):
        dtype = functools.reduce(torch.promote_types, [upcast(view).dtype for view in views])
        views = [upcast(view).to(dtype) for view in views]
        invariance = [(views[g] - views[v]).square().mean() for g, v in pairs]  # over this process's images
        views = gather_every_view(views, gather_distributed)
        check_batch_for_statistics(
            views[0].shape[0], "VICReg's variance and covariance are over the batch (divided by N - 1)"
        )
        variance = [_variance(view) for view in views]
        covariance = [_covariance(view) for view in views]
        terms = [
            weights[0] * s
            + weights[1] * ((variance[g] + variance[v]) / 2)
            + weights[2] * (covariance[g] + covariance[v])
            for s, (g, v) in zip(invariance, pairs)
        ]
        return torch.stack(terms).mean()


class VICRegLoss(nn.Module):
    """VICReg's variance-invariance-covariance loss [0]; see :func:`vicreg_loss`.

    Args:
        invariance_weight: ``lambda``, the weight of the invariance (mean squared error) term.
        variance_weight: ``mu``, the weight of the variance (hinge on the standard deviation) term.
        covariance_weight: ``nu``, the weight of the covariance (off-diagonal) term. 25 / 25 / 1 are
            the paper's and lightly's ``lambda_param`` / ``mu_param`` / ``nu_param``.
        gather_distributed: variance and covariance over the global batch of every process, as the
            authors' code does. Off: over each process's own batch.

    Shape:
        z1, z2: (N, D); returns a scalar.

    >>> loss_fn = VICRegLoss()
    >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss_fn(z1, z2).shape
    torch.Size([])
    """

    def __init__(
        self,
        invariance_weight: float = 25.0,
        variance_weight: float = 25.0,
        covariance_weight: float = 1.0,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.invariance_weight, self.variance_weight, self.covariance_weight = _checked_weights(
            invariance_weight, variance_weight, covariance_weight
        )
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return vicreg_loss(
            z1, z2, self.invariance_weight, self.variance_weight, self.covariance_weight, self.gather_distributed
        )

    def multi_view(self, *views: torch.Tensor) -> torch.Tensor:
        """:func:`multi_view_vicreg_loss` of V >= 2 views (multi-crop). Shape: views: V (n, D); returns a scalar."""
        return multi_view_vicreg_loss(
            views, self.invariance_weight, self.variance_weight, self.covariance_weight, self.gather_distributed
        )

    def extra_repr(self) -> str:
        return (
            f"invariance_weight={self.invariance_weight}, variance_weight={self.variance_weight}, "
            f"covariance_weight={self.covariance_weight}, gather_distributed={self.gather_distributed}"
        )
