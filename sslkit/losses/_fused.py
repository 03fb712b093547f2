"""The fused forward/backward shared by NT-Xent, DCL and DCLW: one softmax cross-entropy over cosine logits.

Each of these losses is, per anchor ``i`` (unit vectors ``z_i``, ``a_i = z_i / T``)::

    l_i = log sum_{j in A(i)} exp(a_i . c_j)  -  w_i a_i . p_i,        loss = mean_i l_i

with candidates ``c_j``, a positive ``p_i`` and a weight ``w_i`` (1 except in DCLW):

====================  ========================================  =================
loss                  denominator A(i)                          positive in A(i)?
====================  ========================================  =================
NT-Xent, two views    the 2N embeddings but the anchor itself   yes
DCL / DCLW, two views the 2N embeddings but the anchor and p_i  no ("decoupled")
NT-Xent, bank (MoCo)  the bank and the query's key              yes
DCL / DCLW, bank      the bank                                  no
====================  ========================================  =================

Why by hand (as :mod:`sslkit.losses.supcon` does for SupCon): autograd through ``matmul ->
index_put(-inf) -> cross_entropy`` makes ``log_softmax``'s output, its gradient and the
index_put's clone as fresh (2n, 2N) tensors, and the normalisation and concatenation add a
dozen small nodes. On the CPU those passes cost as much as the matmuls. Here the forward is
one matmul, an in-place ``exp`` and a row sum; the backward is two matmuls (one in one
process, where ``E`` is symmetric), with every per-row factor (softmax denominator, incoming
gradient, temperature) folded into the thin (2n, D) side and the positive's own term added
there too, so no other (2n, 2N) pass remains (but the symmetric product's one). The views
are concatenated, normalised and scaled by the temperature in one buffer, the one the matmul
reads. So the loss costs little more than its three matmuls, where the autograd version's
extra passes cost about as much again (``tools/bench/losses.py`` times both).

Numerics: logits are fp32 or fp64 (callers upcast half precision and turn autocast off),
and ``|a_i . c_j| <= 1/T`` for unit vectors. While ``1/T`` is at most 60 (fp32; 600 in fp64),
``exp`` of every logit is a normal number (``exp(-60) ~ 9e-27``) and ``2N exp(60)`` is far
from overflow, so no row can sum to 0 or inf and the max-subtraction pass is skipped. Above
that (T < 1/60 in fp32) each row is shifted by its maximum over ``A(i)`` (not over all
entries: the anchor's own ``1/T`` would shift every other entry down by up to ``2/T`` and
underflow whole rows). Left-out entries are ``-inf`` before ``exp``: safe in fp32/fp64, and
every row keeps a finite entry.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from sslkit import distributed
from sslkit.losses._common import full_precision, needs_row_shift, symmetric_pair_product

_EPS = 1e-12  # F.normalize's default: a zero embedding stays zero instead of dividing by 0


def _scaled_unit_rows(parts: tuple[torch.Tensor, ...], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale * x / max(||x||, eps)`` for the rows of ``parts``, stacked into one new buffer.

    Concatenated first, then scaled in place: few passes over the rows, where autograd's
    ``cat``, ``F.normalize`` and ``* (1/T)`` take five or more. Also returns ``1 / max(||x||, eps)``.

    Shape:
        parts: each (m_k, D); returns rows (sum m_k, D) and inverse norms (sum m_k, 1).
    """
    if len(parts) == 1:
        inv_norm = torch.linalg.vector_norm(parts[0], dim=1, keepdim=True).clamp_min_(_EPS).reciprocal_()
        return parts[0] * (inv_norm * scale), inv_norm
    rows = torch.cat(parts)
    inv_norm = torch.linalg.vector_norm(rows, dim=1, keepdim=True).clamp_min_(_EPS).reciprocal_()
    return rows.mul_(inv_norm * scale), inv_norm


def _through_unit_rows(grad_u: torch.Tensor, rows: torch.Tensor, scale: float, inv_norm: torch.Tensor) -> torch.Tensor:
    """Chain rule through ``u = x / max(||x||, eps)``: ``(g - u (u . g)) / max(||x||, eps)``, in place on ``g``.

    ``g`` is the gradient with respect to ``u``; ``rows`` are ``scale * u`` as
    :func:`_scaled_unit_rows` made them. A zero row (``u = 0``) gets ``g / eps``, as through
    ``F.normalize``. (Rows with ``0 < ||x|| < eps`` keep the projection, which ``F.normalize``
    drops; no embedding is that small.)
    """
    along = torch.linalg.vecdot(rows, grad_u)[:, None] / (scale * scale)  # (m, 1) u . g / scale
    return grad_u.addcmul_(rows, along, value=-1.0).mul_(inv_norm)


