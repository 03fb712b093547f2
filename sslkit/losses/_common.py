"""Small helpers every loss shares: argument checks and fp32 math under autocast.

Why fp32: ``exp(1/T)`` overflows fp16 once T < 0.09, and a (2N, 2N) softmax summed in bf16
loses most of its digits. Losses therefore upcast half-precision embeddings to fp32 and run
with autocast disabled (autocast would otherwise cast the matmul back to half). float64
input stays float64, so the tests can compare against loops in double precision.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from sslkit import distributed


def needs_row_shift(max_abs_logit: float, dtype: torch.dtype, terms: int | None = None) -> bool:
    """Whether a softmax over logits bounded by ``|l| <= max_abs_logit`` must subtract its row maximum.

    Without the shift every ``exp(l)`` must stay a normal number (``l >= log(tiny)``: no row
    can sum to 0) and a row's sum of ``terms`` of them must stay finite
    (``l <= log(max) - log(terms)``), with 1 of headroom for rounding. Below that bound the
    max-subtraction pass over the (rows x columns) logits is skipped. ``terms=None`` allows
    rows of up to 1e12 entries: the bound is then 60 in fp32 and 681 in fp64; a head with
    10,000 classes may go to 78 in fp32 (ArcFace's s = 64 needs no shift).
    """
    if dtype not in (torch.float32, torch.float64):
        return True
    info = torch.finfo(dtype)
    limit = min(-math.log(info.tiny), math.log(info.max) - math.log(terms or 1e12)) - 1.0
    return max_abs_logit > limit


# Rows per block of :func:`symmetric_pair_product`: a (512, 2N) temporary instead of a (2N, 2N)
# one: a block stays in cache, where one unblocked pass page-faults a fresh (2N, 2N) buffer in
# every step; while 2N is small, blocks neither help nor hurt.
PAIR_PRODUCT_ROWS = 512


def symmetric_pair_product(exp: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``s_i (E X)_i + (E (s X))_i = sum_j (s_i + s_j) E_ij X_j`` for a symmetric ``E``, in row blocks.

    A contrastive loss over one set of unit rows (``X`` both anchors and candidates) has the
    gradient ``diag(s) E X + E^T diag(s) X``; with ``E^T = E`` that is one matmul of
    ``(s_i + s_j) E_ij`` with ``X`` instead of two (or one twice as wide), and one pass over
    ``E`` to weight it. ``exp`` is only read.

    Shape:
        exp: (n, n) symmetric; scale: (n, 1); rows: (n, D); returns (n, D).
    """
    n = exp.shape[0]
    out = rows.new_empty(rows.shape)
    scale_row = scale.T  # (1, n)
    # One buffer for every block: on a CPU each fresh MiB-sized tensor is fresh pages from the
    # kernel, and faulting them in costs more than the arithmetic done in them.
    buffer = exp.new_empty(min(PAIR_PRODUCT_ROWS, n), n)
    for start in range(0, n, PAIR_PRODUCT_ROWS):
        block = slice(start, start + PAIR_PRODUCT_ROWS)
        weights = buffer[: min(PAIR_PRODUCT_ROWS, n - start)]  # (rows, n)
        torch.add(scale[block], scale_row, out=weights).mul_(exp[block])  # (s_i + s_j) E_ij
        torch.mm(weights, rows, out=out[block])
    return out


def upcast(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32; fp32 and fp64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def full_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """Context in which autocast is off, so the loss's matmuls run in the inputs' dtype."""
    return torch.autocast(device_type=device.type, enabled=False)


def as_number(value, name: str, kind: type = float):
    """``kind(value)`` (``float`` or ``int``), or a ``ValueError`` naming ``name`` when ``value``
    is not a number: None, a word, a list (``float()``'s own error would not say which argument)."""
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def check_flag(value, name: str) -> bool:
    """``value`` as a Python ``bool``, or a ``ValueError`` naming ``name`` when it is not a switch.

    Takes ``True``/``False``, the ints ``0``/``1`` (``nn.Linear(bias=0)`` style; no other
    reading is possible) and 0-d boolean NumPy or torch scalars (what ``x.mean() > 0.5``
    gives). Anything else is refused, not read as true: ``"no"`` and ``"false"`` are truthy
    strings, and None, 0.5 or a list have no meaning as a switch.
    """
    if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
        return bool(value)
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if str(dtype) in ("bool", "torch.bool") and shape == ():  # numpy.bool_, np.array(True), torch.tensor(True)
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def check_positive(value: float, name: str) -> float:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number > 0."""
    value = as_number(value, name)
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_tensor(value, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a tensor (not None, a list, an array)."""
    if not isinstance(value, torch.Tensor):
        missing = " (is it missing?)" if value is None else ""
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}{missing}")


def check_two_views(z1: torch.Tensor, z2: torch.Tensor) -> None:
    """Two views must both be (N, D) with the same N and D, N >= 1, floating point."""
    check_tensor(z1, "z1")
    check_tensor(z2, "z2")
    if z1.dim() != 2 or z2.dim() != 2:
        raise ValueError(
            f"z1 and z2 must be 2-D (N, D) embeddings, got shapes {tuple(z1.shape)} and {tuple(z2.shape)}"
        )
    if z1.shape != z2.shape:
        raise ValueError(
            f"z1 and z2 must have the same shape (two views of the same N samples), "
            f"got {tuple(z1.shape)} and {tuple(z2.shape)}"
        )
    if z1.shape[0] < 1:
        raise ValueError("z1 and z2 must hold at least one sample")
    if not z1.is_floating_point() or not z2.is_floating_point():
        raise ValueError(f"z1 and z2 must be floating point, got {z1.dtype} and {z2.dtype}")


def check_queries_keys(queries: torch.Tensor, keys: torch.Tensor) -> None:
    """(2N, D) floating point queries and keys of the same shape, N >= 1: both views stacked in each,
    ``[view 1; view 2]``, as every query-key loss takes them."""
    check_tensor(queries, "queries")
    check_tensor(keys, "keys")
    if queries.dim() != 2 or queries.shape != keys.shape:
        shapes = f"{tuple(queries.shape)} and {tuple(keys.shape)}"
        raise ValueError(f"queries and keys must be 2-D (2N, D) of the same shape, got {shapes}")
    if queries.shape[0] < 2 or queries.shape[0] % 2:
        raise ValueError(
            f"queries and keys must hold both views, [view 1; view 2]: an even number of rows >= 2, "
            f"got {queries.shape[0]}"
        )
    if not queries.is_floating_point() or not keys.is_floating_point():
        raise ValueError(f"queries and keys must be floating point, got {queries.dtype} and {keys.dtype}")


def check_multi_view_queries_keys(queries: torch.Tensor, keys: torch.Tensor) -> tuple[int, int]:
    """Multi-crop's queries of every view and keys of the two global views; returns (n images, V views).

    The queries stack every view of n images view by view, the two global views first,
    ``[view 1; view 2; local 1; ...]``; the keys (targets) the two global views only,
    ``[view 1; view 2]``. A ``ValueError`` says what does not fit.

    Shape:
        queries: (V n, D), V >= 2; keys: (2n, D).
    """
    check_tensor(queries, "queries")
    check_tensor(keys, "keys")
    if queries.dim() != 2 or keys.dim() != 2 or queries.shape[1] != keys.shape[1]:
        shapes = f"{tuple(queries.shape)} and {tuple(keys.shape)}"
        raise ValueError(f"queries and keys must be 2-D (rows, D) with the same D, got {shapes}")
    if keys.shape[0] < 2 or keys.shape[0] % 2:
        raise ValueError(
            f"keys must hold the two global views of n >= 1 images, [view 1; view 2]: an even number of rows >= 2, "
            f"got {keys.shape[0]}"
        )
    n = keys.shape[0] // 2
    if queries.shape[0] < 2 * n or queries.shape[0] % n:
        raise ValueError(
            f"queries must stack every view of the keys' {n} images, the two global views first "
            f"([view 1; view 2; local 1; ...]): a multiple of {n} rows, at least {2 * n}, got {queries.shape[0]}"
        )
    if not queries.is_floating_point() or not keys.is_floating_point():
        raise ValueError(f"queries and keys must be floating point, got {queries.dtype} and {keys.dtype}")
    return n, queries.shape[0] // n


def global_view_pairs(queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-crop's (query, key) pairs: the query of every view with the key of each global view but its own.

    View ``v`` meets global view ``g`` for every ``v != g``, image by image: ``2 (V - 1)`` pairs of
    views, the rule of DINO's and SwAV's multi-crop (targets from the global views only). Ordered
    by query view, then key view, so that with two views they are ``([q1; q2], [k2; k1])``, the
    pairs of the two-view losses. The keys are returned as given (callers detach them).

    Shape:
        queries: (V n, D), ``[view 1; view 2; local 1; ...]``; keys: (2n, D), ``[view 1; view 2]``.
        returns: two (2 (V - 1) n, D), the pairs' queries and their keys, row for row.
    """
    n, views = check_multi_view_queries_keys(queries, keys)
    pairs = [(v, g) for v in range(views) for g in range(2) if v != g]
    query_views, key_views = queries.split(n), keys.split(n)
    return torch.cat([query_views[v] for v, _ in pairs]), torch.cat([key_views[g] for _, g in pairs])


def pair_cosine(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The cosine of each query with the key of the same row, keys detached, in fp32 or fp64.

    Shape:
        queries, keys: (m, D); returns (m,).
    """
    dtype = torch.promote_types(upcast(queries).dtype, upcast(keys).dtype)
    q = F.normalize(upcast(queries).to(dtype), dim=1)
    k = F.normalize(upcast(keys.detach()).to(dtype), dim=1)
    return (q * k).sum(dim=1)


def cross_view_cosine(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The cosine of each query with the key of the same image's *other* view, keys detached.

    The core of the predictor losses (BYOL, SimSiam): ``q1_i`` is compared with ``k2_i`` and
    ``q2_i`` with ``k1_i``. The keys are targets, never trained through this term (BYOL's
    momentum encoder, SimSiam's stop-gradient), so they are detached here. Call it under
    :func:`full_precision`: the result is in fp32 or fp64.

    Shape:
        queries, keys: (2N, D), ``[view 1; view 2]``; returns (2N,), ``[cos(q1, k2); cos(q2, k1)]``.
    """
    n = queries.shape[0] // 2
    return pair_cosine(queries, keys.roll(n, dims=0))  # [k2; k1]: each query's other view


def gather_views(z1: torch.Tensor, z2: torch.Tensor, gather_distributed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Both views of every process's images, gathered with gradient, for a loss over batch statistics.

    Each process then computes the loss of the whole global batch; the gather's backward sums
    the W processes' gradients for this process's rows, which is the gradient convention of
    :mod:`sslkit.distributed` (``world_size`` times the 1-process gradient of the slice, which
    DDP's mean divides out). Without a process group, or with ``gather_distributed=False``, the
    local views.

    Shape:
        z1, z2: (n, D); returns two (W n, D), process r's rows at ``r * n : (r + 1) * n``.
    """
    if not (gather_distributed and distributed.is_distributed()):
        return z1, z2
    return distributed.gather_with_grad(z1), distributed.gather_with_grad(z2, check=False)


def check_views(views) -> None:
    """V >= 2 views of the same images: each (N, D) with the same N and D, floating point."""
    if len(views) < 2:
        raise ValueError(f"views must hold at least 2 views of the same images, got {len(views)}")
    for view in views[1:]:
        check_two_views(views[0], view)


def gather_every_view(views, gather_distributed: bool) -> list[torch.Tensor]:
    """:func:`gather_views` for V views: each view of every process's images, gathered with gradient.

    Shape:
        views: V tensors (n, D); returns V (W n, D), process r's rows at ``r * n : (r + 1) * n``.
    """
    if not (gather_distributed and distributed.is_distributed()):
        return list(views)
    # One size check: the views have the same rows (check_views).
    return [distributed.gather_with_grad(view, check=index == 0) for index, view in enumerate(views)]


def global_view_view_pairs(views: int) -> list[tuple[int, int]]:
    """The unordered pairs of views (g, v) with g a global view (0 or 1), each once: (0, 1), (0, l), (1, l).

    For the losses that compare two views symmetrically (Barlow Twins, VICReg) under multi-crop:
    ``1 + 2 L`` pairs for two global and L local views; with two views, the one pair (0, 1).
    """
    return [(g, v) for g in range(2) for v in range(g + 1, views)]


def check_batch_for_statistics(samples: int, why: str) -> None:
    """Raise ``ValueError`` unless a loss computed from per-feature batch statistics has 2 samples or more."""
    if samples < 2:
        raise ValueError(f"z1 and z2 must hold at least 2 samples in all, got {samples}: {why}; use a larger batch")


def check_negatives(negatives: torch.Tensor | None, dim: int) -> None:
    """An optional bank of negatives must be (K, D) with the embeddings' D."""
    if negatives is None:
        return
    check_tensor(negatives, "negatives")
    if negatives.dim() != 2 or negatives.shape[1] != dim:
        raise ValueError(f"negatives must be (K, {dim}), got shape {tuple(negatives.shape)}")
    if not negatives.is_floating_point():  # as z1 and z2: integer embeddings are a mistake, not a cast
        raise ValueError(f"negatives must be floating point embeddings, got {negatives.dtype}")


# SupContrast (the SupCon authors' code) takes (batch, views, D) features; reshape(-1, D) orders
# the rows b0v0, b0v1, b1v0, ..., so each label repeats once per view, next to itself.
_VIEWS_HINT = (
    "; for (batch, views, D) as in SupContrast, pass embeddings.reshape(-1, D) with labels.repeat_interleave(views)"
)


def check_embeddings(embeddings: torch.Tensor, hint_3d: str = "") -> None:
    """(N, D) floating point, with its own message for a wrong shape and for a wrong dtype, so
    that neither reads as the other; ``hint_3d`` is added to the message for a 3-D tensor."""
    check_tensor(embeddings, "embeddings")
    if embeddings.dim() != 2:
        hint = hint_3d if embeddings.dim() == 3 else ""
        raise ValueError(f"embeddings must be 2-D (N, D), got shape {tuple(embeddings.shape)}{hint}")
    if not embeddings.is_floating_point():
        raise ValueError(f"embeddings must be floating point, got {embeddings.dtype}")


def check_embeddings_labels(embeddings: torch.Tensor, labels: torch.Tensor | None) -> None:
    """Label losses need (N, D) floating embeddings and (N,) integer labels."""
    if labels is None:
        raise ValueError("labels are required: this loss compares samples by class, pass labels of shape (N,)")
    check_embeddings(embeddings, _VIEWS_HINT)
    check_tensor(labels, "labels")
    if labels.dim() != 1 or labels.shape[0] != embeddings.shape[0]:
        raise ValueError(
            f"labels must be (N,) with N = {embeddings.shape[0]} to match embeddings, got shape {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be integer class ids, got {labels.dtype}")


def check_nonnegative(value: float, name: str) -> float:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number >= 0."""
    value = as_number(value, name)
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def pairwise_distance(x: torch.Tensor, y: torch.Tensor, squared: bool = False) -> torch.Tensor:
    """Euclidean distances between the rows of ``x`` and the rows of ``y``.

    Expanded as ``|x|^2 + |y|^2 - 2 x.y``: one matmul instead of an (n, m, D) difference
    tensor. Rounding can push that below 0, hence the clamp. ``sqrt`` has an infinite slope
    at 0 (a sample against itself, an exact duplicate), so the root is taken of
    ``max(d^2, tiny)``: such entries get a finite (zero) gradient, not inf or NaN, which
    matters even for masked-out entries because ``0 * inf`` is NaN.

    Shape:
        x: (n, D); y: (m, D); returns (n, m).
    """
    sq = (x * x).sum(dim=1, keepdim=True) + (y * y).sum(dim=1) - 2.0 * (x @ y.T)  # (n, m)
    sq = sq.clamp_min(0.0)
    if squared:
        return sq
    return sq.clamp_min(torch.finfo(sq.dtype).tiny).sqrt()


def gather_labelled(
    embeddings: torch.Tensor, labels: torch.Tensor, gather_distributed: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Candidates for a label loss's local anchors: every process's embeddings and labels.

    Embeddings are gathered with gradient, labels without. ``offset`` is the row of this
    process's first sample among the candidates, so local anchor ``i`` is candidate
    ``i + offset`` (to exclude it as its own positive). Without a process group, or with
    ``gather_distributed=False``, the candidates are the local batch and ``offset`` is 0.

    Shape:
        embeddings: (n, D); labels: (n,).
        returns: candidates (N, D), candidate labels (N,), offset; N = world_size * n.
    """
    if gather_distributed and distributed.is_distributed():
        return (
            distributed.gather_with_grad(embeddings),
            distributed.gather_no_grad(labels, check=False),  # as many rows as the embeddings
            distributed.local_offset(embeddings.shape[0]),
        )
    return embeddings, labels, 0


def mean_over_processes(local_sum: torch.Tensor, local_count: torch.Tensor, gather_distributed: bool) -> torch.Tensor:
    """This process's share of a mean over terms that every process holds a part of.

    Returns ``local_sum * world_size / global_count``, so that the mean over processes of the
    returned values is ``sum of all terms / number of all terms``: the 1-process loss on the
    whole batch, even when processes hold different numbers of terms (mined triplets,
    positive pairs). The count is summed over processes (no gradient needed: it is
    piecewise constant). With no terms anywhere the loss is 0, not NaN.

    Shape:
        local_sum, local_count: scalars; returns a scalar.
    """
    count = local_count.to(local_sum.dtype).reshape(1)
    scale = 1
    if gather_distributed and distributed.is_distributed():
        count = distributed.gather_no_grad(count, check=False).sum()  # one number each
        scale = distributed.world_size()
    return (local_sum * scale / count.clamp_min(1)).reshape(())


class References(NamedTuple):
    """What a pair loss compares its local anchors with: the batch, or a cross-batch memory.

    ``self_column[i]`` is local anchor ``i``'s own column among the references (its own row
    is no pair), -1 where it is not among them. ``anchor_offset`` and ``num_anchors`` place
    the local anchors among every process's anchors (rows ``anchor_offset : anchor_offset + n``
    of ``num_anchors``): a random miner draws for all of them and keeps this process's rows.

    Shape:
        embeddings: (M, D); labels: (M,); self_column: (n,) int64.
    """

    embeddings: torch.Tensor
    labels: torch.Tensor
    self_column: torch.Tensor
    anchor_offset: int
    num_anchors: int


def batch_references(embeddings: torch.Tensor, labels: torch.Tensor, gather_distributed: bool) -> References:
    """The batch as references for its own local anchors: every process's samples when gathering
    (with gradient, see :func:`gather_labelled`), else the local batch; anchor ``i`` is column
    ``i + offset``."""
    candidates, candidate_labels, offset = gather_labelled(embeddings, labels, gather_distributed)
    n = embeddings.shape[0]
    self_column = torch.arange(n, device=embeddings.device) + offset
    return References(candidates, candidate_labels, self_column, offset, candidates.shape[0])


def pair_masks(labels: torch.Tensor, references: References) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive pairs (same label, not the anchor itself) and negative pairs (other label).

    Shape:
        labels: (n,); returns two (n, M) bool masks.
    """
    same = labels[:, None] == references.labels[None, :]  # (n, M)
    positive = same.clone()
    present = references.self_column >= 0
    rows = torch.arange(labels.shape[0], device=labels.device)
    positive[rows[present], references.self_column[present]] = False
    return positive, ~same
