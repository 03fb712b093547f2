"""NCE: binary logistic noise-contrastive estimation, as NPID trains instance discrimination.

References:
    [0] Noise-contrastive estimation, Gutmann and Hyvarinen 2010,
        https://proceedings.mlr.press/v9/gutmann10a.html
    [1] NPID / Instance Discrimination, Wu et al. 2018, https://arxiv.org/abs/1805.01978 (eq. 5-8)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import distributed
from sslkit.losses._common import (
    as_number,
    check_flag,
    check_negatives,
    check_positive,
    check_two_views,
    full_precision,
    upcast,
)


def _check_bank_size(bank_size) -> int | None:
    """``bank_size`` as an int, or None; ValueError naming it for anything but a positive integer (not a bool)."""
    if bank_size is None:
        return None
    if isinstance(bank_size, bool) or as_number(bank_size, "bank_size", int) != bank_size or bank_size < 1:
        raise ValueError(f"bank_size must be a positive integer or None, got {bank_size!r}")
    return int(bank_size)


def _logits_and_positives(
    z1: torch.Tensor, z2: torch.Tensor, inv_t: float, negatives: torch.Tensor | None, gather_distributed: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``s / T`` of every anchor against its M candidates, the positive's column, and M.

    With a bank: the N queries ``z1`` against [their key, the K negatives]; the candidates are
    the bank, so M is ``bank_size`` (returned as 0: unknown here). In-batch: the 2N anchors
    against the other view's N embeddings (gathered), in both directions.
    """
    n = z1.shape[0]
    if negatives is not None:
        negatives = F.normalize(upcast(negatives).to(z1.dtype), dim=1)
        positive = (z1 * z2).sum(dim=1, keepdim=True)  # (n, 1)
        logits = torch.cat([positive, z1 @ negatives.T], dim=1) * inv_t  # (n, 1 + K)
        return logits, torch.zeros(n, dtype=torch.long, device=z1.device), 0

    if gather_distributed and distributed.is_distributed():
        all1, all2 = distributed.gather_with_grad(z1), distributed.gather_with_grad(z2, check=False)
        offset = distributed.local_offset(n)
    else:
        all1, all2, offset = z1, z2, 0
    # Each view's anchors draw noise from the other view, as NPID's features draw from the bank.
    logits = torch.cat([(z1 * inv_t) @ all2.T, (z2 * inv_t) @ all1.T])  # (2n, N)
    positive_col = (torch.arange(n, device=z1.device) + offset).repeat(2)  # (2n,)
    return logits, positive_col, all1.shape[0]


@torch.no_grad()
def _estimate_log_mean_exp(logits: torch.Tensor, is_noise: torch.Tensor, gather_distributed: bool) -> torch.Tensor:
    """``log E_j[exp(s_j / T)]`` over every (anchor, noise sample) pair, in all processes: eq. 8 of [1]."""
    lse = torch.logsumexp(logits.masked_fill(~is_noise, float("-inf")).flatten(), dim=0)
    count = is_noise.sum().to(logits.dtype)
    if gather_distributed and distributed.is_distributed():
        # Exact over processes even when their K differ: pool the sums, then divide once.
        stats = distributed.gather_no_grad(torch.stack([lse, count]), check=False).view(-1, 2)  # (W, 2)
        lse, count = torch.logsumexp(stats[:, 0], dim=0), stats[:, 1].sum()
    return lse - count.log()


