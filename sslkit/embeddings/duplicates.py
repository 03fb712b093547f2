"""Near-duplicates within a set (SemDeDup), and near-copies of one set's items in another.

References:
    [0] Abbas et al. 2023, "SemDeDup: Data-efficient learning at web-scale through semantic
        deduplication", https://arxiv.org/abs/2303.09540 (section 3, and facebookresearch/SemDeDup)

SemDeDup [0], with a similarity threshold ``T`` in (0, 1] (the paper's ``1 - eps``):

1. L2-normalise the N vectors.
2. Cluster them into K clusters by spherical k-means
   (:func:`~sslkit.evaluation.clustering.spherical_kmeans`): two items
   are compared only when they share a cluster, so the pairs cost about N^2 / K instead of N^2.
3. Walk each cluster in the order of the keep rule: ``farthest`` from the cluster's centroid
   first ([0]'s default: the atypical example of a group is kept), ``nearest`` first, or
   ``first``, by row.
4. An item whose cosine similarity to an item already kept is at least ``T`` is a duplicate of
   the most similar such item; any other item is kept.

Each group is a kept item and its duplicates, and no two kept items of a cluster are T-similar.
Where this differs from facebookresearch/SemDeDup: there an item is removed when it is T-similar
to any earlier item of its cluster, kept or removed (the column maxima of the upper triangle of
the cluster's similarity matrix); here only kept items count, so of a chain a ~ b ~ c with
a !~ c, a and c are kept where SemDeDup keeps a alone, and every removed item has a kept item
that stands for it. SemDeDup computes each cluster's whole similarity matrix; here a block of
rows at a time is compared with the items kept so far (memory: a block x the cluster's size),
so a cluster may be as large as the set.

Known limitation (step 2): two T-similar items that k-means puts in different clusters are
never compared. ``tools/bench/duplicates_fashion_mnist.py`` counts them (docs/neighbours-and-duplicates.md).

Near-copies (:func:`near_copies`): each item's single nearest item in another set (a test set's
in its training set) by the exact search of :mod:`sslkit.evaluation.search`, a near-copy
when their similarity is at least ``T``.
"""

from __future__ import annotations

import csv
import dataclasses
import numbers
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sslkit.embeddings.choices import KEEP_RULES, KMEANS_BACKENDS
from sslkit.embeddings.neighbours import (
    check_finite,
    nearest_neighbours,
    progress_bar,
    read_unit_vectors,
)
from sslkit.errors import UserError
from sslkit.evaluation.clustering import spherical_kmeans
from sslkit.evaluation.search import cosine_blocks, import_faiss, rows_per_block
from sslkit.files import written_whole

# Items per cluster when K is not given: the within-cluster pairs cost N x 1,000 similarities.
DEFAULT_CLUSTER_SIZE = 1000


@dataclasses.dataclass(frozen=True)
class Deduplication:
    """What :func:`semdedup` found.

    Attributes:
        kept: (N,) bool, the items to keep.
        group_of: (N,) int64, the row of the kept item each item stands with (its own row when kept).
        similarity: (N,) float32, cosine similarity to that kept item (1 for a kept item).
        clusters: (N,) int64, the k-means cluster of each item.
        kmeans: what made the clusters: ``"faiss"`` or ``"torch"`` k-means, ``"given"`` by the caller, or
            ``"none"`` (one cluster).
        threshold: the T the groups were found with (given, or found for a ``fraction``).
        nearest: (N,) float32, each item's highest similarity to another item of its cluster (-1 alone in
            it): the pairs SemDeDup compares. An item is a duplicate only where this is at least T, so its
            distribution bounds what any threshold removes (:func:`threshold_table`).
    """

    kept: np.ndarray
    group_of: np.ndarray
    similarity: np.ndarray
    clusters: np.ndarray
    kmeans: str
    threshold: float
    nearest: np.ndarray

    @property
    def num_duplicates(self) -> int:
        return int((~self.kept).sum())

    def groups(self) -> list[np.ndarray]:
        """The groups with a duplicate, ordered by their kept row: each the kept row, then its duplicates by row."""
        duplicates = np.flatnonzero(~self.kept)
        owners = self.group_of[duplicates]
        order = np.lexsort((duplicates, owners))
        owners, duplicates = owners[order], duplicates[order]
        starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]]) if len(owners) else np.empty(0, np.int64)
        return [np.r_[owner, members] for owner, members in zip(owners[starts], np.split(duplicates, starts[1:]))]


