"""Retrieval metrics for metric learning: Recall@K, R-Precision, MAP@R and NMI on cached features.

References:
    [0] Song et al. 2016, "Deep Metric Learning via Lifted Structured Feature Embedding",
        https://arxiv.org/abs/1511.06452 (the CUB-200 / Cars-196 protocol, Recall@K and NMI)
    [1] Musgrave et al. 2020, "A Metric Learning Reality Check", https://arxiv.org/abs/2003.08505
        (section 3.2, R-Precision and MAP@R)

Bounded memory. Similarities are cosine, computed for one chunk of queries at a time against
every reference (:func:`sslkit.evaluation.search.cosine_blocks`), so the largest tensor is one
(chunk_size, G) block and never the (N, G) matrix (60,000 x 60,000 float32 would be 14 GB). Each
chunk needs one matrix product and one top-k to the depth the metrics look at
(:func:`sslkit.evaluation.top_k.nearest_columns`): the largest K, or the largest R of the chunk for
MAP@R (``tools/bench/retrieval.py`` measures time and memory against the full matrix). The search
runs on the features' device and needs no extra dependency; pytorch-metric-learning's
``AccuracyCalculator`` is the test oracle. :func:`sslkit.embeddings.nearest_neighbours` is the same
search over an embeddings file, its queries read from disk one block at a time.

Order of neighbours: :mod:`sslkit.evaluation.top_k`'s, most similar first and exact ties by the
reference's index, lowest first (faiss' exact index and pytorch-metric-learning's default kNN),
whatever the chunk size and the number of processes. When the queries are the references
(leave-one-out, pytorch-metric-learning's ``ref_includes_query``), a query is removed from its own
ranking; an exact duplicate of it is not.

Several processes. Every process passes the same, complete features (what
:func:`~sslkit.evaluation.features.extract_features` returns); each scores its own contiguous
share of the queries against all the references, and the per-query sums are added over
processes, so every process returns the same metrics as one process would. NMI's k-means runs
on the first process only and its result is shared.

NMI uses scikit-learn's ``KMeans`` and ``normalized_mutual_info_score``. pytorch-metric-learning
clusters with faiss' k-means instead: a different clustering of the same features, so the two
NMIs agree only up to k-means' own variation (given the same cluster assignment, they are equal).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sslkit import distributed
from sslkit.evaluation._checks import check_class_ids, check_features
from sslkit.evaluation.clustering import KMEANS_RESTARTS, kmeans
from sslkit.evaluation.search import cosine_blocks
from sslkit.evaluation.top_k import nearest_columns


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


def _check_same_labels_everywhere(query_labels: torch.Tensor, gallery_labels: torch.Tensor) -> None:
    """Raise ``ValueError`` on every process unless all of them hold the same numbers of samples and labels.

    A cheap fingerprint (two sizes, two label sums), not a full comparison: it catches the likely
    mistake, features of this process's shard only, which would otherwise score each share of
    the queries against another set of references and return a plausible number.
    """
    fingerprint = torch.tensor(
        [len(query_labels), len(gallery_labels), int(query_labels.sum()), int(gallery_labels.sum())]
    )
    largest = distributed.all_reduce(fingerprint, op=dist.ReduceOp.MAX)
    smallest = distributed.all_reduce(fingerprint, op=dist.ReduceOp.MIN)
    if not torch.equal(largest, smallest):
        raise ValueError(
            f"query_features differ between processes ({int(smallest[0])} to {int(largest[0])} queries, or other "
            f"labels): every process must pass the same, complete features, as extract_features returns them"
        )


def _chunk_sums(
    similarity: torch.Tensor,
    query_class: torch.Tensor,
    relevant: torch.Tensor,
    gallery_class: torch.Tensor,
    ks: list[int],
) -> torch.Tensor:
    """Recall@K hits, R-Precision, AP@R and the count of scored queries, summed over a chunk of queries.

    Only queries with ``R >= 1`` count (see :func:`retrieval_metrics`).

    Shape:
        similarity: (c, G), -inf where a query meets itself; query_class: (c,);
        relevant: (c,) the R of each query; gallery_class: (G,)
        returns: (len(ks) + 3,) float64
    """
    retrievable = int(torch.isfinite(similarity[0]).sum())  # the gallery, less the query itself in leave-one-out
    depth = min(max(max(ks), int(relevant.max())), retrievable)
    is_relevant = gallery_class[nearest_columns(similarity, depth)] == query_class[:, None]  # (c, depth)

    rank = torch.arange(1, depth + 1, device=similarity.device)  # (depth,)
    counted = is_relevant & (rank <= relevant[:, None])  # rel(i) for i <= R
    r = relevant.clamp_min(1).double()  # (c,)
    precision = counted.cumsum(dim=1, dtype=torch.float64) / rank  # (c, depth): P(i)
    per_query = [is_relevant[:, :k].any(dim=1).double() for k in ks]
    per_query += [counted.sum(dim=1) / r, (precision * counted).sum(dim=1) / r, torch.ones_like(r)]
    return torch.stack(per_query, dim=1)[relevant > 0].sum(dim=0)  # (len(ks) + 3,)


@torch.no_grad()
def retrieval_metrics(
    query_features: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_features: torch.Tensor | None = None,
    gallery_labels: torch.Tensor | None = None,
    ks: Sequence[int] = (1, 2, 4, 8),
    chunk_size: int = 1024,
    seed: int = 0,
    nmi: bool = True,
) -> dict[str, float]:
    """Recall@K, R-Precision, MAP@R and NMI of cosine retrieval, in bounded memory and any number of processes.

    Without a gallery, each query retrieves among all the other queries (leave-one-out: the
    CUB-200 / Cars-196 protocol of [0]). For a query with ``R`` relevant gallery samples
    (same label; itself excluded) and ``rel(i)`` = 1 when its i-th nearest neighbour is
    relevant (the order is in the module docstring):

    - ``recall@K``: 1 if ``rel(i) = 1`` for some ``i <= K`` (K beyond the gallery means
      the whole gallery), else 0 [0]; pytorch-metric-learning's ``precision_at_1`` is ``recall@1``;
    - ``r_precision``: ``1/R sum_{i=1}^{R} rel(i)`` ([1], section 3.2);
    - ``map@r``: ``1/R sum_{i=1}^{R} P(i) rel(i)`` with ``P(i)`` the precision among the
      first i neighbours ([1], section 3.2);

    each averaged over the queries with ``R >= 1`` (a query whose class is absent from the
    gallery has nothing to find; pytorch-metric-learning drops these "lone" queries too).
    ``nmi`` is the normalised mutual information between the query labels and a KMeans
    clustering of the L2-normalised query features into as many clusters as there are
    labels (``KMEANS_RESTARTS`` starts, ``random_state=seed``) [0].

    Memory: one (chunk_size, G) similarity block and its top R, never the (N, G) matrix.
    Under a process group every process must call it, with the same features, as with any
    collective: each scores its share of the queries (module docstring).

    Args:
        query_features, query_labels: the samples that query (and, without a gallery, the
            samples retrieved); the same on every process.
        gallery_features, gallery_labels: a separate set to retrieve from, or None.
        ks: the K of each Recall@K.
        chunk_size: queries per similarity block.
        seed: KMeans' random state.
        nmi: False leaves NMI out, and with it k-means, most of the time on a large set of queries.

    Shape:
        query_features: (N, D); query_labels: (N,) integer
        gallery_features: (G, D); gallery_labels: (G,) integer
        returns: ``{"recall@1": ..., "recall@K": ..., "r_precision": ..., "map@r": ..., "nmi": ...}``,
        floats in [0, 1] (no ``"nmi"`` with ``nmi=False``).

    >>> z = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> retrieval_metrics(z, torch.tensor([0, 0, 1, 1]), ks=(1,))
    {'recall@1': 1.0, 'r_precision': 1.0, 'map@r': 1.0, 'nmi': 1.0}
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
    if distributed.is_distributed():
        _check_same_labels_everywhere(query_labels, gallery_labels)

    # R per query: gallery samples of its class, itself not counted in leave-one-out.
    all_labels, inverse = torch.unique(torch.cat([query_labels, gallery_labels]), return_inverse=True)
    query_class, gallery_class = inverse[: len(query_labels)], inverse[len(query_labels) :]
    relevant = torch.bincount(gallery_class, minlength=len(all_labels))[query_class] - int(leave_one_out)  # (N,)
    ks = [int(k) for k in ks]

    # This process's share of the queries, contiguous so that a query's own column is start + row.
    share = torch.arange(len(queries)).tensor_split(distributed.world_size())[distributed.rank()]
    first, last = (int(share[0]), int(share[-1]) + 1) if len(share) else (0, 0)
    sums = torch.zeros(len(ks) + 4, dtype=torch.float64, device=device)  # hits per K, R-Prec, AP, scored, NMI
    own_columns = torch.arange(len(queries), device=device) if leave_one_out else None  # never retrieves itself
    for start, stop, similarity in cosine_blocks(queries, gallery, chunk_size, own_columns, first, last):
        sums[:-1] += _chunk_sums(similarity, query_class[start:stop], relevant[start:stop], gallery_class, ks)
    if nmi and distributed.rank() == 0:
        sums[-1] = _nmi(queries, query_labels, seed)
    sums = distributed.all_reduce(sums).tolist()

    num_scored = sums[-2]
    averages = [total / num_scored if num_scored else float("nan") for total in sums[:-2]]
    metrics = {f"recall@{k}": average for k, average in zip(ks, averages)}
    metrics["r_precision"], metrics["map@r"] = averages[-2:]
    if nmi:
        metrics["nmi"] = sums[-1]
    return metrics


def _nmi(features: torch.Tensor, labels: torch.Tensor, seed: int) -> float:
    """NMI between ``labels`` and KMeans clusters of ``features`` (one cluster per label).

    Shape:
        features: (N, D) L2-normalised; labels: (N,)
    """
    from sklearn.metrics import normalized_mutual_info_score

    labels = labels.cpu().numpy()
    clusters, _ = kmeans(features.double(), len(set(labels.tolist())), seed, restarts=KMEANS_RESTARTS)
    return float(normalized_mutual_info_score(labels, clusters))
