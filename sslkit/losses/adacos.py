"""AdaCos with its fixed scale: cosine logits, no margin, ``s = sqrt(2) log(C - 1)``.

References:
    [0] AdaCos, Zhang et al. 2019, https://arxiv.org/abs/1905.00292 (the fixed scale)
"""

from __future__ import annotations

import math

from sslkit.losses.head import check_positive_int
from sslkit.losses.margin_softmax import MarginSoftmaxHead
from sslkit.losses.partial_fc import partial_fc_repr, sharding_of


def adacos_fixed_scale(num_classes: int) -> float:
    """``s_f = sqrt(2) log(C - 1)``, AdaCos's hyperparameter-free scale (needs C >= 3)."""
    return math.sqrt(2) * math.log(num_classes - 1)


class AdaCosHead(MarginSoftmaxHead):
    """Normalised softmax whose scale is set from the number of classes, no margin ([0])::

        s = sqrt(2) log(C - 1)
        loss_i = -log( exp(s cos theta_y) / sum_j exp(s cos theta_j) )

    [0] chooses ``s`` so that the target probability rises steeply around ``theta_y = pi/4``
    when the other classes are near-orthogonal (``cos theta_j`` about 0). For C = 10,000 this
    gives s = 13.0 (ArcFace uses 64).
    pytorch-metric-learning has no AdaCos; the dynamic variant is :class:`AdaCosDynamicHead`.

    Args:
        embedding_dim: D.
        num_classes: C >= 3 (``log(C - 1)`` must be > 0).
        partial_fc: shard the class weights across processes and sample them each step
            (Partial FC, :mod:`sslkit.losses.partial_fc`); the scale still follows the whole C.
        sample_rate: with ``partial_fc``, the share of each process's classes kept per step.

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar; ``logits``: (N, C) = s cos.

    >>> head = AdaCosHead(embedding_dim=16, num_classes=10)
    >>> round(head.scale, 3)
    3.107
    """

    def __init__(
        self, embedding_dim: int, num_classes: int, partial_fc: bool = False, sample_rate: float = 1.0
    ) -> None:
        num_classes = check_positive_int(num_classes, "num_classes", minimum=3)
        super().__init__(embedding_dim, num_classes, sharding_of(num_classes, partial_fc, sample_rate))
        self.scale = adacos_fixed_scale(self.num_classes)

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, scale={self.scale:.4f}"
            + partial_fc_repr(self.partial_fc)
        )
