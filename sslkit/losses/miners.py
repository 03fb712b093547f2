"""Miners: which pairs (or triplets) of a labelled batch a pair loss is computed on.

A miner looks at the anchors against their references (the batch, or a cross-batch memory)
and keeps the informative pairs; the loss is then computed on those alone. Each miner has a
functional core on a (n, M) similarity or distance matrix and the masks of the positive and
negative pairs; :func:`mine` runs the one a loss's ``miner`` argument names.

- ``"multi_similarity"`` ([0], its pair mining): a negative is kept when it is more similar than
  the anchor's least similar positive minus ``epsilon``, a positive when it is less similar
  than the anchor's most similar negative plus ``epsilon``: ``S_in > min_p S_ip - epsilon``,
  ``S_ip < max_n S_in + epsilon``.
- ``"batch_hard"`` ([1]): per anchor, its farthest positive and its closest negative.
- ``"semi_hard"`` ([2], Sec. 3.2): triplets ``(a, p, n)`` whose negative lies beyond the positive
  but within ``epsilon`` of it: ``d_ap < d_an < d_ap + epsilon``.
- ``"distance_weighted"`` ([3], Sec. 4): for each positive pair ``(a, p)``, one negative drawn with
  probability proportional to ``min(lambda, q(d_an)^-1)``, ``q(d)`` the density of distances
  between random points on the unit sphere in D dimensions,
  ``q(d) ~ d^(D-2) (1 - d^2/4)^((D-3)/2)``; as in the authors' code (and
  pytorch-metric-learning's ``DistanceWeightedMiner``) ``d`` is clipped below at 0.5 in place of
  ``lambda``, and negatives at ``d >= 1.4`` (zero loss for the margin loss) are never drawn.

Pair losses take a triplet miner's pairs as the union of its triplets: a positive pair that
begins some kept triplet, a negative pair that ends one (pytorch-metric-learning's
``convert_to_pairs``). The triplet loss takes a pair miner's pairs as every triplet of a kept
positive and a kept negative of the same anchor (its ``convert_to_triplets``).

Geometry: every miner compares L2-normalised embeddings, without gradient: cosine similarity
for multi-similarity, Euclidean distance for the others (pytorch-metric-learning's defaults),
whatever distance the loss itself uses.

Across processes, each process mines the rows of its local anchors against the gathered
references: the rows of the mining of the whole batch, in rank order. The draws of
``"distance_weighted"`` are made for every process's anchors from the default generator and
each process keeps its rows, so with the same seed on every process (``accelerate``'s
``set_seed``) the processes draw as one process on the whole batch would.

References:
    [0] Multi-Similarity Loss with General Pair Weighting for Deep Metric Learning, Wang et al. 2019,
        https://arxiv.org/abs/1904.06627 (pair mining)
    [1] In Defense of the Triplet Loss for Person Re-Identification, Hermans, Beyer, Leibe 2017,
        https://arxiv.org/abs/1703.07737 (batch hard, Sec. 2)
    [2] FaceNet, Schroff, Kalenichenko, Philbin 2015, https://arxiv.org/abs/1503.03832 (semi-hard, Sec. 3.2)
    [3] Sampling Matters in Deep Embedding Learning, Wu, Manmatha, Smola, Krahenbuhl 2017,
        https://arxiv.org/abs/1706.07567 (distance weighted sampling, Sec. 4)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from sslkit.losses._common import References, check_nonnegative, pairwise_distance

MINERS = ("multi_similarity", "batch_hard", "semi_hard", "distance_weighted")

# Wu et al.'s code: distances below 0.5 are weighted as 0.5 (the paper's cap lambda on q^-1),
# and negatives at 1.4 or more are not drawn (they give the margin loss no gradient).
DISTANCE_WEIGHTED_CUTOFF = 0.5
DISTANCE_WEIGHTED_NONZERO_CUTOFF = 1.4


def check_miner(miner: str | None, epsilon: float) -> tuple[str | None, float]:
    """A loss's ``miner`` (one of :data:`MINERS` or None) and ``epsilon`` (>= 0), or a ValueError naming them."""
    if miner is not None and miner not in MINERS:
        raise ValueError(f"miner must be one of {', '.join(MINERS)} or None (every pair), got {miner!r}")
    return miner, check_nonnegative(epsilon, "epsilon")