def _pair_diagonals(matrix: torch.Tensor, top: int, bottom: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the entries ``(i, top + i)`` of the rows' first half and ``(n + i, bottom + i)`` of the second."""
    n = matrix.shape[0] // 2
    return matrix[:n].diagonal(top), matrix[n:].diagonal(bottom)


class _TwoViewSoftmaxCE(torch.autograd.Function):
    """The two-view loss of the module docstring on raw embeddings.

    Anchors: this process's ``[z1; z2]`` (2n rows). Candidates: every process's ``[c1; c2]``
    (2N rows, from the gather), or the anchors themselves in one process (``c1 is None``).
    ``offset`` is the row of this process's first image within a view: anchor ``i < n`` is
    candidate ``offset + i`` and its positive ``p(i)`` is candidate ``N + offset + i``; anchor
    ``n + i`` the other way round.

    The logits are ``A C^T`` with rows ``A = alpha z`` and ``C = beta c``, ``alpha beta = 1/T``
    (``alpha = 1/T, beta = 1`` across processes; ``alpha = beta = sqrt(1/T)`` in one process,
    where A and C are one buffer). With ``E`` the saved ``exp`` of the logits,
    ``s_i = g / sum_{A(i)}`` (``g``: the incoming gradient over 2n) and ``h_i = -g w_i``, the
    gradient with respect to the logits is ``G = diag(s) E + H``, ``H`` holding ``h_i`` at
    ``(i, p(i))``. So, before the normalisation (:func:`_through_unit_rows`)::

        dL/dz_i = alpha (s_i (E C)_i + h_i C_p(i)),    dL/dc_j = beta ((E^T (s A))_j + h_i A_i for the i with p(i) = j)

    In one process without a row shift ``E`` is symmetric (``exp(z_i . z_j / T)``, and the
    left-out pairs are symmetric too) and ``A = C``, so the two products are one:
    ``s_i (E A)_i + (E (s A))_i = ((s_i + s_j) E_ij) A``: one (2n, 2N) pass and one matmul
    instead of two matmuls (:func:`~sslkit.losses._common.symmetric_pair_product`). ``E`` is
    never written in the backward, so ``retain_graph`` and ``gradcheck`` can run it again. Not
    twice differentiable.
    """

    @staticmethod
    def forward(ctx, z1, z2, c1, c2, inv_t, offset, exclude_positive, weight):
        same_input = c1 is None
        anchor_scale = math.sqrt(inv_t) if same_input else inv_t
        anchors, inv_norm = _scaled_unit_rows((z1, z2), anchor_scale)  # (2n, D)
        if same_input:
            candidates, inv_norm_c, candidate_scale = anchors, inv_norm, anchor_scale
        else:
            candidates, inv_norm_c = _scaled_unit_rows((c1, c2), 1.0)  # (2N, D)
            candidate_scale = 1.0
        total = candidates.shape[0] // 2
        self_diagonals, positive_diagonals = (offset, total + offset), (total + offset, offset)
        logits = anchors @ candidates.T  # (2n, 2N)
        positive = torch.cat(_pair_diagonals(logits, *positive_diagonals))  # (2n,) a_i . p_i
        for excluded in _pair_diagonals(logits, *self_diagonals):
            excluded.fill_(float("-inf"))
        if exclude_positive:
            for excluded in _pair_diagonals(logits, *positive_diagonals):
                excluded.fill_(float("-inf"))
        shifted = needs_row_shift(inv_t, logits.dtype)
        if shifted:
            row_max = logits.amax(dim=1)  # (2n,), over A(i): finite
            logits.sub_(row_max[:, None])
        exp = logits.exp_()  # (2n, 2N) in the logits' buffer; left-out entries are 0
        row_sum = exp.sum(dim=1)  # (2n,)
        per_anchor = row_sum.log()
        if shifted:
            per_anchor += row_max
        per_anchor -= positive if weight is None else weight * positive
        ctx.save_for_backward(
            anchors, inv_norm, None if same_input else candidates, inv_norm_c, exp, row_sum, positive, weight
        )
        ctx.scales, ctx.offset = (anchor_scale, candidate_scale), offset
        ctx.symmetric = same_input and not shifted
        return per_anchor.mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        anchors, inv_norm, candidates, inv_norm_c, exp, row_sum, positive, weight = ctx.saved_tensors
        same_input = candidates is None
        if same_input:
            candidates = anchors
        anchor_scale, candidate_scale = ctx.scales
        n, total, offset = anchors.shape[0] // 2, candidates.shape[0] // 2, ctx.offset
        g = grad / anchors.shape[0]  # each anchor's share of the mean
        softmax_scale = (g / row_sum)[:, None]  # (2n, 1) s_i: E_ij s_i = g q_ij
        positive_scale = (-g).expand_as(softmax_scale) if weight is None else -g * weight[:, None]  # (2n, 1) h_i
        needs_anchors = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        needs_candidates = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
        grad_z = grad_c = None
        with full_precision(grad.device):
            if needs_anchors:
                if ctx.symmetric:
                    # E^T = E and C = A (see the docstring): both products in one
                    grad_z = symmetric_pair_product(exp, softmax_scale * anchor_scale, anchors)  # (2n, D)
                else:
                    grad_z = (exp @ candidates).mul_(softmax_scale * anchor_scale)  # (2n, D)
                if same_input and not ctx.symmetric:  # one process, rows shifted: E is not symmetric
                    grad_z.add_(exp.T @ (anchors * (softmax_scale * anchor_scale)))
                if same_input:
                    # row j is also the positive of p(j): h_p(j) A_p(j) joins h_j C_p(j) (A = C here)
                    positive_scale = positive_scale + positive_scale.roll(n, dims=0)
                positive_scale_z = positive_scale * anchor_scale
                grad_z[:n].addcmul_(candidates[total + offset : total + offset + n], positive_scale_z[:n])
                grad_z[n:].addcmul_(candidates[offset : offset + n], positive_scale_z[n:])
                grad_z = _through_unit_rows(grad_z, anchors, anchor_scale, inv_norm)
            if needs_candidates:
                grad_c = exp.T @ (anchors * (softmax_scale * candidate_scale))  # (2N, D)
                positive_scale_c = positive_scale * candidate_scale
                grad_c[total + offset : total + offset + n].addcmul_(anchors[:n], positive_scale_c[:n])
                grad_c[offset : offset + n].addcmul_(anchors[n:], positive_scale_c[n:])
                grad_c = _through_unit_rows(grad_c, candidates, candidate_scale, inv_norm_c)
        grad_weight = -g * positive if ctx.needs_input_grad[7] else None
        grad_z1, grad_z2 = (None, None) if grad_z is None else (grad_z[:n], grad_z[n:])
        grad_c1, grad_c2 = (None, None) if grad_c is None else grad_c.chunk(2)
        return grad_z1, grad_z2, grad_c1, grad_c2, None, None, None, grad_weight


class _BankSoftmaxCE(torch.autograd.Function):
    """The bank loss of the module docstring on raw embeddings: queries ``q``, keys ``k``, ``bank`` (K may be 0).

    With ``a = q / T`` (unit ``q``), ``E = exp(a c^T)`` over the bank, ``s_i = g / sum_i``, and
    ``h_i = s_i exp(a_i . k_i) - g w_i`` (the key's softmax share, if it is in the
    denominator, minus its weight)::

        dL/dq_i = (s_i sum_j E_ij c_j + h_i k_i) / T,   dL/dk_i = h_i a_i,   dL/dc_j = sum_i s_i E_ij a_i

    before the normalisation. Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, queries, keys, bank, inv_t, exclude_positive, weight):
        anchors, inv_norm = _scaled_unit_rows((queries,), inv_t)  # (m, D) a = q / T
        k, inv_norm_k = _scaled_unit_rows((keys,), 1.0)  # (m, D)
        c, inv_norm_c = _scaled_unit_rows((bank,), 1.0)  # (K, D)
        logits = anchors @ c.T  # (m, K)
        positive = torch.linalg.vecdot(anchors, k)  # (m,)
        row_max = None
        if needs_row_shift(inv_t, logits.dtype):
            row_max = logits.amax(dim=1) if logits.shape[1] else torch.full_like(positive, float("-inf"))
            if not exclude_positive:
                row_max = torch.maximum(row_max, positive)
            logits.sub_(row_max[:, None])
        exp = logits.exp_()  # (m, K) in the logits' buffer
        row_sum = exp.sum(dim=1)  # (m,)
        positive_exp = None
        if not exclude_positive:  # MoCo's eq. 1: the key is in its own query's denominator
            positive_exp = (positive if row_max is None else positive - row_max).exp()
            row_sum += positive_exp
        per_anchor = row_sum.log()
        if row_max is not None:
            per_anchor += row_max
        per_anchor -= positive if weight is None else weight * positive
        ctx.save_for_backward(
            anchors, inv_norm, k, inv_norm_k, c, inv_norm_c, exp, row_sum, positive_exp, positive, weight
        )
        ctx.inv_t = inv_t
        return per_anchor.mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (anchors, inv_norm, k, inv_norm_k, c, inv_norm_c, exp, row_sum, positive_exp, positive, weight) = (
            ctx.saved_tensors
        )
        inv_t = ctx.inv_t
        g = grad / anchors.shape[0]
        softmax_scale = g / row_sum  # (m,)
        key_scale = (-g).expand_as(row_sum) if weight is None else -g * weight  # (m,) h_i
        if positive_exp is not None:
            key_scale = key_scale + softmax_scale * positive_exp
        grad_q = grad_k = grad_c = None
        with full_precision(grad.device):
            if ctx.needs_input_grad[0]:
                grad_q = (exp @ c).mul_((softmax_scale * inv_t)[:, None])  # (m, D)
                grad_q.addcmul_(k, (key_scale * inv_t)[:, None])
                grad_q = _through_unit_rows(grad_q, anchors, inv_t, inv_norm)
            if ctx.needs_input_grad[1]:
                grad_k = _through_unit_rows(anchors * key_scale[:, None], k, 1.0, inv_norm_k)
            if ctx.needs_input_grad[2]:
                grad_c = _through_unit_rows(exp.T @ (anchors * softmax_scale[:, None]), c, 1.0, inv_norm_c)  # (K, D)
        grad_weight = -g * positive if ctx.needs_input_grad[5] else None
        return grad_q, grad_k, grad_c, None, None, grad_weight


def two_view_softmax_ce(
    z1: torch.Tensor,
    z2: torch.Tensor,
    inv_t: float,
    exclude_positive: bool,
    gather_distributed: bool,
    positive_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over this process's 2n anchors of ``log sum_{j in A(i)} exp(s_ij / T) - w_i s_ip / T``.

    ``A(i)`` holds every candidate but the anchor itself, and but its positive too when
    ``exclude_positive`` (DCL). Across processes the candidates are every process's views,
    gathered by :func:`sslkit.distributed.gather_with_grad` outside the fused function: its
    own backward sums the candidates' gradient over processes. Inputs are raw (not
    normalised), fp32 or fp64 of one dtype, and the call must run with autocast off
    (:func:`~sslkit.losses._common.full_precision`).

    Shape:
        z1, z2: (n, D), this process's views; positive_weight: (n,) per image, or None (1).
        returns: scalar.
    """
    weight = None if positive_weight is None else positive_weight.repeat(2)  # (2n,): both anchors of image i
    if gather_distributed and distributed.is_distributed():
        c1, c2 = distributed.gather_with_grad(z1), distributed.gather_with_grad(z2, check=False)  # (N, D) each
        offset = distributed.local_offset(z1.shape[0])
        return _TwoViewSoftmaxCE.apply(z1, z2, c1, c2, inv_t, offset, exclude_positive, weight)
    return _TwoViewSoftmaxCE.apply(z1, z2, None, None, inv_t, 0, exclude_positive, weight)


def bank_softmax_ce(
    queries: torch.Tensor,
    keys: torch.Tensor,
    bank: torch.Tensor,
    inv_t: float,
    exclude_positive: bool,
    positive_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over the queries of ``log(sum_j exp(s(q_i, n_j) / T) [+ exp(s(q_i, k_i) / T)]) - w_i s(q_i, k_i) / T``.

    The key joins the denominator unless ``exclude_positive`` (DCL). Same input rules as
    :func:`two_view_softmax_ce`; ``bank`` may hold no rows when the key is in the denominator.

    Shape:
        queries, keys: (m, D); bank: (K, D); positive_weight: (m,) or None. returns: scalar.
    """
    return _BankSoftmaxCE.apply(queries, keys, bank, inv_t, exclude_positive, positive_weight)