@dataclasses.dataclass(frozen=True)
class NearCopies:
    """What :func:`near_copies` found.

    Attributes:
        nearest: (Q,) int64, the row of each item's nearest item in the other set.
        similarity: (Q,) float32, their cosine similarity.
        is_copy: (Q,) bool, similarity at least the threshold.
    """

    nearest: np.ndarray
    similarity: np.ndarray
    is_copy: np.ndarray


def check_threshold(threshold) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 < threshold <= 1:
        raise UserError(
            f"the threshold must be a cosine similarity in (0, 1], e.g. 0.95 (1 - eps in SemDeDup), got {threshold!r}"
        )


def check_fraction(fraction) -> None:
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction < 1:
        raise UserError(f"the fraction to remove must be in (0, 1), e.g. 0.05 for 5% of the items, got {fraction!r}")


def cluster(
    vectors: torch.Tensor, num_clusters: int, seed: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Step 2 of the module docstring: :func:`~sslkit.evaluation.clustering.spherical_kmeans` with ``backend``
    (``"auto"``: faiss where it is installed, else torch), one line for an unknown one or a missing faiss.

    Shape:
        vectors: (N, D) L2-normalised; returns: clusters (N,) int64, similarity to the centroid (N,) float32,
        and the backend that ran.
    """
    if backend not in KMEANS_BACKENDS:
        raise UserError(f"the k-means backend must be one of {', '.join(KMEANS_BACKENDS)}, got {backend!r}")
    if backend == "faiss":
        import_faiss()  # its one line, before any work
    return spherical_kmeans(vectors, num_clusters, seed, backend)


def walk_cluster(vectors: torch.Tensor, threshold: float, block_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Step 4 of the module docstring over one cluster, in the order given.

    A block of rows is compared with the items kept in earlier blocks in one product; the rows
    with no T-similar earlier row inside the block are then decided at once, and only the others
    (near-duplicates within the block, few) one at a time, since whether they are kept depends
    on which rows before them were.

    Shape:
        vectors: (n, D) L2-normalised, in walk order; returns: owner (n,) int64, the position of the
        kept item each item stands with, and similarity (n,) float32 to it.
    """
    n = len(vectors)
    owner, similarity = np.arange(n), np.ones(n, dtype=np.float32)
    kept = np.empty(0, dtype=np.int64)  # positions kept so far
    for start in range(0, n, block_rows):
        block = vectors[start : start + block_rows]  # (c, D)
        c = len(block)
        before = (block @ vectors[kept].T).numpy()  # (c, kept so far)
        before_best = before.max(axis=1, initial=-np.inf)
        before_owner = kept[before.argmax(axis=1)] if len(kept) else np.zeros(c, dtype=np.int64)
        inside = (block @ block.T).masked_fill_(torch.ones(c, c, dtype=torch.bool).triu(), -np.inf).numpy()
        block_kept = before_best < threshold  # final for rows with no T-similar row earlier in the block
        for row in np.flatnonzero(inside.max(axis=1) >= threshold):
            candidates = np.where(block_kept[:row], inside[row, :row], -np.inf)
            best = int(candidates.argmax())
            if candidates[best] > before_best[row] and candidates[best] >= threshold:
                block_kept[row], before_best[row], before_owner[row] = False, candidates[best], start + best
            else:
                block_kept[row] = before_best[row] < threshold
        duplicates = np.flatnonzero(~block_kept)
        owner[start + duplicates], similarity[start + duplicates] = before_owner[duplicates], before_best[duplicates]
        kept = np.r_[kept, start + np.flatnonzero(block_kept)]
    return owner, similarity


def walk_order(clusters: np.ndarray, centroid_similarity: np.ndarray, keep: str) -> np.ndarray:
    """Rows by cluster, then by the keep rule, then by row (so equal similarities walk in row order)."""
    key = {"farthest": centroid_similarity, "nearest": -centroid_similarity, "first": np.zeros(len(clusters))}[keep]
    return np.lexsort((np.arange(len(clusters)), key, clusters))


def given_clusters(vectors: torch.Tensor, clusters) -> tuple[torch.Tensor, torch.Tensor]:
    """Clusters given by the caller, and each item's similarity to its cluster's L2-normalised mean."""
    clusters = torch.as_tensor(np.asarray(clusters), dtype=torch.long)
    if clusters.shape != (len(vectors),) or (len(clusters) and clusters.min() < 0):
        raise UserError(f"clusters must be ({len(vectors)},) non-negative integers, got shape {tuple(clusters.shape)}")
    sums = torch.zeros(int(clusters.max()) + 1, vectors.shape[1]).index_add_(0, clusters, vectors)
    centroids = F.normalize(sums, dim=1)
    return clusters, (vectors * centroids[clusters]).sum(dim=1)


def semdedup(
    vectors,
    threshold: float | None = None,
    num_clusters: int | None = None,
    keep: str = "farthest",
    clusters=None,
    seed: int = 0,
    kmeans: str = "auto",
    progress: bool = False,
    fraction: float | None = None,
) -> Deduplication:
    """Groups of near-duplicates by SemDeDup (module docstring), and the items to keep.

    Args:
        vectors: the set, e.g. ``read_embeddings(folder).vectors``; any float dtype.
        threshold: T in (0, 1]: an item is a duplicate of a kept item when their cosine
            similarity is at least T.
        fraction: instead of ``threshold``, the share of the items to remove, in (0, 1), as FiftyOne's
            ``find_duplicates(fraction=...)`` takes it: T is then the highest threshold that removes at least
            that many (:func:`threshold_for_fraction`; more where items tie at it).
        num_clusters: k-means clusters; default N / :data:`DEFAULT_CLUSTER_SIZE`, at least 1.
            1 compares every pair (exact, N^2 similarities, in blocks).
        keep: which item of a group is kept: ``"farthest"`` from the centroid, ``"nearest"``, ``"first"`` row.
        clusters: (N,) cluster ids to use instead of k-means (ordered by similarity to each cluster's mean).
        seed: k-means' random start and sample.
        kmeans: ``"auto"``, ``"faiss"`` or ``"torch"`` (:func:`~sslkit.evaluation.clustering.spherical_kmeans`).
        progress: show a rich progress bar.

    Shape:
        vectors: (N, D); returns a :class:`Deduplication` of (N,) arrays.

    >>> x = np.array([[1, 0], [0.999, 0.04], [0, 1]], dtype=np.float32)
    >>> semdedup(x, 0.99, num_clusters=1, keep="first").kept.tolist()
    [True, False, True]
    """
    if (threshold is None) == (fraction is None):
        raise UserError("give the threshold or the fraction of the items to remove, one of the two")
    check_threshold(threshold) if fraction is None else check_fraction(fraction)
    if keep not in KEEP_RULES:
        raise UserError(f"keep must be one of {', '.join(KEEP_RULES)}, got {keep!r}")
    if vectors.ndim != 2 or len(vectors) == 0:
        raise UserError(f"the embeddings must be a non-empty (N, D) matrix, got shape {tuple(vectors.shape)}")
    num_clusters = num_clusters or max(1, round(len(vectors) / DEFAULT_CLUSTER_SIZE))
    if clusters is None and not 1 <= num_clusters <= len(vectors):
        raise UserError(f"the number of clusters must be between 1 and the {len(vectors)} items, got {num_clusters}")
    unit = read_unit_vectors(vectors, progress)  # (N, D)
    if not torch.isfinite(unit).all():
        check_finite(vectors, "the embeddings")
    if clusters is not None:
        (assigned, centroid_similarity), backend = given_clusters(unit, clusters), "given"
    elif num_clusters == 1:
        (assigned, centroid_similarity), backend = given_clusters(unit, np.zeros(len(unit), dtype=np.int64)), "none"
    else:
        assigned, centroid_similarity, backend = cluster(unit, num_clusters, seed, kmeans)
    assigned, centroid_similarity = assigned.numpy(), centroid_similarity.numpy()
    order = walk_order(assigned, centroid_similarity, keep)
    members = np.split(order, np.flatnonzero(np.diff(assigned[order])) + 1)
    nearest = nearest_in_cluster(unit, members)
    if fraction is not None:
        threshold = threshold_for_fraction(unit, members, nearest, fraction, progress)
    group_of, similarity = walk(unit, members, threshold, progress)
    kept = group_of == np.arange(len(unit))
    return Deduplication(kept, group_of, similarity, assigned, backend, float(threshold), nearest)


def walk(unit: torch.Tensor, members: list[np.ndarray], threshold: float, progress: bool = False):
    """Step 4 over every cluster: the kept item each row stands with, and its similarity to it.

    Shape:
        unit: (N, D) L2-normalised; members: each cluster's rows in walk order; returns (N,) int64, (N,) float32.
    """
    group_of, similarity = np.arange(len(unit)), np.ones(len(unit), dtype=np.float32)
    with progress_bar("comparing within clusters", progress) as bar:
        task = bar.add_task("", total=len(unit))
        for rows in members:
            owner, similarity[rows] = walk_cluster(unit[rows], threshold, rows_per_block(len(rows)))
            group_of[rows] = rows[owner]
            bar.advance(task, len(rows))
    return group_of, similarity


def nearest_in_cluster(unit: torch.Tensor, members: list[np.ndarray]) -> np.ndarray:
    """Each row's highest cosine similarity to another row of its cluster, -1 for a row alone in its cluster.

    Shape:
        unit: (N, D) L2-normalised; returns: (N,) float32.
    """
    nearest = np.empty(len(unit), dtype=np.float32)
    for rows in members:
        cluster_vectors, own = unit[rows], torch.arange(len(rows))  # (n, D), (n,)
        blocks = cosine_blocks(cluster_vectors, cluster_vectors, rows_per_block(len(rows)), own_columns=own)
        for start, stop, similarity in blocks:  # (c, n), the row's own column -inf
            nearest[rows[start:stop]] = similarity.max(dim=1).values.clamp_min(-1).numpy()
    return nearest


def threshold_for_fraction(
    unit: torch.Tensor, members: list[np.ndarray], nearest: np.ndarray, fraction: float, progress: bool = False
) -> float:
    """The highest T at which the walk removes at least ``fraction`` of the N items, by bisection.

    An item is removed only where its nearest similarity in its cluster is at least T, so T lies at or below
    the ``fraction`` quantile from the top of ``nearest``; the walk keeps one item of every T-similar pair, so
    the removed count at T is found by walking. The count falls as T rises (save in rare chains, where one
    more item kept removes another), and 30 halvings fix T to 1e-9.
    """
    target = max(1, round(fraction * len(unit)))
    candidates = np.sort(nearest)[::-1]
    if target > len(unit) - len(members) or candidates[target - 1] <= 0:
        raise UserError(
            f"no threshold in (0, 1] removes {fraction:.2%} of the items ({target:,}): at most "
            f"{int((nearest > 0).sum() - len(members)):,} have a positive similarity to another item of their "
            f"cluster; ask for a smaller fraction, or fewer clusters (--clusters)"
        )
    low, high = 0.0, float(candidates[target - 1])  # removes >= target at low (every pair), at most at high
    if (walk(unit, members, high)[0] != np.arange(len(unit))).sum() >= target:
        return high
    for _ in range(30):
        middle = (low + high) / 2
        removed = int((walk(unit, members, middle)[0] != np.arange(len(unit))).sum())
        low, high = (middle, high) if removed >= target else (low, middle)
    return low if low > 0 else high


def threshold_table(deduplication: Deduplication, thresholds=(0.8, 0.9, 0.95, 0.98, 0.99)) -> list[tuple[float, int]]:
    """``(T, items with another item of their cluster at least T-similar)`` for each T: at most what T removes."""
    return [(t, int((deduplication.nearest >= t).sum())) for t in thresholds]


def near_copies(vectors, others, threshold: float, progress: bool = False) -> NearCopies:
    """Each item's nearest item in ``others`` (exact search), a near-copy when their similarity is at least T.

    Shape:
        vectors: (Q, D); others: (N, D); returns a :class:`NearCopies` of (Q,) arrays.
    """
    check_threshold(threshold)
    similarities, indices = nearest_neighbours(others, k=1, queries=vectors, progress=progress)
    return NearCopies(indices[:, 0], similarities[:, 0], similarities[:, 0] >= threshold)


def save_groups(path: Path, deduplication: Deduplication, items: list[str]) -> None:
    """The groups as CSV, whole or not at all: ``group,row,item,kept,similarity`` (similarity to the group's kept
    item), the kept item first; items without a duplicate are not listed."""
    with written_whole(Path(path)) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["group", "row", "item", "kept", "similarity"])
        for group, rows in enumerate(deduplication.groups()):
            for row in rows:
                kept = bool(deduplication.kept[row])
                writer.writerow([group, int(row), items[row], kept, f"{deduplication.similarity[row]:.6f}"])


def save_near_copies(path: Path, copies: NearCopies, items: list[str], other_items: list[str]) -> None:
    """Every item as CSV, whole or not at all: ``row,item,nearest_row,nearest_item,similarity,near_copy``."""
    with written_whole(Path(path)) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "item", "nearest_row", "nearest_item", "similarity", "near_copy"])
        for row, (nearest, similarity, is_copy) in enumerate(zip(copies.nearest, copies.similarity, copies.is_copy)):
            writer.writerow([row, items[row], int(nearest), other_items[nearest], f"{similarity:.6f}", bool(is_copy)])
