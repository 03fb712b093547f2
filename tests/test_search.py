"""Search and clustering, each numeric once: L2 normalisation, the blockwise similarities, the exact top-k against a
naive full sort with its tie order (in every block, tile and chunk layout), faiss against the exact search, and the
k-means backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.metrics import normalized_mutual_info_score

from sslkit.evaluation import clustering, search, top_k
from sslkit.evaluation.search import exact_search, unit_rows, unit_vectors
from sslkit.evaluation.top_k import nearest_columns


def tied_vectors(n: int = 700, dim: int = 8, seed: int = 0) -> np.ndarray:
    """Vectors of four entries +-1 (norm 2): every cosine similarity a multiple of 1/4, exact in float32 however it
    is summed, so most of them tie; row 10 is a copy of row 3, row 20 twice it, rows 600 on copies of rows 0 on."""
    rng = np.random.default_rng(seed)
    vectors = np.zeros((n, dim), dtype=np.float32)
    for row in vectors:
        row[rng.permutation(dim)[:4]] = rng.choice([-1.0, 1.0], 4)
    vectors[10], vectors[20] = vectors[3], 2 * vectors[3]
    vectors[600:] = vectors[: n - 600]
    return vectors


def naive_search(queries: np.ndarray, references: np.ndarray, k: int, own_columns=None):
    """Every similarity at once, sorted stably (equal values by lowest column), the query's own column removed."""
    similarity = unit_rows(queries) @ unit_rows(references).T
    if own_columns is not None:
        similarity[torch.arange(len(similarity)), own_columns] = float("-inf")
    ranked = similarity.sort(dim=1, descending=True, stable=True)
    return ranked.values[:, :k], ranked.indices[:, :k]


