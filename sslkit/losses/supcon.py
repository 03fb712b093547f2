"""SupCon: supervised contrastive loss, the L_out form.

References:
    [0] Supervised Contrastive Learning, Khosla et al. 2020, https://arxiv.org/abs/2004.11362 (eq. 2)
    [1] SupContrast, the authors' code, https://github.com/HobbitLong/SupContrast (``losses.py``);
        its NaN for anchors without a positive: SupContrast#141
    [2] A unifying mutual information view of metric learning: cross-entropy vs. pairwise losses,
        Boudiaf et al. 2020, https://arxiv.org/abs/2003.08983
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from sslkit import distributed
from sslkit.losses._common import (
    References,
    check_embeddings_labels,
    check_flag,
    check_positive,
    full_precision,
    gather_labelled,
    mean_over_processes,
    needs_row_shift,
    pair_masks,
    symmetric_pair_product,
    upcast,
)
from sslkit.losses.memory import CrossBatchMemory, memory_of, reference_sets
from sslkit.losses.miners import check_miner, mine

_EPS = 1e-12  # F.normalize's default: a zero embedding stays zero instead of dividing by 0


def _unit_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x / max(||x||, eps)`` row by row (as ``F.normalize``), and the factor ``1 / max(||x||, eps)``."""
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)  # (m, 1)
    inv_norm = norm.clamp_min_(_EPS).reciprocal_()
    return x * inv_norm, inv_norm


def _through_unit_rows(grad_u: torch.Tensor, u: torch.Tensor, inv_norm: torch.Tensor) -> torch.Tensor:
    """Chain rule through ``u = x / max(||x||, eps)``: ``(g - u (u . g)) / max(||x||, eps)``, in place on ``g``.

    A zero row (``u = 0``) gets ``g / eps``, as through ``F.normalize``. (Rows with
    ``0 < ||x|| < eps`` keep the projection, which ``F.normalize`` drops; no embedding is that small.)
    """
    along = torch.linalg.vecdot(u, grad_u)[:, None]  # (m, 1)
    return grad_u.addcmul_(u, along, value=-1.0).mul_(inv_norm)


def _symmetric_backward(z, inv_norm, exp, softmax_scale, positive_scale, positives, inv_t):
    """The backward of :class:`_SupConWeightedSum` in one process without a row shift, where E is symmetric.

    The anchors are the candidates, so their two gradients add (``dL/dz_i + dL/dc_i``), and
    with ``E^T = E`` both products are one: ``s_i (E a)_i + (E (s a))_i = ((s_i + s_j) E_ij) a``,
    an (n, n) pass and one matmul instead of two (:func:`~sslkit.losses._common.symmetric_pair_product`).

    The positives' two terms are equal here: anchor ``i`` pulls towards its positives
    (``g_i w_i / T sum_{p in P(i)} z_p``) and, as a candidate, is pulled by each of them
    (``sum_{p in P(i)} g_p w_p / T z_p``), and ``g w`` is the same for every sample of a class
    (``_SupConWeightedSum``'s contract), so the pair is ``2 g_i w_i / T (S_{y_i} - z_i)``: one
    pass over the (n, D) rows instead of a per-class scatter and gather.

    Shape:
        z: (n, D) unit rows; exp: (n, n); softmax_scale, positive_scale: (n, 1); returns dL/dx (n, D).
    """
    grad = symmetric_pair_product(exp, softmax_scale * inv_t, z)  # (n, D): anchor side + candidate side
    grad.addcmul_(positives, positive_scale * (-2.0 * inv_t))  # the pulls between positives, both ways
    return _through_unit_rows(grad, z, inv_norm)


