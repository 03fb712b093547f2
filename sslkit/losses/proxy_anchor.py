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

from sslkit.losses._common import check_in_range, check_positive, full_precision, upcast
from sslkit.losses.head import Head


def _log1p_sum_exp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``log(1 + sum exp(x))`` along ``dim``; ``-inf`` entries are left out of the sum.

    This is ``softplus(logsumexp(x))`` written as one logsumexp over ``{0} U x``: shifting by
    ``m = max(0, max x)`` keeps every exponent <= 0, and the ``exp(-m)`` term (the "1") keeps
    the sum > 0, so a set with no finite entry gives log(1) = 0 with a zero gradient instead
    of ``softplus(-inf)``, whose backward through logsumexp is ``0 * nan``.
    """
    # The result does not depend on the shift, so it carries no gradient.
    m = x.amax(dim=dim, keepdim=True).clamp_min(0.0).detach()
    total = torch.exp(-m).squeeze(dim) + (x - m).exp_().sum(dim=dim)
    return torch.log(total) + m.squeeze(dim)


def _log1p_sum_exp_by_class(v: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``log(1 + sum_{i: labels_i = c} exp(v_i))`` for every class c, 0 for an absent class.

    The same shifted form as :func:`_log1p_sum_exp`, with the max and the sum taken per class
    by scatter instead of over a masked (N, C) matrix.

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


def proxy_anchor_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    proxies: torch.Tensor,
    alpha: float = 32.0,
    delta: float = 0.1,
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
    """
    labels = labels.long()
    num_classes = proxies.shape[0]
    with full_precision(embeddings.device):
        x, p = _unit_pair(embeddings, proxies)
        # Positive pairs are (sample, its own class's proxy): N of them, not N x C, so the
        # positive term is a per-class reduction over N values.
        positive_cos = (x * p[labels]).sum(dim=1)  # (N,)
        pos_term = _log1p_sum_exp_by_class(-alpha * (positive_cos - delta), labels, num_classes)  # (C,)
        # Every other pair is negative: one (N, C) pass with the N positive pairs set to -inf.
        # In place is safe: neither the add, the scalar multiply nor the scatter needs its input.
        negative = (x @ p.T).add_(delta).mul_(alpha).scatter_(1, labels[:, None], float("-inf"))  # (N, C)
        neg_term = _log1p_sum_exp(negative, dim=0)  # (C,)
        # max(1, .) only matters for an empty batch, where both sums are 0 anyway.
        num_present = (torch.bincount(labels, minlength=num_classes) > 0).sum().clamp_min(1)
        return pos_term.sum() / num_present + neg_term.sum() / num_classes


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
        self.delta = check_in_range(delta, "delta", 0.0, float("inf"))
        self.proxy_lr_scale = check_positive(proxy_lr_scale, "proxy_lr_scale")
        self.proxies = nn.Parameter(torch.empty(self.num_classes, self.embedding_dim))  # (C, D)
        nn.init.kaiming_normal_(self.proxies, mode="fan_out")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.check_inputs(embeddings, labels)
        return proxy_anchor_loss(embeddings, labels, self.proxies, self.alpha, self.delta)

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