def _nce(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    negatives: torch.Tensor | None,
    bank_size: int | None,
    normalizer: float | None,
    log_mean_exp: torch.Tensor | None,
    gather_distributed: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and the ``log E_j[exp(s_j/T)]`` it used (``log Z - log M``), for :class:`NCELoss` to keep."""
    check_two_views(z1, z2)
    check_negatives(negatives, z1.shape[1])
    temperature = check_positive(temperature, "temperature")
    if normalizer is not None:
        normalizer = check_positive(normalizer, "normalizer")
    if negatives is not None and negatives.shape[0] < 1:
        raise ValueError("negatives must hold at least one noise sample, got shape (0, D)")
    bank_size = _check_bank_size(bank_size)
    with full_precision(z1.device):
        dtype = torch.promote_types(upcast(z1).dtype, upcast(z2).dtype)  # views in fp64 and fp32 meet in fp64
        z1 = F.normalize(upcast(z1).to(dtype), dim=1)
        z2 = F.normalize(upcast(z2).to(dtype), dim=1)
        inv_t = 1.0 / temperature
        logits, positive_col, candidates = _logits_and_positives(z1, z2, inv_t, negatives, gather_distributed)
        k = logits.shape[1] - 1  # noise samples per anchor
        if k < 1:
            raise ValueError("z1 and z2 must hold at least 2 samples in all when no negatives are given (no noise)")
        rows = torch.arange(logits.shape[0], device=logits.device)
        is_noise = torch.ones_like(logits, dtype=torch.bool)
        is_noise[rows, positive_col] = False

        if normalizer is not None:
            # Z / M with M = the number of entries the noise is drawn from (P_noise = 1/M).
            if negatives is not None and bank_size is None:
                raise ValueError("bank_size is required with negatives and a fixed normalizer (P_noise = 1/bank_size)")
            m = bank_size if negatives is not None else candidates
            log_mean_exp = torch.tensor(math.log(normalizer) - math.log(m), dtype=logits.dtype, device=logits.device)
        elif log_mean_exp is None:
            log_mean_exp = _estimate_log_mean_exp(logits, is_noise, gather_distributed)

        # G = log P_model - log(K P_noise) = s/T - log Z - log K + log M  (eq. 5 and 7 of [1]).
        g = logits - log_mean_exp.to(logits.dtype) - math.log(k)  # (A, 1 + K)
        # -log h(x+) for the positive, -log(1 - h(x-)) = -log sigmoid(-G) for each noise sample.
        per_pair = torch.where(is_noise, -F.logsigmoid(-g), -F.logsigmoid(g))
        return per_pair.sum(dim=1).mean(), log_mean_exp


def nce_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float = 0.07,
    negatives: torch.Tensor | None = None,
    bank_size: int | None = None,
    normalizer: float | None = None,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Binary NCE (eq. 6 of [1], after [0]): tell each positive apart from K noise samples.

    The model's probability that candidate ``v`` belongs to anchor ``f`` is
    ``P(v|f) = exp(s(f, v) / T) / Z`` (eq. 7 of [1]); noise is drawn uniformly from M candidates,
    ``P_noise = 1/M``; the posterior that a sample is data rather than noise is (eq. 5)::

        h(v) = P(v|f) / (P(v|f) + K P_noise) = sigmoid(G(v)),   G(v) = s(f, v)/T - log Z - log(K P_noise)

    and each anchor's loss is (eq. 6, its expectations as sums over the drawn samples)::

        l_f = -log h(v+) - sum_{j=1..K} log(1 - h(v_j))

    ``loss`` is the mean over anchors of ``l_f`` (a sum over the K noise samples, not a mean: the
    NPID reference code's normalisation, so the scale grows with K).

    The normaliser ``Z`` (eq. 8 of [1]): NPID estimates ``Z ~ M E_j[exp(s_j / T)]`` by Monte Carlo
    over the noise samples, treats it as a constant, and fixes it after the first batch. Here
    ``normalizer=None`` estimates it from this call's noise samples (detached, pooled over
    processes); :class:`NCELoss` freezes the first estimate as NPID does. With that estimate
    ``M`` cancels: ``G = s/T - log E_j[exp(s_j/T)] - log K``, so ``bank_size`` only matters for
    a fixed ``normalizer`` (``1.0`` is the self-normalised NCE of Mnih and Teh 2012). NPID's code
    averages over the positive too; eq. 8 (and this function) averages over noise samples only.

    With ``negatives`` (NPID's memory bank): ``z1`` are the current features, ``z2`` the bank
    entries of the same instances (the positives), ``negatives`` K entries drawn uniformly from
    a bank of ``bank_size`` (shared by all anchors, where NPID draws K per anchor); N anchors.
    Without: every one of the 2N embeddings is an anchor; its candidates are the other view's
    N embeddings over all processes (M = N; the positive and K = N - 1 noise samples).

    Args:
        z1, z2: the two views (features and their positives).
        temperature: T > 0.
        negatives: optional noise samples from a memory bank.
        bank_size: M, the size of the bank ``negatives`` are drawn from. Needed with
            ``negatives`` and a fixed ``normalizer``.
        normalizer: a fixed ``Z > 0``, or ``None`` to estimate it (eq. 8).
        gather_distributed: in-batch, draw noise from every process's embeddings.

    Shape:
        z1, z2: (N, D); negatives: (K, D), K >= 1, optional; returns a scalar.

    >>> z1, z2, bank = torch.randn(8, 16), torch.randn(8, 16), torch.randn(32, 16)
    >>> nce_loss(z1, z2, negatives=bank, bank_size=1000).shape
    torch.Size([])
    """
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    return _nce(z1, z2, temperature, negatives, bank_size, normalizer, None, gather_distributed)[0]


class NCELoss(nn.Module):
    """Binary NCE loss of NPID [1] (see :func:`nce_loss`), with NPID's frozen normaliser.

    With ``normalizer=None`` the first call estimates ``E_j[exp(s_j / T)]`` (eq. 8 of [1]) and
    keeps it in the buffer ``log_mean_exp``, so it is saved in checkpoints and every later
    call uses the same ``Z`` (NPID: "computed from the first iteration and fixed").
    It is kept per bank entry (``log Z - log M``), so ``Z`` follows M when the batch size changes.
    :meth:`reset_normalizer` asks for a new estimate at the next call.

    Args:
        temperature: T > 0 (NPID: 0.07).
        bank_size: M > 0, size of the memory bank the ``negatives`` are drawn from
            (``P_noise = 1/M``). Needed with ``negatives`` and a fixed ``normalizer``.
        normalizer: a fixed ``Z > 0``, or ``None`` to estimate it once, NPID style.
        gather_distributed: in-batch, draw noise from every process's embeddings.

    Shape:
        z1, z2: (N, D); negatives: (K, D) or None; returns a scalar.

    >>> loss_fn = NCELoss(temperature=0.07, bank_size=1000)
    >>> z1, z2, bank = torch.randn(8, 16), torch.randn(8, 16), torch.randn(32, 16)
    >>> loss_fn(z1, z2, bank).shape
    torch.Size([])
    """

    def __init__(
        self,
        temperature: float = 0.07,
        bank_size: int | None = None,
        normalizer: float | None = None,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.bank_size = _check_bank_size(bank_size)
        self.normalizer = None if normalizer is None else check_positive(normalizer, "normalizer")
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")
        # NaN = not estimated yet. float64 so the frozen value does not round.
        self.register_buffer("log_mean_exp", torch.tensor(float("nan"), dtype=torch.float64))

    def reset_normalizer(self) -> None:
        """Estimate the normaliser again at the next call (e.g. after changing the encoder)."""
        self.log_mean_exp.fill_(float("nan"))

    def forward(self, z1: torch.Tensor, z2: torch.Tensor, negatives: torch.Tensor | None = None) -> torch.Tensor:
        # One host sync per step to read the flag; negligible beside the loss itself.
        frozen = None if self.normalizer is not None or torch.isnan(self.log_mean_exp) else self.log_mean_exp
        loss, used = _nce(
            z1, z2, self.temperature, negatives, self.bank_size, self.normalizer, frozen, self.gather_distributed
        )
        if self.normalizer is None and frozen is None:
            self.log_mean_exp.copy_(used.detach())
        return loss

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, bank_size={self.bank_size}, normalizer={self.normalizer}, "
            f"gather_distributed={self.gather_distributed}"
        )
