"""SimSiam's loss: negative cosine of each view's prediction with the other view's stopped projection.

References:
    [0] SimSiam, Chen and He 2020, https://arxiv.org/abs/2011.10566 (section 3 and Algorithm 1)
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit.losses._common import check_queries_keys, cross_view_cosine, full_precision


def simsiam_loss(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``1/2 D(p1, stopgrad(z2)) + 1/2 D(p2, stopgrad(z1))`` ([0], section 3), averaged over the batch.

    ``D`` is the negative cosine similarity::

        D(p, z) = - p / ||p|| . z / ||z||

    The two directions are averaged (the paper's 1/2), so the loss lies in [-1, 1], as lightly's
    ``NegativeCosineSimilarity`` used as in its SimSiam example. The stop-gradient is applied
    here: ``keys`` are the same encoder's projections, passed with their gradient, and detached
    by the loss; without it SimSiam collapses ([0], section 4.1).

    Shape:
        queries: (2N, D), the predictor's outputs for both views, ``[p1; p2]``.
        keys: (2N, D), the projections of the same images, ``[z1; z2]``.
        returns: scalar, in [-1, 1].

    >>> queries, keys = torch.randn(8, 16), torch.randn(8, 16)
    >>> simsiam_loss(queries, keys).shape
    torch.Size([])
    """
    check_queries_keys(queries, keys)
    with full_precision(queries.device):
        return -cross_view_cosine(queries, keys).mean()  # the mean over 2N rows is the mean of both directions


class SimSiamLoss(nn.Module):
    """SimSiam's symmetric negative cosine with the stop-gradient [0]; see :func:`simsiam_loss`.

    No settings, and nothing gathered across processes: each image's term needs only its own
    prediction and projection.

    Shape:
        queries, keys: (2N, D), both views stacked; returns a scalar.

    >>> loss_fn = SimSiamLoss()
    >>> queries, keys = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss_fn(queries, keys).shape
    torch.Size([])
    """

    def __init__(self) -> None:  # declared, so that build() refuses any argument by name
        super().__init__()

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return simsiam_loss(queries, keys)
