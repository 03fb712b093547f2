"""Proxy-Anchor: each class proxy is an anchor compared with the whole batch.

References:
    [0] Proxy Anchor Loss for Deep Metric Learning, Kim et al. 2020,
        https://arxiv.org/abs/2003.13911 (eq. 4); official code:
        https://github.com/tjddus9597/Proxy-Anchor-CVPR2020
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from sslkit.losses._common import check_nonnegative, check_positive, full_precision, needs_row_shift, upcast
from sslkit.losses._workspace import Workspace
from sslkit.losses.head import Head, check_proxy_inputs
from sslkit.losses.margin_softmax import _cosines_in_workspace, _scaled_unit_rows, _weight_grad_via_workspace


def _log1p_sum_exp_by_class(v: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``log(1 + sum_{i: labels_i = c} exp(v_i))`` for every class c, 0 for an absent class.

    ``softplus(logsumexp(v))`` written as one logsumexp over ``{0} U v``: shifting by
    ``m = max(0, max v)`` keeps every exponent <= 0, and the ``exp(-m)`` term (the "1") keeps
    the sum > 0, so an absent class gives log(1) = 0 with a zero gradient instead of
    ``softplus(-inf)``, whose backward through logsumexp is ``0 * nan``. The max and the sum are
    taken per class by scatter, not over a masked (N, C) matrix.

    Shape:
        v: (N,); labels: (N,); returns (C,).
    """
    # include_self with zeros: the shift is max(0, max of the class), as above.
    m = v.new_zeros(num_classes).scatter_reduce(0, labels, v.detach(), reduce="amax", include_self=True)  # (C,)
    total = torch.exp(-m).index_add(0, labels, torch.exp(v - m[labels]))  # (C,)
    return torch.log(total) + m


