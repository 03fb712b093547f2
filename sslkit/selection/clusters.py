"""Strategies that cluster the images first: the image nearest each k-means centre, and TypiClust.

TypiClust (Hacohen, Dekel & Weinshall, "Active Learning on a Budget: Opposite Strategies Suit High
and Low Budgets", ICML 2022, https://arxiv.org/abs/2202.02794): with few labels, label the most
*typical* image of each of as many clusters as there will be labels. Typicality is inverse density
over the K nearest neighbours,

    typicality(x) = 1 / (1/K * sum_{x_i in KNN(x)} ||x - x_i||_2  +  1e-5).

What follows the paper and what follows its code (github.com/avihu111/TypiClust,
``deep-al/pycls/al/typiclust.py``):

- paper and code: features L2-normalised; ``min(labelled + budget, 500)`` k-means clusters;
  clusters of at most 5 images are never visited; clusters are visited in order of fewest labelled
  images, then largest; in a cluster, the pick is the most typical of its images not yet labelled,
  with typicality measured among those images only, over ``K = min(20, their number // 2)``
  neighbours (the paper's K is 20; the halving is the code's, for small clusters).
- code: the order is fixed before the first pick (the i-th pick comes from the ``i mod C``-th cluster
  of that order); KMeans up to 50 clusters, MiniBatchKMeans (batches of 5000) beyond.
- paper, not code: the distance is the L2 distance as the paper writes it; the code's faiss
  ``IndexFlatL2`` returns *squared* distances, which can order two images differently.
- neither (cases the code does not reach): a cluster with no unlabelled image left is passed over;
  with one left (K = 0), that one is taken; once every cluster of more than 5 images is used up, the
  small ones are visited in the same order.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from sslkit.evaluation.clustering import FULL_KMEANS_MAX_CLUSTERS, kmeans
from sslkit.evaluation.search import exact_search

# deep-al/pycls/al/typiclust.py: TypiClust.MIN_CLUSTER_SIZE, MAX_NUM_CLUSTERS, K_NN.
MIN_CLUSTER_SIZE = 5
MAX_CLUSTERS = 500
NEIGHBOURS = 20
TYPICALITY_EPSILON = 1e-5


def nearest_to_centres(features: torch.Tensor, budget: int, labelled: np.ndarray, seed: int) -> np.ndarray:
    """The unlabelled image nearest each of ``budget`` k-means centres of every image.

    Centres are taken in turn, each the nearest image no earlier centre took and no one labelled.

    Shape:
        features: (N, D) unit rows; labelled: (N,) bool; returns: (budget,) row indices.
    """
    _, centres = kmeans(features, budget, seed, minibatch_beyond=FULL_KMEANS_MAX_CLUSTERS)
    taken = torch.from_numpy(labelled.copy())
    picks = []
    for block in torch.from_numpy(centres).split(256):
        # ||c - x||^2 = ||c||^2 - 2 c . x + 1 for unit x; ||c||^2 is the same along a row, so left out.
        distances = -2 * block @ features.T
        for row in distances:
            pick = int(row.masked_fill(taken, float("inf")).argmin())
            taken[pick] = True
            picks.append(pick)
    return np.asarray(picks, dtype=np.int64)


def nearest_distances(features: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's L2 distances to its ``k`` nearest other rows, nearest first.

    The nearest of a row's ``k + 1`` (itself, at distance 0) is dropped, as deep-al's ``get_nn`` drops it;
    ``||x - y||^2 = 2 - 2 x . y`` for unit rows, clamped at 0.

    Shape:
        features: (M, D) unit rows, M > k; returns: (M, k).
    """
    similarity, _ = exact_search(features, features, k + 1)  # (M, k + 1), most similar first
    return similarity[:, 1:].mul(-2).add_(2).clamp_(min=0).sqrt_()


def typicality(features: torch.Tensor) -> torch.Tensor:
    """TypiClust's typicality of each row among the rows given (see the module docstring).

    Shape:
        features: (M, D) unit rows; returns: (M,); with fewer than 2 rows, all ones.
    """
    k = min(NEIGHBOURS, len(features) // 2)
    if k == 0:
        return torch.ones(len(features))
    return 1 / (nearest_distances(features, k).mean(dim=1) + TYPICALITY_EPSILON)


def visiting_order(cluster_ids: np.ndarray, labelled: np.ndarray, min_size: int = MIN_CLUSTER_SIZE) -> np.ndarray:
    """Clusters of more than ``min_size`` images: fewest labelled first, then largest, then lowest id.

    Shape:
        cluster_ids: (N,) int64; labelled: (N,) bool; returns: (C',) cluster ids.
    """
    sizes = np.bincount(cluster_ids)
    labelled_counts = np.bincount(cluster_ids[labelled], minlength=len(sizes))
    kept = np.flatnonzero(sizes > min_size)
    return kept[np.lexsort((-sizes[kept], labelled_counts[kept]))]  # the last key sorts first; ties keep id order


def most_typical_per_cluster(
    features: torch.Tensor, cluster_ids: np.ndarray, budget: int, labelled: np.ndarray
) -> np.ndarray:
    """TypiClust's picks given the clusters: the clusters in :func:`visiting_order`, round and round, taking
    the most typical unlabelled image of each.

    Shape:
        features: (N, D) unit rows; cluster_ids: (N,); labelled: (N,) bool; returns: (budget,) row indices.
    """
    available = ~labelled
    picks: list[int] = []
    for min_size in (MIN_CLUSTER_SIZE, 0):  # the small clusters only once the others are used up
        order = visiting_order(cluster_ids, labelled, min_size)
        left = np.bincount(cluster_ids[available], minlength=cluster_ids.max() + 1)
        for cluster in itertools.cycle(order):
            if len(picks) == budget or not left[order].any():
                break
            if not left[cluster]:
                continue
            members = np.flatnonzero((cluster_ids == cluster) & available)
            pick = int(members[int(typicality(features[members]).argmax())])
            available[pick] = False
            left[cluster] -= 1
            picks.append(pick)
    return np.asarray(picks, dtype=np.int64)


def typiclust(features: torch.Tensor, budget: int, labelled: np.ndarray, seed: int) -> np.ndarray:
    """TypiClust: cluster into ``min(labelled + budget, 500)`` clusters, then :func:`most_typical_per_cluster`.

    Shape:
        features: (N, D) unit rows; labelled: (N,) bool; returns: (budget,) row indices.
    """
    clusters = min(int(labelled.sum()) + budget, MAX_CLUSTERS)
    cluster_ids, _ = kmeans(features, clusters, seed, minibatch_beyond=FULL_KMEANS_MAX_CLUSTERS)
    return most_typical_per_cluster(features, cluster_ids, budget, labelled)
