"""Retrieval metrics for metric learning: Recall@K, MAP@R and NMI on cached features.

References:
    [0] Song et al. 2016, "Deep Metric Learning via Lifted Structured Feature Embedding",
        https://arxiv.org/abs/1511.06452 (the CUB-200 / Cars-196 protocol, Recall@K and NMI)
    [1] Musgrave et al. 2020, "A Metric Learning Reality Check", https://arxiv.org/abs/2003.08505
        (section 3.2, MAP@R)

Similarities are cosine, computed one chunk of queries at a time, so only a
(chunk_size, gallery) block is ever in memory. The nearest-neighbour part is hand-written
(one matrix product and one ``topk`` per chunk) because it runs on the features' device and
needs no extra dependency; pytorch-metric-learning's ``AccuracyCalculator`` is the test
oracle. NMI uses scikit-learn's KMeans and ``normalized_mutual_info_score``.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from sslkit.evaluation._checks import check_class_ids, check_features

# KMeans restarts for NMI: one k-means++ start makes NMI swing by a few points between
# seeds on real features; three keep it steady at little cost next to the encoder pass.
KMEANS_RESTARTS = 3


def _check_retrieval_args(query_features, query_labels, gallery_features, gallery_labels, ks, chunk_size) -> None:
    check_features(query_features, "query_features")
    check_class_ids(query_labels, "query_labels", query_features.shape[0])
    if (gallery_features is None) != (gallery_labels is None):
        raise ValueError("gallery_features and gallery_labels must be given together (or both None for leave-one-out)")
    if gallery_features is None:
        if query_features.shape[0] < 2:
            raise ValueError("query_features: leave-one-out retrieval needs at least 2 samples")
    else:
        check_features(gallery_features, "gallery_features")
        if gallery_features.shape[1] != query_features.shape[1]:
            raise ValueError(
                f"gallery_features must be (G, {query_features.shape[1]}) to match query_features, "
                f"got shape {tuple(gallery_features.shape)}"
            )
        check_class_ids(gallery_labels, "gallery_labels", gallery_features.shape[0])
    if not isinstance(ks, Sequence) or isinstance(ks, str):
        raise ValueError(f"ks must be a list of integers >= 1 such as [1, 2, 4, 8], got {ks!r}")
    if len(ks) == 0 or any(int(k) != k or k < 1 for k in ks):
        raise ValueError(f"ks must be a non-empty list of integers >= 1, got {tuple(ks)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


@torch.no_grad()
def retrieval_metrics(
    query_features: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_features: torch.Tensor | None = None,
    gallery_labels: torch.Tensor | None = None,
    ks: Sequence[int] = (1, 2, 4, 8),
    chunk_size: int = 1024,
    seed: int = 0,
) -> dict[str, float]:
    """Recall@K, MAP@R and NMI of cosine retrieval.

    Without a gallery, each query retrieves among all the other queries (leave-one-out: the
    CUB-200 / Cars-196 protocol of [0]). For a query with ``R`` relevant gallery samples
    (same label; itself excluded) and ``rel(i)`` = 1 when its i-th nearest neighbour is
    relevant:

    - ``recall@K``: 1 if ``rel(i) = 1`` for some ``i <= K`` (K beyond the gallery means
      the whole gallery), else 0 [0];
    - ``map@r``: ``1/R sum_{i=1}^{R} P(i) rel(i)`` with ``P(i)`` the precision among the
      first i neighbours ([1], section 3.2);

    each averaged over the queries with ``R >= 1`` (a query whose class is absent from the
    gallery has nothing to find; pytorch-metric-learning drops these "lone" queries too).
    ``nmi`` is the normalised mutual information between the query labels and a KMeans
    clustering of the L2-normalised query features into as many clusters as there are
    labels (``KMEANS_RESTARTS`` starts, ``random_state=seed``) [0].

    Args:
        query_features, query_labels: the samples that query (and, without a gallery, the
            samples retrieved).
        gallery_features, gallery_labels: a separate set to retrieve from, or None.
        ks: the K of each Recall@K.
        chunk_size: queries per similarity block.
        seed: KMeans' random state.

    Shape:
        query_features: (N, D); query_labels: (N,) integer
        gallery_features: (G, D); gallery_labels: (G,) integer
        returns: ``{"recall@1": ..., "recall@K": ..., "map@r": ..., "nmi": ...}``, floats in [0, 1].

    >>> z = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> retrieval_metrics(z, torch.tensor([0, 0, 1, 1]), ks=(1,))
    {'recall@1': 1.0, 'map@r': 1.0, 'nmi': 1.0}
    """
    _check_retrieval_args(query_features, query_labels, gallery_features, gallery_labels, ks, chunk_size)
    leave_one_out = gallery_features is None
    device = query_features.device
    queries = F.normalize(query_features.float(), dim=1)  # (N, D)
    if leave_one_out:
        gallery, gallery_labels = queries, query_labels
    else:
        gallery = F.normalize(gallery_features.to(device).float(), dim=1)  # (G, D)
    query_labels = query_labels.to(device=device, dtype=torch.long)
    gallery_labels = gallery_labels.to(device=device, dtype=torch.long)

    # R per query: gallery samples of its class, itself not counted in leave-one-out.
    all_labels, inverse = torch.unique(torch.cat([query_labels, gallery_labels]), return_inverse=True)
    query_class, gallery_class = inverse[: len(query_labels)], inverse[len(query_labels) :]
    class_sizes = torch.bincount(gallery_class, minlength=len(all_labels))
    relevant = class_sizes[query_class] - int(leave_one_out)  # (N,)
    scored = relevant > 0  # queries with something to find
    retrievable = gallery.shape[0] - int(leave_one_out)
    ks = [int(k) for k in ks]
    depth_for_recall = min(max(ks), retrievable)

    hits = torch.zeros(len(ks), dtype=torch.float64, device=device)
    average_precision_sum = torch.zeros((), dtype=torch.float64, device=device)
    for start in range(0, queries.shape[0], chunk_size):
        stop = min(start + chunk_size, queries.shape[0])
        similarity = queries[start:stop] @ gallery.T  # (c, G)
        if leave_one_out:
            rows = torch.arange(stop - start, device=device)
            similarity[rows, rows + start] = float("-inf")  # a query never retrieves itself
        chunk_relevant = relevant[start:stop]  # (c,)
        chunk_scored = scored[start:stop]
        depth = max(depth_for_recall, int(chunk_relevant.max()))
        neighbours = similarity.topk(depth, dim=1).indices  # (c, depth), nearest first
        is_relevant = gallery_class[neighbours] == query_class[start:stop, None]  # (c, depth)

        for i, k in enumerate(ks):
            hits[i] += is_relevant[:, :k].any(dim=1)[chunk_scored].sum()

        rank = torch.arange(1, depth + 1, device=device)  # (depth,)
        counted = is_relevant & (rank[None, :] <= chunk_relevant[:, None])  # rel(i) for i <= R
        precision = counted.cumsum(dim=1, dtype=torch.float64) / rank  # (c, depth): P(i) over the first R ranks
        average_precision = (precision * counted).sum(dim=1) / chunk_relevant.clamp_min(1)  # (c,)
        average_precision_sum += average_precision[chunk_scored].sum()

    num_scored = int(scored.sum())
    metrics = {}
    for i, k in enumerate(ks):
        metrics[f"recall@{k}"] = (hits[i] / num_scored).item() if num_scored else float("nan")
    metrics["map@r"] = (average_precision_sum / num_scored).item() if num_scored else float("nan")
    metrics["nmi"] = _nmi(queries, query_labels, seed)
    return metrics


def _nmi(features: torch.Tensor, labels: torch.Tensor, seed: int) -> float:
    """NMI between ``labels`` and KMeans clusters of ``features`` (one cluster per label).

    Shape:
        features: (N, D) L2-normalised; labels: (N,)
    """
    # Imported here: scikit-learn takes seconds to import, and every training process imports
    # sslkit.evaluation for the kNN monitor, which does not need it.
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score

    labels = labels.cpu().numpy()
    num_clusters = len(set(labels.tolist()))
    kmeans = KMeans(n_clusters=num_clusters, n_init=KMEANS_RESTARTS, random_state=seed)
    clusters = kmeans.fit_predict(features.cpu().double().numpy())
    return float(normalized_mutual_info_score(labels, clusters))
