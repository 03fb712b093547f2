"""Search and clustering, each numeric once: L2 normalisation, the exact top-k against a naive full sort with
its tie order, faiss against the exact search, and the k-means backends."""

from __future__ import annotations

import pytest
import torch

from sslkit.evaluation.search import nearest_columns


@pytest.mark.parametrize("depth", [1, 5, 39, 40])
def test_neighbour_order_is_a_stable_sort_of_the_similarities(depth):
    # Few distinct values (ties inside the kept ones and across the cut), both zeros, -inf as a masked query.
    g = torch.Generator().manual_seed(depth)
    similarity = torch.randint(-2, 3, (64, 40), generator=g).float() / 2
    similarity[similarity == 0] = torch.tensor([0.0, -0.0])[torch.randint(0, 2, (int((similarity == 0).sum()),))]
    similarity[:, 3] = float("-inf")
    expected = similarity.sort(dim=1, descending=True, stable=True).indices[:, :depth]
    assert torch.equal(nearest_columns(similarity, depth), expected)
