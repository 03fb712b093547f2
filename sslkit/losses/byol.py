"""BYOL's loss: normalised MSE of the online predictions against the target network's projections.

References:
    [0] BYOL, Grill et al. 2020, https://arxiv.org/abs/2006.07733 (eq. 2, symmetrised as in section 3.1)
    [1] lightly's BYOL example, examples/pytorch/byol.py in https://github.com/lightly-ai/lightly
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


def byol_loss(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``L + L~`` of [0]: each view's prediction against the other view's target, both directions summed.

    For the prediction ``q`` of one view and the target projection ``z'`` of the other (eq. 2)::

        L = mean_i || q_i / ||q_i|| - z'_i / ||z'_i|| ||^2 = mean_i (2 - 2 cos(q_i, z'_i))

    and ``L~`` is the same with the views swapped. The sum, as the paper trains; lightly's
    example averages the two negative cosines instead, ``-(cos_1 + cos_2) / 2``: the same
    minimum and the same direction, with a gradient 4 times smaller, so the learning rates of
    the two are not interchangeable. sslkit follows the paper, whose learning rates the recipes
    quote. The keys are constants (the momentum encoder's): no gradient flows into them.

    Shape:
        queries: (2N, D), the online network's predictions for both views, ``[q1; q2]``.
        keys: (2N, D), the target network's projections of the same images, ``[z'1; z'2]``.
        returns: scalar, in [0, 8].

    >>> queries, keys = torch.randn(8, 16), torch.randn(8, 16)
    >>> byol_loss(queries, keys).shape
    torch.Size([])
    """
    check_queries_keys(queries, keys)
    with full_precision(queries.device):
        cosine = cross_view_cosine(queries, keys)  # (2N,)
        # mean over N of each direction, summed: twice the mean over all 2N rows
        return 2 * (2 - 2 * cosine).mean()


def multi_view_byol_loss(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """BYOL with multi-crop: the prediction of every view against the target of each global view but its own.

    The targets come from the two global views only (the target network sees nothing else); the
    predictions from every view V, the global ones and multi-crop's local ones. Each pair of a view
    ``v`` and a global view ``g != v`` is eq. 2's normalised MSE, and the loss is twice their mean::

        L = 2 * mean_{(g, v), v != g} mean_i || q_vi / ||q_vi|| - z'_gi / ||z'_gi|| ||^2

    over the ``2 (V - 1)`` pairs. With two views the pairs are (1, 2) and (2, 1) and this is
    :func:`byol_loss` exactly, ``L + L~``; the mean keeps that scale for any number of local
    views, so the learning rates tuned for two views still hold. solo-learn sums the pairs
    instead (its loss and gradient grow with the number of local views); DINO's code averages
    its pairs, and so does sslkit. The keys are constants: no gradient flows into them.

    Shape:
        queries: (V n, D), the online predictions for every view, ``[q1; q2; local 1; ...]``.
        keys: (2n, D), the target network's projections of the global views, ``[z'1; z'2]``.
        returns: scalar, in [0, 8].

    >>> queries, keys = torch.randn(4 * 3, 16), torch.randn(2 * 3, 16)  # 3 images, 2 global and 2 local views
    >>> multi_view_byol_loss(queries, keys).shape
    torch.Size([])
    """
    queries, keys = global_view_pairs(queries, keys)  # (2 (V - 1) n, D) each, row for row
    with full_precision(queries.device):
        return 2 * (2 - 2 * pair_cosine(queries, keys)).mean()


class BYOLLoss(nn.Module):
    """BYOL's symmetric normalised MSE [0]; see :func:`byol_loss`.

    No settings, and nothing gathered across processes: each image's term needs only its own
    prediction and target, so the mean over processes of the per-process losses is the loss of
    the whole batch.

    Shape:
        queries, keys: (2N, D), both views stacked; returns a scalar.

    >>> loss_fn = BYOLLoss()
    >>> queries, keys = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss_fn(queries, keys).shape
    torch.Size([])
    """

    def __init__(self) -> None:  # declared, so that build() refuses any argument by name
        super().__init__()

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return byol_loss(queries, keys)

    def multi_view(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """:func:`multi_view_byol_loss` (multi-crop). Shape: queries: (V n, D); keys: (2n, D); returns a scalar."""
        return multi_view_byol_loss(queries, keys)
