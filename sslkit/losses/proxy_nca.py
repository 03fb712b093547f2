"""Proxy-NCA: Neighbourhood Component Analysis against one learned proxy per class.

References:
    [0] No Fuss Distance Metric Learning using Proxies, Movshovitz-Attias et al. 2017,
        https://arxiv.org/abs/1703.07464 (Section 3, the NCA loss written on proxies)
    [1] ProxyNCA++, Teh et al. 2020, https://arxiv.org/abs/2004.01113 (temperature T = 1/9,
        fast-moving proxies)
    [2] Partial FC, An et al. 2022, https://arxiv.org/abs/2203.15565
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.losses._common import check_flag, check_positive, full_precision, upcast
from sslkit.losses._workspace import Workspace
from sslkit.losses.head import Head, check_proxy_inputs
from sslkit.losses.margin_softmax import _scaled_unit_rows, cosine_margin_cross_entropy
from sslkit.losses.partial_fc import partial_fc_repr, sharding_of


def _unchanged(cos_target: torch.Tensor) -> torch.Tensor:
    """No margin: Proxy-NCA's positive logit is its plain scaled cosine."""
    return cos_target


def _unit_pair(embeddings: torch.Tensor, proxies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised embeddings and proxies in one common float dtype (fp32 at least)."""
    dtype = torch.promote_types(upcast(embeddings).dtype, upcast(proxies).dtype)
    return F.normalize(embeddings.to(dtype), dim=1), F.normalize(proxies.to(dtype), dim=1)


def proxy_nca_logits(embeddings: torch.Tensor, proxies: torch.Tensor, scale: float = 9.0) -> torch.Tensor:
    """``-scale * ||x/|x| - p/|p| ||^2`` for every embedding and proxy.

    For unit vectors ``||x - p||^2 = 2 - 2 cos(x, p)``, so one matmul gives all squared
    distances exactly, without the (N, C, D) difference tensor or ``cdist``'s sqrt (whose
    gradient is infinite at distance 0).

    Shape:
        embeddings: (N, D); proxies: (C, D); returns (N, C).
    """
    with full_precision(embeddings.device):
        x, p = _unit_pair(embeddings, proxies)
        return (2.0 * scale) * (x @ p.T - 1.0)  # (N, C) = -scale * (2 - 2 cos)


def proxy_nca_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    proxies: torch.Tensor,
    scale: float = 9.0,
    include_positive_in_denominator: bool = False,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """Proxy-NCA loss of [0], averaged over the batch.

    With ``d`` the squared Euclidean distance between the L2-normalised embedding ``x`` and
    the L2-normalised proxies ``p_c``, and ``s`` = ``scale``::

        l(x, y) = -log( exp(-s d(x, p_y)) / sum_{c != y} exp(-s d(x, p_c)) )
                = s d(x, p_y) + LSE_{c != y}( -s d(x, p_c) ),        loss = mean over x

    The denominator leaves the positive proxy out, as the NCA loss of [0] does (its Z is the
    set of negatives). ``include_positive_in_denominator=True`` gives the softmax
    cross-entropy form used by pytorch-metric-learning's ``ProxyNCALoss`` and by ProxyNCA++
    [1]; that form is >= 0, the paper's can be negative (it keeps rewarding distant negatives).

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integers in [0, C);
        proxies: (C, D), one row per class; returns a scalar.
        workspace: the caller's scratch memory for the (N, C) and (C, D) temporaries, reused
            between calls on the CPU (:class:`ProxyNCAHead` keeps one); None allocates afresh.
    """
    labels = check_proxy_inputs(embeddings, labels, proxies)
    include_positive_in_denominator = check_flag(include_positive_in_denominator, "include_positive_in_denominator")
    if not include_positive_in_denominator and proxies.shape[0] < 2:  # as the head checks num_classes
        raise ValueError(
            f"proxies must have at least 2 rows: Proxy-NCA's denominator sums over the other classes' "
            f"proxies, got {proxies.shape[0]}"
        )
    scale = check_positive(scale, "scale")
    return _proxy_nca_loss(embeddings, labels, proxies, scale, include_positive_in_denominator, workspace)


def _proxy_nca_loss(embeddings, labels, proxies, scale, include_positive_in_denominator, workspace):
    """:func:`proxy_nca_loss` on inputs already checked (int64 labels): the head's call,
    which has checked them itself (each check of the labels' range is a host sync)."""
    with full_precision(embeddings.device):
        dtype = torch.promote_types(upcast(embeddings).dtype, upcast(proxies).dtype)
        # -s d = 2 s cos - 2 s: the constant 2 s cancels between numerator and denominator, and
        # the factor 2 s goes on the (N, D) side, not on the (N, C) product. What is left is a
        # cosine softmax with no margin, the fused loss of the margin-softmax heads (its proxies
        # normalised without a (C, D) copy; see cosine_margin_cross_entropy).
        x = _scaled_unit_rows(embeddings.to(dtype), 2.0 * scale)
        return cosine_margin_cross_entropy(
            x,
            proxies.to(dtype),
            labels,
            _unchanged,
            2.0 * scale,
            2.0 * scale,
            workspace,
            target_in_denominator=include_positive_in_denominator,
        )


class ProxyNCAHead(Head):
    """Proxy-NCA [0]: one learned proxy per class, NCA over distances to the proxies.

    Args:
        embedding_dim: D.
        num_classes: C >= 2 (the paper's denominator needs at least one negative proxy).
        scale: s > 0 multiplying the squared distances, i.e. 1 / temperature. [0] writes the
            loss unscaled (s = 1) on unit-norm embeddings and proxies, which bounds the
            logits to [-4, 0] and trains poorly; the default 9 is ProxyNCA++'s T = 1/9 [1],
            which is also the widely used re-implementation's norm of 3 for both embeddings
            and proxies (3^2 = 9). pytorch-metric-learning calls it ``softmax_scale``
            (default 1 there).
        proxy_lr_scale: learning-rate multiplier of the proxies, returned by
            :meth:`param_groups`. [0] gives no value; ProxyNCA++ [1] shows proxies must move
            much faster than the backbone ("fast moving proxies": proxies at 4e2 vs 4e-3 with
            Adam) and the dichotomies/proxy-nca re-implementation uses 5.0 vs 0.045 (~110x).
            The default 100 follows the latter and matches Proxy-Anchor's 100x.
        include_positive_in_denominator: see :func:`proxy_nca_loss`. Default False, the
            paper's form; True matches pytorch-metric-learning and ProxyNCA++.
        partial_fc: shard the proxies across processes and sample them each step (Partial FC
            [2], :mod:`sslkit.losses.partial_fc`); the ``state_dict`` still holds all C rows, and
            ``logits`` gathers them (every process must call it).
        sample_rate: with ``partial_fc``, the share of each process's proxies kept per step, the
            batch's own classes always among them; 1 is the full head.

    The proxies are a (C, D) parameter (one row per class) initialised N(0, 1/64) as in the
    reference implementations (``randn / 8``). Only their direction matters to the loss;
    their norm sets how fast the direction moves for a given learning rate.

    Shape:
        embeddings: (N, D); labels: (N,) in [0, C); returns a scalar.
        logits(embeddings): (N, C), ``-scale * squared distance`` (higher is closer).

    >>> head = ProxyNCAHead(embedding_dim=16, num_classes=5)
    >>> loss = head(torch.randn(8, 16), torch.randint(0, 5, (8,)))
    >>> head.logits(torch.randn(8, 16)).shape
    torch.Size([8, 5])
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        scale: float = 9.0,
        proxy_lr_scale: float = 100.0,
        include_positive_in_denominator: bool = False,
        partial_fc: bool = False,
        sample_rate: float = 1.0,
    ) -> None:
        super().__init__(embedding_dim, num_classes)
        sharding = sharding_of(self.num_classes, partial_fc, sample_rate)
        include_positive_in_denominator = check_flag(
            include_positive_in_denominator, "include_positive_in_denominator"
        )
        if not include_positive_in_denominator and self.num_classes < 2:
            raise ValueError(
                f"num_classes must be >= 2: Proxy-NCA's denominator sums over the other classes' "
                f"proxies, got {num_classes}"
            )
        self.scale = check_positive(scale, "scale")
        self.proxy_lr_scale = check_positive(proxy_lr_scale, "proxy_lr_scale")
        self.include_positive_in_denominator = include_positive_in_denominator
        if sharding is not None:
            self.partial_fc, self.sharded_parameters = sharding, ("proxies",)
            self.proxies = nn.Parameter(torch.empty(self.partial_fc.rows, self.embedding_dim))  # (C / W, D)
            self.partial_fc.init_rows(self.proxies, lambda rows, seeded: rows.normal_(0.0, 1 / 8, generator=seeded))
        else:
            self.proxies = nn.Parameter(torch.randn(self.num_classes, self.embedding_dim) / 8)  # (C, D)
        self.workspace = Workspace()  # scratch memory of the fused loss, reused between steps

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        labels = self.check_inputs(embeddings, labels)
        if self.partial_fc is not None:  # -s d = 2 s cos - 2 s, as in _proxy_nca_loss
            in_denominator = self.include_positive_in_denominator
            return self.partial_fc.loss(embeddings, labels, self.proxies, 2.0 * self.scale, _unchanged, in_denominator)
        return _proxy_nca_loss(
            embeddings, labels, self.proxies, self.scale, self.include_positive_in_denominator, self.workspace
        )

    def logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        self.check_inputs(embeddings)
        proxies = self.proxies if self.partial_fc is None else self.partial_fc.gather_rows(self.proxies)
        return proxy_nca_logits(embeddings, proxies, self.scale)

    def param_groups(self) -> list[dict]:
        return [{"params": [self.proxies], "lr_scale": self.proxy_lr_scale, "name": "proxy_nca.proxies"}]

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, scale={self.scale}, "
            f"proxy_lr_scale={self.proxy_lr_scale}, "
            f"include_positive_in_denominator={self.include_positive_in_denominator}"
            + partial_fc_repr(self.partial_fc)
        )
