"""Greedy k-center (Coreset): label the image farthest from every labelled one, again and again.

Sener & Savarese, "Active Learning for Convolutional Neural Networks: A Core-Set Approach", ICLR 2018
(https://arxiv.org/abs/1708.00489), Algorithm 1: with ``s`` the labelled set,

    u = argmax_{i not in s} min_{j in s} ||x_i - x_j||,   s <- s + {u},   until |s| = |s0| + budget,

the farthest-first traversal, a 2-approximation of the minimax facility location (k-center).
Distances are between L2-normalised features, as for every strategy here (the paper measures them
between a supervised network's raw activations). Ties go to the lowest row, as ``argmax`` breaks them in
the deep-al code's ``greedy_k_center`` (``deep-al/pycls/al/Sampling.py``). Algorithm 1 needs a
labelled image to start from; without one, the first image is drawn at random (seeded), as Google's
active-learning ``kcenter_greedy`` does.
"""

from __future__ import annotations

import numpy as np
import torch

from sslkit.evaluation.search import squared_distance_blocks, squared_distances


def nearest_labelled_distances(features: torch.Tensor, labelled: np.ndarray) -> torch.Tensor:
    """Each row's squared distance to its nearest labelled row (infinite when none is labelled).

    Shape:
        features: (N, D) unit rows; labelled: (N,) bool; returns: (N,).
    """
    nearest = torch.full((len(features),), float("inf"))
    for _, _, distances in squared_distance_blocks(features[torch.from_numpy(labelled)], features):
        nearest = torch.minimum(nearest, distances.min(dim=0).values)
    return nearest


def kcenter_greedy(features: torch.Tensor, budget: int, labelled: np.ndarray, seed: int) -> np.ndarray:
    """The farthest-first traversal from the labelled rows (see the module docstring).

    Squared distances order the images as distances do, so the square root is never taken.

    Shape:
        features: (N, D) unit rows; labelled: (N,) bool; returns: (budget,) row indices.
    """
    nearest = nearest_labelled_distances(features, labelled)
    chosen = torch.from_numpy(labelled.copy())
    picks = []
    for _ in range(budget):
        if picks or labelled.any():
            pick = int(nearest.masked_fill(chosen, -1).argmax())
        else:
            pick = int(np.random.default_rng(seed).integers(len(features)))
        picks.append(pick)
        chosen[pick] = True
        nearest = torch.minimum(nearest, squared_distances(features[pick : pick + 1], features)[0])
    return np.asarray(picks, dtype=np.int64)
