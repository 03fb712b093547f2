"""SphereFace (A-Softmax): L-Softmax's angular margin with unit-norm class weights.

References:
    [0] SphereFace, Liu et al. 2017, https://arxiv.org/abs/1704.08063 (A-Softmax loss; lambda from
        the released ``sphereface_model.prototxt``: base 1000, gamma 0.12, power 1, lambda_min 5)
    [1] L-Softmax, Liu et al. 2016, https://arxiv.org/abs/1612.02295
"""

from __future__ import annotations

from sslkit.losses.lsoftmax import LSoftmaxHead


class SphereFaceHead(LSoftmaxHead):
    """A-Softmax: ``||x|| psi(theta_y)`` on the target, ``||x|| cos theta_j`` elsewhere, ``||W_j|| = 1``.

    The A-Softmax loss of [0] (arXiv 1704.08063), i.e. L-Softmax [1] with normalised weights::

        loss_i = -log( e_y / (e_y + sum_{j != y} exp(||x_i|| cos theta_j)) ),   e_y = exp(||x_i|| psi(theta_y))
        psi(theta) = (-1)^k cos(m theta) - 2k,   theta in [k pi/m, (k+1) pi/m],  k in {0, ..., m-1}

    with the annealing the authors train with: the target uses
    ``(lambda cos theta_y + psi(theta_y)) / (1 + lambda)``, ``lambda = max(lambda_min,
    lambda_base (1 + lambda_gamma step)^-lambda_power)`` (:func:`~sslkit.losses.lsoftmax.margin_lambda`).
    The defaults (1000, 0.12, 1, 5) are those of the released SphereFace model. The trainer calls
    :meth:`set_step` every step (lambda is a pure function of it; at step 0 the head is almost a
    plain normalised-weight softmax). ``lambda_base = lambda_min = 0`` gives the loss above
    exactly, which is what pytorch-metric-learning's ``SphereFaceLoss`` computes (it does not
    anneal; its ``margin=4`` matches, its ``scale=1`` is implicit here).

    Args:
        embedding_dim: D.
        num_classes: C.
        margin: integer m >= 1; [0] uses 4.
        lambda_base, lambda_gamma, lambda_power, lambda_min: the annealing schedule (>= 0).

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar;
        ``logits``: (N, C) = ``||x|| cos theta`` (no margin).

    >>> import torch
    >>> head = SphereFaceHead(embedding_dim=16, num_classes=10)
    >>> head.set_step(20_000)
    >>> head(torch.randn(8, 16), torch.randint(0, 10, (8,))).shape
    torch.Size([])
    """

    normalize_weights = True

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        margin: int = 4,
        lambda_base: float = 1000.0,
        lambda_gamma: float = 0.12,
        lambda_power: float = 1.0,
        lambda_min: float = 5.0,
    ) -> None:
        super().__init__(embedding_dim, num_classes, margin, lambda_base, lambda_gamma, lambda_power, lambda_min)