class _SupConWeightedSum(torch.autograd.Function):
    """``sum_i r_i l_i`` over the per-anchor SupCon terms, with a hand-written backward that makes no (n, N) temporary.

    For local anchor ``i`` (candidate ``i + offset``), with ``z = x / ||x||`` and ``c`` the
    candidates normalised the same way::

        l_i = log sum_{j != i} exp(z_i . c_j / T)  -  w_i sum_{p in P(i)} z_i . c_p / T,   w_i = 1 / |P(i)|

    ``w_i`` (``weight``) and ``r_i`` must each depend on anchor ``i``'s class alone, as
    :func:`supcon_loss` makes them (the one-process backward uses it, see ``_symmetric_backward``).
    ``r_i`` (``row_weight``) is the reduction: the mean's factor, 0 for a skipped anchor. Taking
    it inside saves the masking, sum and division nodes (each a few small ops forward and
    back) that would otherwise follow the function: at 2N = 1024 on a CPU those fixed costs
    are a large part of what the loss adds to its matmuls.

    Why by hand: autograd would build ``logits - max`` and ``exp(logits - lse)`` as fresh
    (n, N) tensors, copy the (n, N) gradient to mask the diagonal, and chain a dozen small
    (n, D) nodes for the positive sum and the normalisation; on the CPU those cost as much
    as the three matmuls. Here the forward turns the logits buffer into ``exp(logits - m_i)``
    in place and keeps it, and the backward folds every per-row factor into the thin (n, D)
    side of its two matmuls (one in one process, see ``_symmetric_backward``). ``m_i`` is 0
    while ``1/T`` is small enough that ``exp(+-1/T)`` cannot overflow or underflow
    (``|z . c| <= 1``), which saves a pass; else the row maximum.

    The positive sum needs no (n, N) mask: ``sum_{p in P(i)} c_p = S_{y_i} - c_{i + offset}``
    with ``S_k`` the sum of the candidates of class ``k``. Gradients with respect to the unit
    vectors (``a = z / T``, ``q_ij`` the softmax over ``j != i``, ``g`` the incoming
    gradient), then through the normalisation by :func:`_through_unit_rows`::

        dL/dz_i = g_i / T (sum_j q_ij c_j - w_i sum_{p in P(i)} c_p)
        dL/dc_j = sum_i g_i q_ij a_i - sum_{i : j in P(i)} g_i w_i a_i

    The diagonal is excluded with ``-inf``: safe, the logits are fp32/fp64 and ``N >= 2``
    leaves every row a finite entry. Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, x, x_candidates, inv_t, offset, class_of, num_classes, weight, row_weight):
        n = x.shape[0]
        same_input = x_candidates is x  # one process: anchors and candidates are one tensor
        local_class = class_of[offset : offset + n]  # (n,)
        z, inv_norm = _unit_rows(x)  # (n, D), (n, 1)
        c, inv_norm_c = (z, inv_norm) if same_input else _unit_rows(x_candidates)  # (N, D)
        anchors = z * inv_t  # (n, D): scale the thin side, not the (n, N) product
        logits = anchors @ c.T  # (n, N)
        logits.diagonal(offset).fill_(float("-inf"))
        # While |logit| <= 1/T is small enough, exp cannot overflow or underflow: no max-subtraction pass.
        shifted = needs_row_shift(inv_t, logits.dtype)
        if shifted:
            row_max = logits.amax(dim=1, keepdim=True)  # (n, 1), finite
            logits.sub_(row_max)
        exp = logits.exp_()  # (n, N), in the logits' buffer; the diagonal is 0
        row_sum = exp.sum(dim=1)  # (n,), > 0
        class_sums = c.new_zeros(num_classes, c.shape[1]).index_add_(0, class_of, c)  # (C, D)
        positives = class_sums.index_select(0, local_class).sub_(c[offset : offset + n])  # (n, D)
        positive_logits = torch.linalg.vecdot(anchors, positives)  # (n,) sum_p z_i . c_p / T
        ctx.save_for_backward(z, inv_norm, c, inv_norm_c, exp, row_sum, positives, class_of, weight, row_weight)
        ctx.inv_t, ctx.offset, ctx.num_classes, ctx.same_input = inv_t, offset, num_classes, same_input
        # One process and no shift: exp_ij = exp(z_i . z_j / T) is a symmetric matrix (diagonal 0).
        ctx.symmetric = same_input and not shifted
        per_anchor = row_sum.log()
        if shifted:
            per_anchor.add_(row_max.squeeze(1))
        per_anchor.sub_(positive_logits.mul_(weight))  # (n,) l_i
        # A weight of 0 (an anchor without positive) multiplies a finite l_i: exactly nothing.
        return torch.dot(row_weight, per_anchor)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        z, inv_norm, c, inv_norm_c, exp, row_sum, positives, class_of, weight, row_weight = ctx.saved_tensors
        n, offset, inv_t = z.shape[0], ctx.offset, ctx.inv_t
        grad = grad_loss * row_weight  # (n,) g_i: the loss's gradient for each anchor's term
        softmax_scale = (grad / row_sum)[:, None]  # (n, 1): exp_ij times this is g_i q_ij
        positive_scale = (grad * weight)[:, None]  # (n, 1): g_i w_i
        grad_z = grad_c = None
        with full_precision(grad.device):
            if ctx.symmetric and ctx.needs_input_grad[0]:
                return (
                    _symmetric_backward(z, inv_norm, exp, softmax_scale, positive_scale, positives, inv_t),
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                )
            if ctx.needs_input_grad[0]:
                grad_z = (exp @ c).mul_(softmax_scale)  # (n, D)
                grad_z.addcmul_(positives, positive_scale, value=-1.0).mul_(inv_t)
            if ctx.needs_input_grad[1]:
                grad_c = exp.T @ (z * (softmax_scale * inv_t))  # (N, D)
                pulled = z * (positive_scale * inv_t)  # (n, D): g_i w_i a_i
                local_class = class_of[offset : offset + n]
                per_class = pulled.new_zeros(ctx.num_classes, pulled.shape[1]).index_add_(0, local_class, pulled)
                # anchor i pulls every candidate of its class, except its own row
                grad_c.sub_(per_class.index_select(0, class_of))
                grad_c[offset : offset + n].add_(pulled)
            if ctx.same_input and grad_z is not None and grad_c is not None:
                # one tensor: add the two gradients once, before the (shared) normalisation
                return _through_unit_rows(grad_z.add_(grad_c), z, inv_norm), None, None, None, None, None, None, None
            grad_x = None if grad_z is None else _through_unit_rows(grad_z, z, inv_norm)
            grad_candidates = None if grad_c is None else _through_unit_rows(grad_c, c, inv_norm_c)
        return grad_x, grad_candidates, None, None, None, None, None, None


def _masked_terms(z, labels, references: References, inv_t: float, miner: str | None, epsilon: float):
    """Sum of ``l_i`` over the unit anchors that keep a positive against the unit ``references``, and their count.

    ``l_i = log sum_{a in A(i)} exp(s_ia / T) - 1/|P(i)| sum_{p in P(i)} s_ip / T`` with ``P(i)``
    the kept positives and ``A(i)`` the kept positives and negatives.

    Shape:
        z: (n, D); labels: (n,); returns two scalars.
    """
    positive, negative = pair_masks(labels, references)
    mined = mine(miner, epsilon, z, references, positive, negative)
    logits = (z * inv_t) @ references.embeddings.T  # (n, M)
    num_positives = mined.positive.sum(dim=1)  # (n,)
    has_positive = num_positives > 0
    # A skipped row keeps every logit, so that its (unused) logsumexp has no NaN gradient.
    candidates = mined.positive | mined.negative | ~has_positive[:, None]
    log_denominator = logits.masked_fill(~candidates, float("-inf")).logsumexp(dim=1)  # (n,)
    positive_sum = torch.where(mined.positive, logits, torch.zeros_like(logits)).sum(dim=1)  # (n,)
    positive_mean = positive_sum / num_positives.clamp_min(1)
    per_anchor = log_denominator - positive_mean
    return torch.where(has_positive, per_anchor, torch.zeros_like(per_anchor)).sum(), has_positive.sum()


def supcon_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    temperature: float = 0.1,
    base_temperature: float | None = None,
    miner: str | None = None,
    epsilon: float = 0.1,
    memory: CrossBatchMemory | None = None,
    gather_distributed: bool = True,
) -> torch.Tensor:
    """Supervised contrastive loss ``L_out`` (eq. 2 of [0]), mean over anchors that have a positive.

    Every sample ``i`` is an anchor; its positives ``P(i)`` are the other samples with its
    label, and its candidates ``A(i)`` are all samples but itself::

        l_i = -1/|P(i)| sum_{p in P(i)} log( exp(s_ip / T) / sum_{a in A(i)} exp(s_ia / T) )
            = log sum_{a != i} exp(s_ia / T)  -  1/|P(i)| sum_{p in P(i)} s_ip / T

        loss = (T / T_base) * mean over {i : |P(i)| > 0} of l_i

    ``s`` is the cosine similarity (embeddings are L2-normalised here). Eq. 2 sums over
    anchors; like the authors' code [1] and pytorch-metric-learning this takes the mean.
    ``T / T_base`` is the factor of [1] (``base_temperature``); it is 1 unless
    ``base_temperature`` is given, which is the paper's plain form.

    Anchors with no positive (a class seen once in the batch) are skipped: their average over
    an empty ``P(i)`` is 0/0, which is the NaN of [1] (SupContrast#141). The mean runs over the anchors that
    have one; with none at all the loss is 0, still attached to the graph so that
    ``backward()`` works. pytorch-metric-learning skips them the same way (its
    ``AvgNonZeroReducer``), but returns 0 when the batch has no *negative* at all, where eq. 2
    is still defined and this loss computes it.

    Cost: one (n, N) matmul forward and two backward (one in one process, where the (N, N)
    matrix is symmetric), a few passes over the (n, N) logits, and no (n, N) positive mask
    (see ``_SupConWeightedSum``).

    With a ``miner`` (see :mod:`sslkit.losses.miners`), ``P(i)`` holds the positives it keeps
    and ``A(i)`` the kept positives and negatives; anchors left without a positive are skipped.
    With ``memory`` (a :class:`~sslkit.losses.memory.CrossBatchMemory`) the batch is enqueued
    and the same loss of the anchors against the memory (``A(i)`` the memory but the anchor's
    own copy) is added. Both run :func:`_masked_terms`, plain autograd over (n, M) masks.

    Across processes, local anchors are compared with every process's embeddings and each
    process's loss is scaled so that their mean is the loss of the whole batch, however the
    anchors with a positive are spread over processes (see :mod:`sslkit.distributed`).

    Shape:
        embeddings: (N, D), any float dtype; labels: (N,) integer class ids.
        returns: scalar.
    """
    check_embeddings_labels(embeddings, labels)
    temperature = check_positive(temperature, "temperature")
    if base_temperature is not None:
        base_temperature = check_positive(base_temperature, "base_temperature")
    miner, epsilon = check_miner(miner, epsilon)
    gather_distributed = check_flag(gather_distributed, "gather_distributed")
    inv_t = 1.0 / temperature
    scale = 1.0 if base_temperature is None else temperature / base_temperature
    if miner is not None or memory is not None:
        with full_precision(embeddings.device):
            z = F.normalize(upcast(embeddings), dim=1)
            total = 0.0
            for references in reference_sets(z, labels, gather_distributed, memory):
                local_sum, count = _masked_terms(z, labels, references, inv_t, miner, epsilon)
                total = total + mean_over_processes(local_sum, count, gather_distributed)
            return scale * total
    with full_precision(embeddings.device):
        x = upcast(embeddings)
        candidates, candidate_labels, offset = gather_labelled(x, labels, gather_distributed)
        n = x.shape[0]
        classes, class_of, class_size = torch.unique(candidate_labels, return_inverse=True, return_counts=True)
        num_positives = class_size[class_of[offset : offset + n]] - 1  # (n,)
        has_positive = num_positives > 0
        count, world = has_positive.sum(), 1  # anchors with a positive, over every process
        if gather_distributed and distributed.is_distributed():
            count, world = distributed.gather_no_grad(count.reshape(1), check=False).sum(), distributed.world_size()
        if not count:
            # Every process holds the same global count, so all of them return here together
            # (no process waits in a collective that the others skip).
            return candidates.sum() * 0.0
        weight = 1.0 / num_positives.clamp_min(1).to(x.dtype)  # (n,) 1/|P(i)|
        # The mean over all anchors with a positive, as each process's share (the factor of
        # mean_over_processes, put on the rows): 0 for the skipped anchors.
        row_weight = has_positive.to(x.dtype) * (scale * world / count.to(x.dtype))  # (n,)
        return _SupConWeightedSum.apply(x, candidates, inv_t, offset, class_of, len(classes), weight, row_weight)


class SupConLoss(nn.Module):
    """Supervised contrastive loss of Khosla et al. [0], eq. 2 (``L_out``).

    Pulls each anchor towards every other sample of its class and away from the rest of the
    batch, with one softmax over the batch per (anchor, positive) pair; see
    :func:`supcon_loss` for the formula, the skipped anchors and the reduction.

    Two views, as in the paper's training: concatenate the views and repeat the labels. The
    loss does not care about the order of the rows, so this matches SupContrast's
    ``loss(torch.stack([z1, z2], dim=1), labels)`` (``contrast_mode="all"``). With
    ``labels = arange(N)`` every anchor's only positive is its other view and the loss is
    NT-Xent (SimCLR)::

        loss = SupConLoss(temperature=0.1)(torch.cat([z1, z2]), labels.repeat(2))

    Pairwise softmax cross-entropy (PSCE: the "Pairwise Cross-Entropy" of [2], written out in
    seed note 000, "comparing metric learning with softmax cross-entropy is itself a mistake")
    is this family: for each anchor, a softmax over the samples of the batch, with the
    samples of its label as targets (``j`` and ``k`` run over the whole batch, ``i`` included)::

        PSCE = - sum_i sum_{j : y_j = y_i} log( exp(z_i . z_j) / sum_k exp(z_i . z_k) )

    That is SupCon with the anchor's positives = the samples with its label, after three
    changes: cosine similarities over T instead of raw dot products (``T = 1`` on
    L2-normalised embeddings gives PSCE's logits), the anchor itself left out of the targets
    and the denominator (on normalised inputs its logit is the constant ``1/T``), and each
    anchor's targets averaged (``1/|P(i)|``) and the anchors averaged, where PSCE sums both.
    So ``SupConLoss(temperature=1.0)(F.normalize(z), labels)`` is PSCE on normalised
    embeddings up to the self-terms and that weighting. PSCE is the pairwise choice when
    there are only relative labels or too many classes to hold a weight matrix; with one
    weight vector per class it becomes the classification softmax cross-entropy of the heads.

    Args:
        temperature: T > 0 dividing the cosine similarities. 0.1 is the paper's setting and
            pytorch-metric-learning's default; the authors' code defaults to 0.07.
        base_temperature: if given, the loss is multiplied by ``temperature / base_temperature``
            as in [1] (its default 0.07 with T = 0.07 gives 1). ``None``: no factor, the paper's
            eq. 2 and pytorch-metric-learning's ``SupConLoss``.
        miner: which pairs count: ``None`` (every pair), ``"multi_similarity"``, ``"batch_hard"``,
            ``"semi_hard"`` or ``"distance_weighted"`` (see :mod:`sslkit.losses.miners`).
        epsilon: the miner's margin: multi-similarity's epsilon, the semi-hard window.
        memory_size: > 0 keeps the embeddings of that many earlier samples as extra references
            (cross-batch memory, see :mod:`sslkit.losses.memory`); 0: the batch only.
        gather_distributed: across processes, compare local anchors with every process's
            embeddings (the paper's large-batch setting). Off: each process sees its own batch.

    Shape:
        embeddings: (N, D); labels: (N,) integer; returns a scalar.

    >>> loss_fn = SupConLoss(temperature=0.1)
    >>> embeddings, labels = torch.randn(8, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> loss_fn(embeddings, labels).shape
    torch.Size([])
    """

    def __init__(
        self,
        temperature: float = 0.1,
        base_temperature: float | None = None,
        miner: str | None = None,
        epsilon: float = 0.1,
        memory_size: int = 0,
        gather_distributed: bool = True,
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        if base_temperature is not None:
            base_temperature = check_positive(base_temperature, "base_temperature")
        self.base_temperature = base_temperature
        self.miner, self.epsilon = check_miner(miner, epsilon)
        self.memory = memory_of(memory_size)
        self.gather_distributed = check_flag(gather_distributed, "gather_distributed")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return supcon_loss(
            embeddings,
            labels,
            self.temperature,
            self.base_temperature,
            self.miner,
            self.epsilon,
            self.memory,
            self.gather_distributed,
        )

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, base_temperature={self.base_temperature}, miner={self.miner!r}, "
            f"epsilon={self.epsilon}, gather_distributed={self.gather_distributed}"
        )
