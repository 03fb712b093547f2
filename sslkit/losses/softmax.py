"""Plain softmax classifier head: the baseline the margin heads are measured against.

References:
    [0] Zhai and Wu 2018, "Classification is a Strong Baseline for Deep Metric Learning",
        https://arxiv.org/abs/1811.12649 (the un-normalised softmax is their starting point)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.losses._common import check_flag, full_precision, upcast
from sslkit.losses.head import Head


class SoftmaxHead(Head):
    """Linear layer plus cross-entropy: ``logit_ij = W_j . x_i + b_j``.

    ::

        loss = mean_i -log( exp(W_{y_i} . x_i + b_{y_i}) / sum_j exp(W_j . x_i + b_j) )

    No normalisation and no margin; the weights are initialised like ``nn.Linear``.
    pytorch-metric-learning has no plain softmax loss (its ``NormalizedSoftmaxLoss`` is
    :class:`~sslkit.losses.normsoftmax.NormSoftmaxHead`).

    Args:
        embedding_dim: D.
        num_classes: C.
        bias: learn the per-class bias ``b`` (the margin heads have none).

    Shape:
        embeddings: (N, D), any float dtype (logits and softmax in fp32; fp64 stays fp64).
        labels: (N,) integer class ids in [0, C).
        returns: scalar; ``logits(embeddings)`` is (N, C).

    >>> head = SoftmaxHead(embedding_dim=16, num_classes=10)
    >>> head(torch.randn(8, 16), torch.randint(0, 10, (8,))).shape
    torch.Size([])
    """

    def __init__(self, embedding_dim: int, num_classes: int, bias: bool = True) -> None:
        super().__init__(embedding_dim, num_classes)
        bias = check_flag(bias, "bias")
        linear = nn.Linear(self.embedding_dim, self.num_classes, bias=bias)  # for its default init
        self.weight = linear.weight  # (C, D)
        self.bias = linear.bias  # (C,) or None

    def logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (N, C) ``x W^T + b``."""
        self.check_inputs(embeddings)
        with full_precision(embeddings.device):
            dtype = torch.promote_types(upcast(embeddings).dtype, upcast(self.weight).dtype)
            bias = None if self.bias is None else self.bias.to(dtype)
            return F.linear(embeddings.to(dtype), self.weight.to(dtype), bias)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        labels = self.check_inputs(embeddings, labels)
        return F.cross_entropy(self.logits(embeddings), labels)

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, bias={self.bias is not None}"
