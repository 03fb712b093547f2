"""Normalised softmax (NormFace): cosine logits divided by a temperature, no margin.

References:
    [0] NormFace, Wang et al. 2017, https://arxiv.org/abs/1704.06369 (normalised softmax with scale s)
    [1] Zhai and Wu 2018, "Classification is a Strong Baseline for Deep Metric Learning",
        https://arxiv.org/abs/1811.12649 (normalised softmax with temperature 0.05)
"""

from __future__ import annotations

from sslkit.losses._common import check_positive
from sslkit.losses.margin_softmax import MarginSoftmaxHead
from sslkit.losses.partial_fc import partial_fc_repr, sharding_of


class NormSoftmaxHead(MarginSoftmaxHead):
    """Softmax over cosines between the embedding and L2-normalised class weights.

    ::

        loss = mean_i -log( exp(cos(theta_{i,y_i}) / T) / sum_j exp(cos(theta_ij) / T) )

    ``cos(theta_ij) = x_i . W_j / (||x_i|| ||W_j||)``: NormFace's loss [0] (arXiv 1704.06369) with
    ``s = 1/T``, as written by Zhai and Wu [1] (arXiv 1811.12649).
    The default ``T = 0.05`` (``s = 20``) is Zhai and Wu's [1] and also pytorch-metric-learning's
    ``NormalizedSoftmaxLoss`` default; NormFace [0] learns ``s`` or fixes it near 16-32.

    Args:
        embedding_dim: D.
        num_classes: C.
        temperature: T > 0.
        partial_fc: shard the class weights across processes and sample them each step
            (Partial FC, :mod:`sslkit.losses.partial_fc`); the ``state_dict`` still holds all C rows.
        sample_rate: with ``partial_fc``, the share of each process's classes kept per step.

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar; ``logits``: (N, C) = cos / T.

    >>> import torch
    >>> head = NormSoftmaxHead(embedding_dim=16, num_classes=10)
    >>> head(torch.randn(8, 16), torch.randint(0, 10, (8,))).shape
    torch.Size([])
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        temperature: float = 0.05,
        partial_fc: bool = False,
        sample_rate: float = 1.0,
    ) -> None:
        super().__init__(embedding_dim, num_classes, sharding_of(num_classes, partial_fc, sample_rate))
        self.temperature = check_positive(temperature, "temperature")
        self.scale = 1.0 / self.temperature

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, temperature={self.temperature}"
            + partial_fc_repr(self.partial_fc)
        )
