"""k-means: scikit-learn's (NMI, the selection strategies) and spherical k-means in torch or faiss (SemDeDup).

- :func:`kmeans`: scikit-learn's ``KMeans`` (k-means++ starts), or ``MiniBatchKMeans`` beyond a
  number of clusters. NMI (:mod:`sslkit.evaluation.retrieval`) restarts it
  :data:`KMEANS_RESTARTS` times on float64 features; TypiClust and ProbCover
  (:mod:`sslkit.selection`) take scikit-learn's default starts, and TypiClust mini-batches beyond
  :data:`FULL_KMEANS_MAX_CLUSTERS` clusters, as its code does.
- :func:`spherical_kmeans`: Lloyd's iterations on cosine similarity, the centroids L2-normalised
  means, as SemDeDup clusters (:mod:`sslkit.embeddings.duplicates`): faiss'
  ``Kmeans(spherical=True)`` where faiss is installed, else its torch form (the same iterations). Why not
  scikit-learn's ``KMeans`` there: it is Euclidean, not spherical, and its k-means++ start costs
  O(N K D log K), hours at a million items and a thousand clusters.

Each item goes to its most similar centroid by :func:`sslkit.evaluation.search.exact_search`
(equal similarities: the lowest centroid).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from sslkit.evaluation.search import exact_search, faiss_installed, import_faiss

# KMeans restarts for NMI: one k-means++ start makes NMI swing by a few points between
# seeds on real features; three keep it steady at little cost next to the encoder pass.
KMEANS_RESTARTS = 3
# TypiClust's clustering (deep-al/pycls/al/typiclust.py): full KMeans up to this many clusters,
# MiniBatchKMeans with batches of KMEANS_BATCH images beyond.
FULL_KMEANS_MAX_CLUSTERS = 50
KMEANS_BATCH = 5000
# Spherical k-means: Lloyd's iterations, and at most this many items per cluster to learn from
# (faiss' default max_points_per_centroid): more barely moves the centroids and costs proportionally more.
KMEANS_ITERATIONS = 20
MAX_POINTS_PER_CENTROID = 256
SPHERICAL_BACKENDS = ("auto", "faiss", "torch")


def kmeans(
    features: torch.Tensor,
    num_clusters: int,
    seed: int,
    restarts: int | str = "auto",
    minibatch_beyond: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn k-means of the rows: ``KMeans`` with ``restarts`` k-means++ starts, or ``MiniBatchKMeans``
    (batches of :data:`KMEANS_BATCH`) for more than ``minibatch_beyond`` clusters; seeded with ``seed``.

    The features are clustered in their own dtype (float64 for NMI, float32 for the strategies).

    Returns:
        (cluster id of every row, the centres).

    Shape:
        features: (N, D); returns: (N,) int64 and (num_clusters, D) in the features' dtype.
    """
    # Imported here: scikit-learn takes seconds to import, and every training process imports
    # sslkit.evaluation for the kNN monitor, which does not need it.
    from sklearn.cluster import KMeans, MiniBatchKMeans

    if minibatch_beyond is not None and num_clusters > minibatch_beyond:
        model = MiniBatchKMeans(n_clusters=num_clusters, batch_size=KMEANS_BATCH, random_state=seed)
    else:
        model = KMeans(n_clusters=num_clusters, n_init=restarts, random_state=seed)
    ids = model.fit_predict(features.cpu().numpy())
    return ids.astype(np.int64), model.cluster_centers_


def assign(vectors: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each vector's most similar centroid and their cosine similarity.

    Shape:
        vectors: (N, D) and centroids: (K, D), both L2-normalised; returns: (N,) int64 and (N,) float32.
    """
    similarity, nearest = exact_search(vectors, centroids, 1)
    return nearest[:, 0], similarity[:, 0]


def _torch_spherical_kmeans(vectors: torch.Tensor, num_clusters: int, seed: int) -> torch.Tensor:
    """Centroids by spherical k-means, as faiss' ``Kmeans(spherical=True)`` computes them: k distinct random
    items to start, at most :data:`MAX_POINTS_PER_CENTROID` items per cluster to learn from,
    :data:`KMEANS_ITERATIONS` iterations, an emptied cluster restarted at a random item (faiss splits
    the largest one instead).

    Shape:
        vectors: (N, D) L2-normalised; returns: (num_clusters, D) L2-normalised.
    """
    generator = torch.Generator().manual_seed(seed)
    sample = vectors[torch.randperm(len(vectors), generator=generator)[: MAX_POINTS_PER_CENTROID * num_clusters]]
    centroids = sample[torch.randperm(len(sample), generator=generator)[:num_clusters]].clone()
    for _ in range(KMEANS_ITERATIONS):
        clusters, _ = assign(sample, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, clusters, sample)  # (K, D)
        empty = torch.bincount(clusters, minlength=num_clusters) == 0
        sums[empty] = sample[torch.randint(len(sample), (int(empty.sum()),), generator=generator)]
        centroids = F.normalize(sums, dim=1)
    return centroids


def _faiss_spherical_kmeans(vectors: torch.Tensor, num_clusters: int, seed: int) -> torch.Tensor:
    """Centroids by faiss' ``Kmeans(spherical=True)``, with the iterations and sample of the torch one.

    Shape:
        vectors: (N, D) L2-normalised float32 on the CPU; returns: (num_clusters, D) L2-normalised.
    """
    faiss = import_faiss()
    model = faiss.Kmeans(
        vectors.shape[1], num_clusters, niter=KMEANS_ITERATIONS, spherical=True, seed=seed,
        max_points_per_centroid=MAX_POINTS_PER_CENTROID, verbose=False,
    )  # fmt: skip
    model.train(vectors.numpy())
    return F.normalize(torch.from_numpy(model.centroids), dim=1)


def spherical_kmeans(
    vectors: torch.Tensor, num_clusters: int, seed: int = 0, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Spherical k-means clusters and each item's similarity to its centroid.

    ``backend``: ``"faiss"``, ``"torch"``, or ``"auto"``, faiss where it is installed, else torch; the
    two learn different centroids from the same items.

    Shape:
        vectors: (N, D) L2-normalised; returns: clusters (N,) int64, similarity (N,) float32, and
        the backend that ran (``"faiss"`` or ``"torch"``).
    """
    if backend not in SPHERICAL_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(SPHERICAL_BACKENDS)}, got {backend!r}")
    if backend == "auto":
        backend = "faiss" if faiss_installed() else "torch"
    learn = _faiss_spherical_kmeans if backend == "faiss" else _torch_spherical_kmeans
    return *assign(vectors, learn(vectors, num_clusters, seed)), backend
