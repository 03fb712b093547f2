"""Distances on L2-normalised features, in row blocks, and the k-means every clustering strategy shares.

Every strategy compares images by the Euclidean distance between their L2-normalised features,

    ||x - y||^2 = 2 - 2 x . y        (||x|| = ||y|| = 1),

computed a block of rows at a time (:data:`BLOCK_ROWS` x N floats) so that 60,000 images never need
the 60,000 x 60,000 matrix (14 GB) in memory. torch does the matrix products: on a CPU it runs
them on every core, and it is a dependency already.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

# Rows of a distance block: 512 x 60,000 float32 is 123 MB.
BLOCK_ROWS = 512

# TypiClust's clustering (deep-al/pycls/al/typiclust.py): full KMeans up to this many clusters,
# MiniBatchKMeans with batches of KMEANS_BATCH images beyond.
FULL_KMEANS_MAX_CLUSTERS = 50
KMEANS_BATCH = 5000


def normalized(vectors: np.ndarray) -> torch.Tensor:
    """Rows scaled to unit L2 norm, as float32 (a zero row stays zero).

    Shape:
        vectors: (N, D) float16 or float32 (a memory map is read once); returns: (N, D) float32.
    """
    features = torch.from_numpy(np.array(vectors, dtype=np.float32))  # a copy: a memory map is read-only
    return torch.nn.functional.normalize(features, dim=1)


def row_blocks(count: int, size: int = BLOCK_ROWS) -> Iterator[slice]:
    """Consecutive slices of at most ``size`` rows covering ``range(count)``."""
    for start in range(0, count, size):
        yield slice(start, min(start + size, count))


def squared_distances(queries: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``||q - x||^2`` between unit rows, clamped at 0 (rounding makes a point's distance to itself ~ -1e-7).

    Shape:
        queries: (B, D); features: (N, D); returns: (B, N).
    """
    return (queries @ features.T).mul_(-2).add_(2).clamp_(min=0)  # in place: one (B, N) block, no temporaries


def distance_blocks(queries: torch.Tensor, features: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """``(rows, squared distances of queries[rows] to every feature)``, block after block, all in one buffer.

    A caller keeps what it needs of a block before asking for the next, which overwrites it. One
    buffer rather than a fresh block each time: the C allocator would place blocks of under 32 MB on
    its heap, between the small results a caller keeps, and the heap would grow by a block each time.

    Shape:
        queries: (M, D) and features: (N, D) unit rows; each block: (at most BLOCK_ROWS, N).
    """
    buffer = torch.empty(min(BLOCK_ROWS, len(queries)), len(features))
    for rows in row_blocks(len(queries)):
        block = torch.mm(queries[rows], features.T, out=buffer[: rows.stop - rows.start])
        yield rows, block.mul_(-2).add_(2).clamp_(min=0)


def nearest_distances(features: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's L2 distances to its ``k`` nearest other rows, nearest first.

    The nearest entry of a row (distance 0, itself) is dropped, as deep-al's ``get_nn`` drops it.

    Shape:
        features: (M, D) unit rows, M > k; returns: (M, k).
    """
    out = torch.empty(len(features), k)
    for rows, distances in distance_blocks(features, features):
        out[rows] = distances.topk(k + 1, dim=1, largest=False).values[:, 1:].sqrt()
    return out


def kmeans(features: torch.Tensor, clusters: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn k-means of the rows, as TypiClust's code clusters them.

    ``KMeans`` (k-means++ starts, scikit-learn's default number of restarts) up to
    :data:`FULL_KMEANS_MAX_CLUSTERS` clusters, ``MiniBatchKMeans`` in batches of :data:`KMEANS_BATCH`
    beyond; both seeded with ``seed``.

    Returns:
        (cluster id of every row, the centres).

    Shape:
        features: (N, D); returns: (N,) int64 and (clusters, D) float32.
    """
    # Imported here: scikit-learn takes seconds to import, and only the clustering strategies need it.
    from sklearn.cluster import KMeans, MiniBatchKMeans

    if clusters <= FULL_KMEANS_MAX_CLUSTERS:
        model = KMeans(n_clusters=clusters, random_state=seed)
    else:
        model = MiniBatchKMeans(n_clusters=clusters, batch_size=KMEANS_BATCH, random_state=seed)
    ids = model.fit_predict(features.numpy())
    return ids.astype(np.int64), model.cluster_centers_.astype(np.float32)
