"""CoCo (congenerous cosine): features scaled to radius alpha, softmax over cosines to class centroids.

References:
    [0] COCO v2, Liu, Li and Wang 2017, "Rethinking Feature Discrimination and Polymerization
        for Large-scale Recognition", https://arxiv.org/abs/1710.00870
    [1] COCO v1, Liu, Li and Wang 2017, "Learning Deep Features via Congenerous Cosine Loss for
        Person Recognition", https://arxiv.org/abs/1702.06890
"""

from __future__ import annotations

from sslkit.losses._common import check_positive
from sslkit.losses.margin_softmax import MarginSoftmaxHead


class CoCoHead(MarginSoftmaxHead):
    """Congenerous cosine loss: learned class centroids ``c_j``, features normalised to radius alpha.

    ::

        x_hat_i = alpha * x_i / ||x_i||,      c_hat_j = c_j / ||c_j||
        loss = mean_i -log( exp(c_hat_{y_i} . x_hat_i) / sum_j exp(c_hat_j . x_hat_i) )

    The centroids are the head's ``weight`` (C, D). Mathematically this is the normalised softmax
    with scale ``alpha``; COCO's point [0] is reading the weights as class centroids and choosing
    ``alpha`` large enough that the target probability can approach 1. Even in the best case
    (target cosine 1, centroids a regular simplex so every other cosine is ``-1/(C - 1)``) a
    target probability ``p`` needs ``alpha >= (C - 1)/C * log((C - 1) p / (1 - p))`` (the same
    bound NormFace derives for its scale), so raise ``alpha`` with the number of classes. The
    default 6.25 is the value of the widely used PyTorch re-implementation
    (YirongMao/softmax_variants, MNIST); for C = 10 it caps ``p`` at about 0.991.
    pytorch-metric-learning has no CoCo loss.

    Args:
        embedding_dim: D.
        num_classes: C.
        alpha: radius of the normalised features, > 0.

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar; ``logits``: (N, C) = alpha cos.

    >>> import torch
    >>> head = CoCoHead(embedding_dim=16, num_classes=10, alpha=6.25)
    >>> head(torch.randn(8, 16), torch.randint(0, 10, (8,))).shape
    torch.Size([])
    """

    def __init__(self, embedding_dim: int, num_classes: int, alpha: float = 6.25) -> None:
        super().__init__(embedding_dim, num_classes)
        self.alpha = check_positive(alpha, "alpha")
        self.scale = self.alpha

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, alpha={self.alpha}"
