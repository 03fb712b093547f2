"""AdaCos with its dynamic scale: ``s`` re-estimated from every training batch.

References:
    [0] AdaCos, Zhang et al. 2019, https://arxiv.org/abs/1905.00292 (eq. 14-15, the dynamic scale)
"""

from __future__ import annotations

import math

import torch

from sslkit.losses._common import full_precision, needs_row_shift
from sslkit.losses.adacos import adacos_fixed_scale
from sslkit.losses.head import check_positive_int
from sslkit.losses.margin_softmax import MarginSoftmaxHead, margin_cross_entropy


class AdaCosDynamicHead(MarginSoftmaxHead):
    """Cosine softmax, no margin, with the scale updated per training batch (eq. 14-15 of [0])::

        B_avg(t)     = 1/N sum_i sum_{j != y_i} exp(s(t-1) cos theta_ij)
        theta_med(t) = median_i theta_{i,y_i}
        s(t)         = log B_avg(t) / cos(min(pi/4, theta_med(t)))
        loss_i       = -log( exp(s(t) cos theta_y) / sum_j exp(s(t) cos theta_j) )

    ``s(0) = sqrt(2) log(C - 1)`` (the fixed AdaCos scale). ``s`` is a buffer (saved in the
    state dict, so a resumed run continues from it), updated under ``no_grad`` in training mode
    only, *before* the loss, so each batch is scored with the scale computed from it; in eval
    mode ``logits``/``forward`` use the last ``s``. ``B_avg`` is summed with the largest logit
    shifted out whenever ``s`` is large enough to overflow, so a large ``s`` cannot. If a
    degenerate batch gives a non-finite or non-positive ``s`` (``B_avg <= 1``), the previous
    ``s`` is kept.

    Caveats. Hyperparameter-free is not free: in the paper's own curves of the cosines to the
    own class and to other classes, AdaCos pulls ahead of ArcFace only after about 20,000 steps,
    and the axis does not say whether those are iterations or epochs; in practice accuracy has
    been reported to rise slowly early on. For short schedules the fixed-scale
    :class:`AdaCosHead` or ArcFace are the safer choice. ``s`` depends on the batch (its median
    angle, ``torch.median``'s lower middle value for an even N, and its class mix), so it moves
    with the batch size. Across processes each one computes
    ``s`` from its local batch; DDP's default ``broadcast_buffers`` then overwrites it with rank
    0's value at the next forward, so the processes agree on ``s(t-1)`` but not exactly on ``s(t)``.
    pytorch-metric-learning has no AdaCos.

    Args:
        embedding_dim: D.
        num_classes: C >= 3.

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar; ``logits``: (N, C) = s cos.

    >>> head = AdaCosDynamicHead(embedding_dim=16, num_classes=10)
    >>> loss = head(torch.randn(8, 16), torch.randint(0, 10, (8,)))  # updates head.s
    """

    def __init__(self, embedding_dim: int, num_classes: int) -> None:
        super().__init__(embedding_dim, check_positive_int(num_classes, "num_classes", minimum=3))
        self.register_buffer("s", torch.tensor(adacos_fixed_scale(self.num_classes)))

    @property
    def scale(self) -> torch.Tensor:
        # A copy: autograd saves the scale it multiplied by, and the buffer changes in place.
        return self.s.detach().clone()

    @torch.no_grad()
    def update_scale(self, logits: torch.Tensor, labels: torch.Tensor, old_scale: torch.Tensor) -> torch.Tensor:
        """Eq. 14-15 of [0] from this batch's ``logits = s(t-1) cos``; writes and returns ``s(t)``.

        ``logits`` is read, and its target column is briefly set to -inf (for ``B_avg``'s sum
        over the other classes) and put back exactly: no (N, C) copy. Its ``exp`` goes into
        the head's reused workspace buffer, shifted by the largest logit only when ``s(t-1)``
        is large enough for a sum of N C terms to overflow (:func:`needs_row_shift`), so
        ``B_avg`` stays finite for any scale.
        """
        column = labels.unsqueeze(1)
        target = logits.gather(1, column)  # (N, 1), written back below
        # acos is harmless here: no gradient flows through the scale.
        theta_median = torch.median(torch.acos((target.squeeze(1) / old_scale).clamp(-1, 1)))
        logits.scatter_(1, column, float("-inf"))  # (N, C): the target excluded from B_avg
        exp = self.workspace.take("logits_exp", tuple(logits.shape), logits.dtype, logits.device)
        if needs_row_shift(float(old_scale), logits.dtype, terms=logits.numel()):
            shift = logits.amax()  # a non-target logit: the sum is >= 1 and every term <= 1
            total = torch.sub(logits, shift, out=exp).exp_().sum().log_().add_(shift)
        else:  # |logit| <= s(t-1): no term or sum can overflow or vanish
            total = torch.exp(logits, out=exp).sum().log_()
        self.workspace.give_back("logits_exp", exp)
        logits.scatter_(1, column, target)
        log_b_avg = total - math.log(logits.shape[0])
        new_scale = log_b_avg / torch.cos(theta_median.clamp(max=math.pi / 4))
        if torch.isfinite(new_scale) and new_scale > 0:
            self.s.copy_(new_scale)
        return self.scale.to(logits.dtype)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        labels = self.check_inputs(embeddings, labels)
        with full_precision(embeddings.device):
            logits, old_scale = self._scaled_logits(embeddings, labels)  # s(t-1) cos, (N, C)
            if not self.training:
                return margin_cross_entropy(logits, labels, self.target_logit, old_scale)
            new_scale = self.update_scale(logits.detach(), labels, old_scale)
            # s(t) cos, rescaled inside the loss: its gradient stays in the matmul's buffer.
            return margin_cross_entropy(logits, labels, self.target_logit, new_scale, float(new_scale / old_scale))

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, s={float(self.s):.4f}"
