"""CosFace / AM-Softmax: an additive cosine margin, ``s (cos theta_y - m)``.

References:
    [0] CosFace, Wang et al. 2018, https://arxiv.org/abs/1801.09414 (eq. 4, LMCL)
    [1] AM-Softmax, Wang et al. 2018, https://arxiv.org/abs/1801.05599 (the same loss, s = 30)
    [2] Partial FC, An et al. 2022, https://arxiv.org/abs/2203.15565
"""

from __future__ import annotations

import torch

from sslkit.losses._common import as_number, check_positive
from sslkit.losses.margin_softmax import MarginSoftmaxHead
from sslkit.losses.partial_fc import partial_fc_repr, sharding_of


def cosface_target_logit(cos_target: torch.Tensor, margin: float) -> torch.Tensor:
    """``cos theta_y - m``. Shape: (N,) -> (N,)."""
    return cos_target - margin


class CosFaceHead(MarginSoftmaxHead):
    """Large margin cosine loss (LMCL), eq. 4 of [0] (arXiv 1801.09414)::

        loss_i = -log( exp(s (cos theta_y - m)) / (exp(s (cos theta_y - m)) + sum_{j != y} exp(s cos theta_j)) )

    with ``cos theta_j`` between the normalised embedding and normalised class weight ``W_j``.
    Defaults ``s = 64, m = 0.35`` are the paper's (and pytorch-metric-learning ``CosFaceLoss``'s);
    AM-Softmax [1] is the same loss with ``s = 30``.

    Args:
        embedding_dim: D.
        num_classes: C.
        scale: s > 0.
        margin: m in [0, 1); 0 gives the normalised softmax with scale s.
        partial_fc: shard the class weights across processes and sample them each step
            (Partial FC, :mod:`sslkit.losses.partial_fc`); the ``state_dict`` still holds all C rows.
        sample_rate: with ``partial_fc``, the share of each process's classes kept per step,
            the batch's own classes always among them (0.1 in [2]'s recipes); 1 is the full head.

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar; ``logits``: (N, C) = s cos.

    >>> head = CosFaceHead(embedding_dim=16, num_classes=10)
    >>> head(torch.randn(8, 16), torch.randint(0, 10, (8,))).shape
    torch.Size([])
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        scale: float = 64.0,
        margin: float = 0.35,
        partial_fc: bool = False,
        sample_rate: float = 1.0,
    ) -> None:
        super().__init__(embedding_dim, num_classes, sharding_of(num_classes, partial_fc, sample_rate))
        self.scale = check_positive(scale, "scale")
        margin = as_number(margin, "margin")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1) (a cosine margin), got {margin}")
        self.margin = margin

    def target_logit(self, cos_target: torch.Tensor) -> torch.Tensor:
        return cosface_target_logit(cos_target, self.margin)

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, "
            f"scale={self.scale}, margin={self.margin}" + partial_fc_repr(self.partial_fc)
        )
