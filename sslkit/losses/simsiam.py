"""SimSiam's loss: negative cosine of each view's prediction with the other view's stopped projection.

References:
    [0] SimSiam, Chen and He 2020, https://arxiv.org/abs/2011.10566 (section 3 and Algorithm 1)
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit.losses._common import (
    check_queries_keys,
    cross_view_cosine,
    full_precision,
    global_view_pairs,
    pair_cosine,
)


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


def multi_view_simsiam_loss(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """SimSiam with multi-crop: the prediction of every view against the stopped projection of each global
    view but its own.

    The targets are the projections of the two global views, detached here; the predictions come
    from every view V, the global ones and multi-crop's local ones. The loss is the mean of ``D``
    over the ``2 (V - 1)`` pairs of a view ``v`` and a global view ``g != v``::

        L = mean_{(g, v), v != g} mean_i D(p_vi, stopgrad(z_gi)),    D(p, z) = - p / ||p|| . z / ||z||

    With two views the pairs are (1, 2) and (2, 1) and this is :func:`simsiam_loss` exactly; the
    mean keeps its scale, in [-1, 1], for any number of local views (a sum over the pairs would
    grow with them; DINO's code averages its pairs, and so does sslkit).

    Shape:
        queries: (V n, D), the predictor's outputs for every view, ``[p1; p2; local 1; ...]``.
        keys: (2n, D), the projections of the global views, ``[z1; z2]``.
        returns: scalar, in [-1, 1].

    >>> queries, keys = torch.randn(4 * 3, 16), torch.randn(2 * 3, 16)  # 3 images, 2 global and 2 local views
    >>> multi_view_simsiam_loss(queries, keys).shape
    torch.Size([])
    """
    queries, keys = global_view_pairs(queries, keys)  # (2 (V - 1) n, D) each, row for row
    with full_precision(queries.device):
        return -pair_cosine(queries, keys).mean()  # pair_cosine detaches the keys: the stop-gradient


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

    def multi_view(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """:func:`multi_view_simsiam_loss` (multi-crop). Shape: queries: (V n, D); keys: (2n, D); returns a scalar."""
        return multi_view_simsiam_loss(queries, keys)
