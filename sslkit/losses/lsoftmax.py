"""L-Softmax (large-margin softmax): a multiplicative angular margin ``cos(m theta)`` on the target.

References:
    [0] L-Softmax, Liu et al. 2016, https://arxiv.org/abs/1612.02295 (psi: eq. 6; lambda: how the paper trains)
    [1] SphereFace, Liu et al. 2017, https://arxiv.org/abs/1704.08063 (reuses psi with ||W|| = 1)
"""

from __future__ import annotations

import math

import torch

from sslkit.losses._common import check_nonnegative
from sslkit.losses.head import check_positive_int
from sslkit.losses.margin_softmax import MarginSoftmaxHead


def large_margin_psi(cos: torch.Tensor, margin: int) -> torch.Tensor:
    """``psi(theta) = (-1)^k cos(m theta) - 2k`` for ``theta in [k pi/m, (k+1) pi/m]``, from cos theta.

    Eq. 6 of [0]; pytorch-metric-learning expands ``cos(m theta)`` binomially (eq. 7 of [0]) and
    takes ``acos`` for ``k``. Here ``cos(m theta)`` is the Chebyshev polynomial ``T_m(cos theta)``
    (``T_0 = 1, T_1 = c, T_{n+1} = 2c T_n - T_{n-1}``) and ``k`` counts the thresholds
    ``cos(j pi/m)``, j = 1..m-1, that ``cos theta`` lies at or below, so no ``acos`` (whose
    gradient is infinite at cos = +-1) is taken. ``psi`` is continuous, so the choice of ``k`` on
    a threshold does not change the value. ``margin = 1`` gives ``psi = cos theta``.

    Shape:
        cos: (N,) target cosines; returns (N,).
    """
    prev, cos_m = torch.ones_like(cos), cos
    for _ in range(margin - 1):
        prev, cos_m = cos_m, 2 * cos * cos_m - prev
    with torch.no_grad():
        thresholds = torch.cos(torch.arange(1, margin, dtype=cos.dtype, device=cos.device) * (math.pi / margin))
        k = (cos.unsqueeze(1) <= thresholds).sum(dim=1).to(cos.dtype)  # (N,) in {0..m-1}
        sign = 1 - 2 * torch.remainder(k, 2)
    return sign * cos_m - 2 * k


def margin_lambda(step: int, base: float, gamma: float, power: float, lambda_min: float) -> float:
    """The annealing weight of [0] and [1]: ``max(lambda_min, base (1 + gamma step)^-power)``.

    A pure function of the optimisation step, as in the authors' Caffe layer
    (``MarginInnerProduct``). The target logit is ``(lambda cos + psi) / (1 + lambda)``: plain
    softmax early on (large lambda), the full margin as lambda falls.
    """
    return max(lambda_min, base * (1.0 + gamma * step) ** (-power)) if base > 0 else lambda_min


def _check_lambda_schedule(base: float, gamma: float, power: float, lambda_min: float) -> tuple[float, ...]:
    named = ((base, "lambda_base"), (gamma, "lambda_gamma"), (power, "lambda_power"), (lambda_min, "lambda_min"))
    return tuple(check_nonnegative(value, name) for value, name in named)


class LSoftmaxHead(MarginSoftmaxHead):
    """Large-margin softmax: the target logit ``||W_y|| ||x|| psi(theta_y)``, no normalisation.

    The L-Softmax loss of [0] (arXiv 1612.02295)::

        loss_i = -log( exp(||W_y|| ||x_i|| psi(theta_y)) /
                       (exp(||W_y|| ||x_i|| psi(theta_y)) + sum_{j != y} exp(||W_j|| ||x_i|| cos theta_j)) )
        psi(theta) = (-1)^k cos(m theta) - 2k,   theta in [k pi/m, (k+1) pi/m],  k in {0, ..., m-1}

    so the other logits are plain ``W_j . x_i`` (no bias, as in [0]). Optimising this loss from the
    start is hard; to train, [0] anneals the target to ``(lambda cos + psi) / (1 + lambda)``
    with lambda decreasing from a large value. That is available through ``lambda_*`` and
    :meth:`set_step` (see :func:`margin_lambda`) but off by default (``lambda = 0``: the loss above,
    pytorch-metric-learning's ``LargeMarginSoftmaxLoss``, whose defaults ``margin=4, scale=1``
    match ours). The margin must be an integer: ``cos(m theta)`` is a Chebyshev polynomial of
    ``cos theta``.

    Args:
        embedding_dim: D.
        num_classes: C.
        margin: integer m >= 1 (1: plain softmax without bias); [0] trains with m = 2, 3 and 4.
        lambda_base, lambda_gamma, lambda_power, lambda_min: the annealing schedule (>= 0).

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar; ``logits``: (N, C) = x W^T.

    >>> head = LSoftmaxHead(embedding_dim=16, num_classes=10, margin=2)
    >>> head(torch.randn(8, 16), torch.randint(0, 10, (8,))).shape
    torch.Size([])
    """

    normalize_features = False
    normalize_weights = False

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        margin: int = 4,
        lambda_base: float = 0.0,
        lambda_gamma: float = 0.0,
        lambda_power: float = 1.0,
        lambda_min: float = 0.0,
    ) -> None:
        super().__init__(embedding_dim, num_classes)
        self.margin = check_positive_int(margin, "margin")
        self.schedule = _check_lambda_schedule(lambda_base, lambda_gamma, lambda_power, lambda_min)
        # A buffer, so the annealing step is saved in checkpoints and a resumed run continues the schedule.
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def set_step(self, step: int) -> None:
        """Tell the head the optimisation step; lambda is a pure function of it."""
        self.step.fill_(check_positive_int(step, "step", minimum=0))

    @property
    def lambda_(self) -> float:
        return margin_lambda(int(self.step), *self.schedule)

    def target_logit(self, cos_target: torch.Tensor) -> torch.Tensor:
        lam = self.lambda_
        psi = large_margin_psi(cos_target, self.margin)
        return psi if lam == 0 else (lam * cos_target + psi) / (1 + lam)

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, margin={self.margin}, "
            f"lambda={self.lambda_:g} at step {int(self.step)}"
        )