class Mined(NamedTuple):
    """The pairs a loss is computed on, and for triplet miners the triplets they come from.

    ``triplets`` is ``(anchor, positive, valid)``: one row per positive pair ``(anchor[k],
    positive[k])`` and ``valid[k, j]`` when ``j`` is a kept negative of that pair.

    Shape:
        positive, negative: (n, M) bool; anchor, positive: (P,) int64; valid: (P, M) bool.
    """

    positive: torch.Tensor
    negative: torch.Tensor
    triplets: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def multi_similarity_pairs(
    sim: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-similarity pair mining ([0]) on cosine similarities.

    An anchor without a negative keeps no positive and one without a positive keeps no
    negative (the bounds are then -inf and +inf).

    Shape:
        sim, positive, negative: (n, M); returns the kept (positive, negative) masks, (n, M) bool.
    """
    hardest_negative = sim.masked_fill(~negative, float("-inf")).amax(dim=1, keepdim=True)  # (n, 1)
    hardest_positive = sim.masked_fill(~positive, float("inf")).amin(dim=1, keepdim=True)  # (n, 1)
    return positive & (sim - epsilon < hardest_negative), negative & (sim + epsilon > hardest_positive)


def batch_hard_pairs(
    dist: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch hard ([1]): each anchor with a positive and a negative keeps its farthest positive
    and its closest negative.

    Shape:
        dist, positive, negative: (n, M); returns (positive, negative) masks with one pair per row at most.
    """
    rows = torch.arange(dist.shape[0], device=dist.device)
    valid = positive.any(dim=1) & negative.any(dim=1)  # (n,)
    farthest = dist.masked_fill(~positive, float("-inf")).argmax(dim=1)  # (n,)
    closest = dist.masked_fill(~negative, float("inf")).argmin(dim=1)  # (n,)
    kept_positive, kept_negative = torch.zeros_like(positive), torch.zeros_like(negative)
    kept_positive[rows[valid], farthest[valid]] = True
    kept_negative[rows[valid], closest[valid]] = True
    return kept_positive, kept_negative


def semi_hard_triplets(
    dist: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, margin: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Semi-hard triplets ([2], Sec. 3.2): for each positive pair, the negatives with ``d_ap < d_an < d_ap + margin``.

    One row per positive pair instead of an (n, M, M) cube.

    Shape:
        dist, positive, negative: (n, M); returns anchor (P,), positive (P,), valid (P, M).
    """
    anchor, positive_idx = positive.nonzero(as_tuple=True)  # (P,), (P,)
    d_ap = dist[anchor, positive_idx][:, None]  # (P, 1)
    d_an = dist[anchor]  # (P, M)
    valid = negative[anchor] & (d_an > d_ap) & (d_an < d_ap + margin)
    return anchor, positive_idx, valid


def distance_weighted_probabilities(dist: torch.Tensor, negative: torch.Tensor, dim: int) -> torch.Tensor:
    """Each anchor's probability of drawing each negative ([3], Sec. 4), on unit embeddings in ``dim`` dimensions.

    ``p_an ~ q(max(d_an, 0.5))^-1`` over the negatives with ``d_an < 1.4``, where
    ``log q(d)^-1 = (2 - D) log d - (D - 3) / 2 log(1 - d^2 / 4)``; normalised per row as a
    softmax of those logs (the weights span hundreds of orders of magnitude at D = 128). A row
    without such a negative is all zero.

    Shape:
        dist, negative: (n, M); returns (n, M), rows summing to 1 or 0.
    """
    d = dist.clamp_min(DISTANCE_WEIGHTED_CUTOFF)
    log_weight = (2.0 - dim) * d.log() - ((dim - 3.0) / 2.0) * torch.log1p(-0.25 * d * d)  # (n, M)
    eligible = negative & (dist < DISTANCE_WEIGHTED_NONZERO_CUTOFF)
    # Rows without an eligible negative get finite logits, so that the softmax is not 0/0; zeroed after.
    has_any = eligible.any(dim=1, keepdim=True)
    logits = log_weight.masked_fill(~eligible & has_any, float("-inf")).masked_fill(~has_any, 0.0)
    return torch.where(has_any, logits.softmax(dim=1), torch.zeros_like(logits))


def distance_weighted_triplets(
    dist: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, dim: int, uniform: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One negative per positive pair ``(a, p)``, drawn from anchor ``a``'s distance-weighted probabilities.

    The draw is by inverse CDF with ``uniform[a, p]`` in [0, 1): the first negative whose
    cumulative probability exceeds it, so a negative of probability 0 is never drawn. Pairs
    whose anchor has no eligible negative keep no triplet.

    Shape:
        dist, positive, negative, uniform: (n, M); returns anchor (P,), positive (P,), valid (P, M).
    """
    probabilities = distance_weighted_probabilities(dist, negative, dim)  # (n, M)
    anchor, positive_idx = positive.nonzero(as_tuple=True)  # (P,), (P,)
    cdf = probabilities.cumsum(dim=1)[anchor]  # (P, M)
    target = (uniform[anchor, positive_idx] * cdf[:, -1])[:, None]  # (P, 1)
    drawn = torch.searchsorted(cdf, target, right=True).clamp_max(dist.shape[1] - 1)  # (P, 1)
    valid = torch.zeros_like(cdf, dtype=torch.bool)
    valid.scatter_(1, drawn, (cdf[:, -1:] > 0))
    return anchor, positive_idx, valid


def triplet_pairs(
    triplets: tuple[torch.Tensor, torch.Tensor, torch.Tensor], shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs of a set of triplets: positive pairs that begin one, negative pairs that end one.

    Shape:
        triplets: anchor (P,), positive (P,), valid (P, M); returns two (n, M) bool masks.
    """
    anchor, positive_idx, valid = triplets
    kept = valid.any(dim=1)  # (P,)
    positive = torch.zeros(shape, dtype=torch.bool, device=valid.device)
    positive[anchor[kept], positive_idx[kept]] = True
    per_anchor = torch.zeros(shape, dtype=torch.int64, device=valid.device)
    negative = per_anchor.index_add_(0, anchor, valid.long()) > 0
    return positive, negative


def mined_triplets(mined: Mined) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The triplets a triplet loss takes from ``mined``: a triplet miner's own, else every kept
    positive with every kept negative of its anchor.

    Shape:
        returns anchor (P,), positive (P,), valid (P, M).
    """
    if mined.triplets is not None:
        return mined.triplets
    anchor, positive_idx = mined.positive.nonzero(as_tuple=True)
    return anchor, positive_idx, mined.negative[anchor]


def mine(
    miner: str | None,
    epsilon: float,
    anchors: torch.Tensor,
    references: References,
    positive: torch.Tensor,
    negative: torch.Tensor,
) -> Mined:
    """Run ``miner`` (None: every pair) on local ``anchors`` against ``references``.

    Shape:
        anchors: (n, D); positive, negative: (n, M) bool, the pairs by label.
    """
    if miner is None:
        return Mined(positive, negative)
    with torch.no_grad():
        z = F.normalize(anchors.detach(), dim=1)
        r = F.normalize(references.embeddings.detach(), dim=1)
        if miner == "multi_similarity":
            return Mined(*multi_similarity_pairs(z @ r.T, positive, negative, epsilon))
        dist = pairwise_distance(z, r)  # (n, M)
        if miner == "batch_hard":
            return Mined(*batch_hard_pairs(dist, positive, negative))
        if miner == "semi_hard":
            triplets = semi_hard_triplets(dist, positive, negative, epsilon)
        else:
            # Drawn for every process's anchors, so that each process keeps the rows one process would draw.
            uniform = torch.rand(references.num_anchors, r.shape[0], dtype=dist.dtype, device=dist.device)
            uniform = uniform[references.anchor_offset : references.anchor_offset + z.shape[0]]
            triplets = distance_weighted_triplets(dist, positive, negative, z.shape[1], uniform)
        return Mined(*triplet_pairs(triplets, positive.shape), triplets)