def clustered(n: int, dim: int, clusters: int, seed: int = 0) -> np.ndarray:
    """Gaussian clusters on the sphere: points a noise of norm about 0.7 away from their unit centre."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    points = centres[rng.integers(0, clusters, n)] + 0.7 * rng.standard_normal((n, dim)) / np.sqrt(dim)
    return points.astype(np.float32)


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    return unit_rows(load_digits().data)


# --------------------------------------------------------------------------- L2 normalisation


def test_rows_are_scaled_to_length_one_and_a_zero_row_stays_zero():
    rows = torch.tensor([[3.0, 4.0], [0.0, 0.0], [-1e-3, 0.0]], dtype=torch.float64)
    unit = unit_rows(rows)
    assert unit.dtype == torch.float32
    assert torch.equal(unit, torch.tensor([[0.6, 0.8], [0.0, 0.0], [-1.0, 0.0]]))


def test_a_float16_memory_map_is_read_once_a_block_at_a_time_as_its_values(tmp_path, monkeypatch):
    vectors = clustered(1000, 16, 10).astype(np.float16)
    np.save(tmp_path / "v.npy", vectors)
    on_disk = np.load(tmp_path / "v.npy", mmap_mode="r")
    monkeypatch.setattr(search, "SIMILARITY_BLOCK_BYTES", 4 * 300)  # blocks of 300 rows
    read = []
    unit = unit_vectors(on_disk, on_rows=read.append)
    assert read == [300, 300, 300, 100]
    expected = F.normalize(torch.from_numpy(vectors.astype(np.float32)), dim=1)
    assert torch.equal(unit, expected) and unit.dtype == torch.float32
    assert torch.equal(unit_rows(on_disk[:7]), expected[:7])


# --------------------------------------------------------------------------- blockwise similarities


def test_similarity_and_distance_blocks_are_the_full_matrix_in_one_buffer(digits):
    queries, references = digits[:250], digits[100:900]
    full = queries @ references.T
    buffers, seen = set(), 0
    own = torch.arange(250) + 3
    for start, stop, block in search.cosine_blocks(queries, references, 64, own):
        expected = full[start:stop].clone()
        expected[torch.arange(stop - start), own[start:stop]] = float("-inf")
        assert torch.equal(block, expected)
        buffers.add(block.data_ptr())
        seen += stop - start
    assert seen == 250 and len(buffers) == 1
    for start, stop, block in search.squared_distance_blocks(queries, references, 64):
        torch.testing.assert_close(block, (2 - 2 * full[start:stop]).clamp(min=0), rtol=0, atol=1e-6)
        assert block.min() >= 0


# --------------------------------------------------------------------------- exact top-k


@pytest.mark.parametrize("depth", [1, 5, 39, 40])
def test_neighbour_order_is_a_stable_sort_of_the_similarities(depth):
    # Few distinct values (ties inside the kept ones and across the cut), both zeros, -inf as a masked query.
    g = torch.Generator().manual_seed(depth)
    similarity = torch.randint(-2, 3, (64, 40), generator=g).float() / 2
    similarity[similarity == 0] = torch.tensor([0.0, -0.0])[torch.randint(0, 2, (int((similarity == 0).sum()),))]
    similarity[:, 3] = float("-inf")
    expected = similarity.sort(dim=1, descending=True, stable=True).indices[:, :depth]
    assert torch.equal(nearest_columns(similarity, depth), expected)


@pytest.mark.parametrize("depth", [1, 3, 20, 300])
def test_wide_rows_are_ranked_through_their_chunk_maxima_with_ties_across_every_cut(depth):
    g = torch.Generator().manual_seed(depth)
    similarity = torch.randint(0, 40, (50, 2003), generator=g).float() / 8  # each value about 50 times a row
    similarity[:5] = 1.0  # rows of one value: every chunk ties
    assert (top_k.chunks_for(2003, depth, None) is None) == (depth == 300)
    expected = similarity.sort(dim=1, descending=True, stable=True).indices[:, :depth]
    assert torch.equal(nearest_columns(similarity, depth), expected)


@pytest.mark.parametrize("group", [2, 5, 32])
def test_the_largest_values_through_group_maxima_are_topks_even_with_ties_at_every_cut(group, monkeypatch):
    monkeypatch.setattr(top_k, "GROUP", group)
    g = torch.Generator().manual_seed(group)
    for width, count in ((1, 1), (40, 3), (999, 11), (5000, 2), (5000, 40)):
        values = torch.randint(0, 30, (20, width), generator=g).float()  # many equal values in every row
        values[::3, -1] = 30  # the largest in the last column, which may be in no group
        top, columns = top_k.largest(values, count)
        assert torch.equal(top, values.topk(min(count, width), dim=1).values)
        assert torch.equal(values.gather(1, columns), top)


# Blocks of rows, of columns (through the bytes of a block), tiles and chunks that cut the 700 references unevenly.
LAYOUTS = {
    "defaults": {},
    "small tiles": {"block_rows": 64, "TILE_COLUMNS": 96, "CHUNK": 8, "GROUP": 2},
    "blocks of columns": {"block_rows": 50, "SIMILARITY_BLOCK_BYTES": 4 * 50 * 230, "TILE_COLUMNS": 64},
    "one row at a time": {"block_rows": 1, "TILE_COLUMNS": 128, "CHUNK": 4, "GROUP": 3},
    "one product per block, as on a GPU": {"block_rows": 100, "TILE_COLUMNS": None, "GROUP": 2},
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("k", [1, 5, 40])
def test_exact_search_is_the_stable_sort_of_every_similarity(layout, k, monkeypatch):
    settings = dict(LAYOUTS[layout])
    block_rows = settings.pop("block_rows", None)
    for name, value in settings.items():
        monkeypatch.setattr(top_k if name in ("CHUNK", "GROUP") else search, name, value)
    vectors = tied_vectors()
    references = unit_rows(vectors)
    for own_columns in (None, torch.arange(len(vectors))):
        similarities, columns = exact_search(vectors, references, k, own_columns, block_rows)
        expected_similarities, expected_columns = naive_search(vectors, vectors, k, own_columns)
        assert torch.equal(columns, expected_columns) and torch.equal(similarities, expected_similarities)
        assert columns.dtype == torch.int64 and similarities.dtype == torch.float32


def test_blocks_searched_on_several_threads_give_the_same_lists_and_torch_gets_its_threads_back():
    vectors = tied_vectors()
    expected = naive_search(vectors, vectors, 7, torch.arange(700))
    done = []
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        found = exact_search(vectors, unit_rows(vectors), 7, torch.arange(700), block_rows=64, on_rows=done.append)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert torch.equal(found[1], expected[1]) and torch.equal(found[0], expected[0])
    assert done == [64] * 10 + [60]  # every block, in order


def test_exact_search_of_untied_vectors_is_the_float64_ranking():
    vectors, queries = clustered(3000, 16, 20, seed=0), clustered(300, 16, 20, seed=1)
    similarities, columns = exact_search(queries, unit_rows(vectors), 20)
    float64 = (
        F.normalize(torch.from_numpy(queries).double(), dim=1)
        @ F.normalize(torch.from_numpy(vectors).double(), dim=1).T
    )
    expected = float64.sort(dim=1, descending=True)
    assert torch.equal(columns, expected.indices[:, :20])
    torch.testing.assert_close(similarities.double(), expected.values[:, :20], rtol=0, atol=1e-6)


def test_an_item_is_not_its_own_neighbour_but_its_exact_copy_is_and_progress_counts_every_row():
    vectors = tied_vectors()
    done = []
    _, columns = exact_search(vectors, unit_rows(vectors), 5, torch.arange(700), block_rows=300, on_rows=done.append)
    assert not (columns == torch.arange(700)[:, None]).any() and done == [300, 300, 100]
    assert columns[3, :2].tolist() == [10, 20] and columns[10, :2].tolist() == [3, 20]  # equal: lower row first


def test_k_outside_the_references_is_refused():
    with pytest.raises(ValueError, match="k must be between 1 and the 3 references, got 4"):
        exact_search(np.eye(3, dtype=np.float32), torch.eye(3), 4)


# --------------------------------------------------------------------------- faiss


def test_faiss_exact_index_finds_the_exact_search_and_drops_each_query_itself():
    faiss = pytest.importorskip("faiss", reason="faiss is optional: pip install faiss-cpu")
    references = unit_rows(clustered(4000, 32, 40))
    index = faiss.IndexFlatIP(32)
    index.add(references.numpy())
    rows = np.arange(0, 4000, 7)
    similarities, indices = search.faiss_search(index, references[rows], 10, rows)
    exact_similarities, exact_columns = exact_search(references[rows], references, 10, torch.from_numpy(rows))
    assert (indices == exact_columns.numpy()).mean() > 0.999  # up to rounding, the same neighbours in order
    np.testing.assert_allclose(similarities, exact_similarities.numpy(), atol=1e-5)


@pytest.mark.parametrize("faiss_type", ["ivf", "hnsw"])
def test_faiss_indexes_find_most_of_the_exact_neighbours(faiss_type):
    pytest.importorskip("faiss", reason="faiss is optional: pip install faiss-cpu")
    references = unit_rows(clustered(4000, 32, 40))
    index = search.build_faiss_index(references.numpy(), faiss_type, nprobe=None, ef_search=64, seed=0)
    _, indices = search.faiss_search(index, references[:500], 10, np.arange(500))
    _, exact = exact_search(references[:500], references, 10, torch.arange(500))
    found = np.mean([len(np.intersect1d(a, b)) for a, b in zip(indices, exact.numpy())]) / 10
    assert found > 0.9 and not (indices == np.arange(500)[:, None]).any()


# --------------------------------------------------------------------------- k-means


def test_scikit_learn_kmeans_clusters_the_digits_and_follows_its_seed(digits):
    labels = load_digits().target
    for restarts, minibatch_beyond in ((clustering.KMEANS_RESTARTS, None), ("auto", 5)):
        ids, centres = clustering.kmeans(digits, 10, seed=0, restarts=restarts, minibatch_beyond=minibatch_beyond)
        assert ids.dtype == np.int64 and centres.shape == (10, 64) and set(ids.tolist()) == set(range(10))
        assert normalized_mutual_info_score(labels, ids) > 0.6
        assert np.array_equal(ids, clustering.kmeans(digits, 10, 0, restarts, minibatch_beyond)[0])
    assert not np.array_equal(ids, clustering.kmeans(digits, 10, 1, restarts, minibatch_beyond)[0])


def cohesion(vectors: torch.Tensor, clusters: torch.Tensor) -> float:
    """Mean cosine similarity of the items to their cluster's normalised mean: the spherical k-means objective."""
    centroids = F.normalize(torch.zeros(int(clusters.max()) + 1, vectors.shape[1]).index_add_(0, clusters, vectors))
    return float((vectors * centroids[clusters]).sum(dim=1).mean())


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_spherical_kmeans_clusters_the_digits_assigns_each_to_its_nearest_centroid_and_follows_its_seed(
    backend, digits
):
    if backend == "faiss":
        pytest.importorskip("faiss", reason="faiss is optional: pip install faiss-cpu")
    clusters, similarity, ran = clustering.spherical_kmeans(digits, 10, seed=0, backend=backend)
    assert ran == backend and clusters.dtype == torch.int64 and len(clusters.unique()) == 10
    centroids = F.normalize(torch.zeros(10, 64).index_add_(0, clusters, digits), dim=1)
    assert normalized_mutual_info_score(load_digits().target, clusters.numpy()) > 0.6
    assert cohesion(digits, clusters) > cohesion(digits, torch.from_numpy(load_digits().target)) - 0.02
    learned = clustering.spherical_kmeans(digits, 10, seed=0, backend=backend)
    assert torch.equal(learned[0], clusters) and torch.equal(learned[1], similarity)
    assert not torch.equal(clustering.spherical_kmeans(digits, 10, seed=1, backend=backend)[0], clusters)
    # Each item's centroid is its most similar one, and the similarity is theirs (centroids of the items' means
    # move a little from those k-means learned from its sample, so a few items may sit nearer another).
    nearest = (digits @ centroids.T).argmax(dim=1)
    assert (nearest == clusters).float().mean() > 0.95 and similarity.max() <= 1.0 + 1e-6


def test_assign_takes_the_most_similar_centroid_and_the_lower_one_on_a_tie():
    centroids = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), dim=1)
    clusters, similarity = clustering.assign(
        F.normalize(torch.tensor([[1.0, 1.0], [0.9, 0.1], [0.1, 0.9]]), dim=1), centroids
    )
    assert clusters.tolist() == [0, 0, 1] and similarity[1] == pytest.approx(0.9 / np.hypot(0.9, 0.1))
