"""VICReg: invariance, variance and covariance terms, the statistics over the global batch.

References:
    [0] VICReg, Bardes, Ponce, LeCun 2022, https://arxiv.org/abs/2105.04906 (eq. 1-6)
    [1] The authors' code, https://github.com/facebookresearch/vicreg (main_vicreg.py)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.losses._common import (
    check_batch_for_statistics,
    check_flag,
    check_nonnegative,
    check_two_views,
    full_precision,
    gather_views,
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
    weights = [
        check_nonnegative(value, name)
        for value, name in [
            (invariance_weight, "invariance_weight"),
            (variance_weight, "variance_weight"),
            (covariance_weight, "covariance_weight"),
        ]
    ]
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
        self.invariance_weight = check_nonnegative(invariance_weight, "invariance_weight")
        self.variance_weight = check_nonnegative(variance_weight, "variance_weight")
        self.covariance_weight = check_nonnegative(covariance_weight, "covariance_weight")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return vicreg_loss(
            z1, z2, self.invariance_weight, self.variance_weight, self.covariance_weight, self.gather_distributed
        )

    def extra_repr(self) -> str:
        return (
            f"invariance_weight={self.invariance_weight}, variance_weight={self.variance_weight}, "
            f"covariance_weight={self.covariance_weight}, gather_distributed={self.gather_distributed}"
        )