def proxy_anchor_logits(embeddings: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every embedding with every proxy.

    Shape:
        embeddings: (N, D); proxies: (C, D); returns (N, C).
    """
    with full_precision(embeddings.device):
        x, p = _unit_pair(embeddings, proxies)
        return x @ p.T


def _unit_pair(embeddings: torch.Tensor, proxies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised embeddings and proxies in one common float dtype (fp32 at least)."""
    dtype = torch.promote_types(upcast(embeddings).dtype, upcast(proxies).dtype)
    return F.normalize(embeddings.to(dtype), dim=1), F.normalize(proxies.to(dtype), dim=1)


class _ProxyAnchorLoss(torch.autograd.Function):
    """Eq. 4 of [0] on raw proxies, fused: one (N, C) buffer, no (C, D) normalised copy.

    forward, with the (already ``alpha``-scaled) unit embeddings ``F`` and
    ``inv_j = 1 / ||W_j||``::

        L = F W^T diag(inv)  (N, C) = alpha cos;   r_i = L_{i y_i}   (the N positive pairs)
        E = exp(L + alpha delta - m)  with the positive pairs 0;  m_j = 0 while alpha (1 + delta)
            is small enough, else max(0, max_i of column j)
        Q_j = exp(-m_j) + sum_i E_ij;   negative = (1/C) sum_j (log Q_j + m_j)
        positive = 1/|P+| sum_c log(1 + sum_{i in class c} exp(alpha delta - r_i))  (autograd on (N,))

    backward, with ``g`` the incoming gradient: the negative term's gradient with respect to
    ``L_ij`` is ``g E_ij / (C Q_j)``, so ``G = E diag(g inv / (C Q))`` in place, with the
    positive pairs' entries set to ``d positive / d r_i * inv_{y_i}``; then, as in the
    margin-softmax heads, ``dF = G W`` and ``dW`` = the radial-free chain rule of ``G^T F``.
    One ``exp``, one column sum, one column scaling and the weight-gradient pass around the
    three matmuls, where autograd through ``F.normalize``, the masked logsumexp and its
    shift makes a dozen (N, C) and (C, D) passes.
    """

    @staticmethod
    def forward(ctx, features, weight, labels, alpha, delta, workspace):
        n, num_classes = features.shape[0], weight.shape[0]
        logits, norm, inv_norm = _cosines_in_workspace(features, weight, workspace)  # (N, C) alpha cos
        column = labels.unsqueeze(1)
        with torch.enable_grad():  # the positive term: a small graph on the (N,) positive logits
            raw = logits.gather(1, column).squeeze(1).requires_grad_()
            present = (torch.bincount(labels, minlength=num_classes) > 0).sum().clamp_min(1)
            positive = _log1p_sum_exp_by_class(alpha * delta - raw, labels, num_classes).sum() / present
        logits.scatter_(1, column, float("-inf")).add_(alpha * delta)  # alpha (cos + delta), positives left out
        if needs_row_shift(alpha * (1.0 + delta), logits.dtype, terms=max(n, 1)):
            shift = logits.amax(dim=0).clamp_min_(0.0)  # (C,) max(0, column max): every exponent <= 0
            logits.sub_(shift)
        else:
            shift = logits.new_zeros(num_classes)
        exp = logits.exp_()  # (N, C) in the matmul's buffer; the positive pairs are exp(-inf) = 0
        denominator = exp.sum(dim=0).add_(shift.neg().exp_())  # (C,) Q_j, >= exp(-m_j) > 0
        loss = positive.detach() + (denominator.log() + shift).sum() / num_classes
        if not any(ctx.needs_input_grad):  # no backward will read the buffer
            workspace.give_back("logits", exp)
            return loss
        ctx.save_for_backward(features, weight, norm, inv_norm, labels, exp, denominator)
        ctx.positive, ctx.raw, ctx.workspace = positive, raw, workspace
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        if getattr(ctx, "positive", None) is None:
            raise RuntimeError("proxy_anchor_loss supports one backward pass (retain_graph=True is not supported)")
        features, weight, norm, inv_norm, labels, exp, denominator = ctx.saved_tensors
        positive, raw, workspace = ctx.positive, ctx.raw, ctx.workspace
        ctx.positive = ctx.raw = None
        (grad_raw,) = torch.autograd.grad(positive, raw, grad_loss.to(positive.dtype))  # (N,)
        # G in place (the saved buffer is not read again): the negative term's gradient, column
        # j scaled by g inv_j / (C Q_j), and the positive pairs' entries from the small graph.
        scaled = exp.mul_(grad_loss * inv_norm / (denominator * weight.shape[0]))
        scaled.scatter_(1, labels.unsqueeze(1), (grad_raw * inv_norm[labels]).to(scaled.dtype).unsqueeze(1))
        grad_features = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_features = scaled @ weight  # (N, D)
        if ctx.needs_input_grad[1]:
            grad_weight = _weight_grad_via_workspace(scaled, features, weight, norm, workspace)  # (C, D)
        workspace.give_back("logits", scaled)  # read for the last time by the matmuls above
        return grad_features, grad_weight, None, None, None, None


def proxy_anchor_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    proxies: torch.Tensor,
    alpha: float = 32.0,
    delta: float = 0.1,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """Proxy-Anchor loss, eq. 4 of [0]::

        l(X) = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x, p) - delta)))
             + 1/|P|  sum_{p in P}  log(1 + sum_{x in X_p-} exp( alpha (s(x, p) + delta)))

    ``s`` is the cosine similarity, ``P`` all C proxies, ``P+`` the proxies of the classes
    present in the batch, ``X_p+`` the batch embeddings of p's class and ``X_p-`` the others.
    Each ``log(1 + sum exp(a))`` is ``softplus(LSE(a))``, computed as one logsumexp over
    ``{0} U a`` so it is exact, finite, and 0 for an empty set (a class absent from the batch,
    or a batch holding a single class). The two divisors are those of eq. 4 and of the
    official code: ``|P+|`` for the positive term, all ``C`` for the negative one.

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integers in [0, C);
        proxies: (C, D), one row per class; returns a scalar.
        workspace: the caller's scratch memory for the (N, C) and (C, D) temporaries, reused
            between calls on the CPU (:class:`ProxyAnchorHead` keeps one); None allocates afresh.

    Computed by one fused autograd function (``_ProxyAnchorLoss``).
    """
    labels = check_proxy_inputs(embeddings, labels, proxies)
    alpha, delta = check_positive(alpha, "alpha"), check_nonnegative(delta, "delta")
    return _proxy_anchor_loss(embeddings, labels, proxies, alpha, delta, workspace)


def _proxy_anchor_loss(embeddings, labels, proxies, alpha, delta, workspace):
    """:func:`proxy_anchor_loss` on inputs already checked (int64 labels): the head's call,
    which has checked them itself (each check of the labels' range is a host sync)."""
    with full_precision(embeddings.device):
        dtype = torch.promote_types(upcast(embeddings).dtype, upcast(proxies).dtype)
        features = _scaled_unit_rows(embeddings.to(dtype), alpha)  # (N, D) alpha x / ||x||
        workspace = workspace if workspace is not None else Workspace()
        return _ProxyAnchorLoss.apply(features, proxies.to(dtype), labels, float(alpha), float(delta), workspace)


class ProxyAnchorHead(Head):
    """Proxy-Anchor loss [0]: one learned proxy per class, each proxy an anchor over the batch.

    Args:
        embedding_dim: D.
        num_classes: C.
        alpha: scale alpha > 0 of eq. 4 (the paper's 32).
        delta: margin delta >= 0 of eq. 4 (the paper's 0.1).
        proxy_lr_scale: learning-rate multiplier of the proxies, returned by
            :meth:`param_groups`; [0] (implementation details) and its official code train
            them at 100x the network's learning rate for faster convergence. A trainer that
            leaves them at the base rate trains them much more slowly.

    The proxies are a (C, D) parameter, one row per class, initialised like the official code
    with ``kaiming_normal_(mode="fan_out")``, i.e. N(0, 2/C) for a (C, D) tensor.
    pytorch-metric-learning's ``ProxyAnchorLoss`` has the same layout, initialisation, eq. 4
    and divisors (``margin`` there is delta).

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar.
        logits(embeddings): (N, C), cosine similarities to the proxies.

    >>> head = ProxyAnchorHead(embedding_dim=16, num_classes=5)
    >>> loss = head(torch.randn(8, 16), torch.randint(0, 5, (8,)))
    >>> [(g["name"], g["lr_scale"]) for g in head.param_groups()]
    [('proxy_anchor.proxies', 100.0)]
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        alpha: float = 32.0,
        delta: float = 0.1,
        proxy_lr_scale: float = 100.0,
    ) -> None:
        super().__init__(embedding_dim, num_classes)
        self.alpha = check_positive(alpha, "alpha")
        self.delta = check_nonnegative(delta, "delta")
        self.proxy_lr_scale = check_positive(proxy_lr_scale, "proxy_lr_scale")
        self.proxies = nn.Parameter(torch.empty(self.num_classes, self.embedding_dim))  # (C, D)
        nn.init.kaiming_normal_(self.proxies, mode="fan_out")
        self.workspace = Workspace()  # scratch memory of the fused loss, reused between steps

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        labels = self.check_inputs(embeddings, labels)
        return _proxy_anchor_loss(embeddings, labels, self.proxies, self.alpha, self.delta, self.workspace)

    def logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        self.check_inputs(embeddings)
        return proxy_anchor_logits(embeddings, self.proxies)

    def param_groups(self) -> list[dict]:
        return [{"params": [self.proxies], "lr_scale": self.proxy_lr_scale, "name": "proxy_anchor.proxies"}]

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, alpha={self.alpha}, "
            f"delta={self.delta}, proxy_lr_scale={self.proxy_lr_scale}"
        )
