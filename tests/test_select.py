"""The selection strategies against small naive versions written from their papers and official code, on
clustered synthetic data; the budget and the labelled set; bad requests."""

from __future__ import annotations

import numpy as np
import pytest

from sslkit.errors import UserError
from sslkit.evaluation.clustering import kmeans
from sslkit.evaluation.search import unit_vectors
from sslkit.selection import STRATEGIES, choose, select
from sslkit.selection.clusters import most_typical_per_cluster, typicality, visiting_order
from sslkit.selection.probcover import DELTA_GRID, choose_delta, greedy_cover, radius_graph


def blobs(sizes: list[int], dim: int = 12, spread: float = 0.35, seed: int = 0) -> np.ndarray:
    """Gaussian clusters of ``sizes[i]`` points around random directions, float32, rows shuffled."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(sizes), dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    points = np.concatenate([c + spread * rng.normal(size=(n, dim)) / np.sqrt(dim) for c, n in zip(centres, sizes)])
    return points[rng.permutation(len(points))].astype(np.float32)


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors.astype(np.float64) / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)


def pairwise(features: np.ndarray) -> np.ndarray:
    """Exact Euclidean distances, float64."""
    return np.sqrt(((features[:, None, :] - features[None, :, :]) ** 2).sum(-1))


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return blobs([90, 70, 60, 50, 40, 30, 4, 3])  # two clusters of at most 5


# --------------------------------------------------------------------------- TypiClust


def naive_typiclust(vectors, cluster_ids, budget, labelled):
    """deep-al's TypiClust.select_samples, written out: a fixed cluster order, the most typical unlabelled image."""
    features = unit(vectors)
    ids = cluster_ids.copy()
    clusters, sizes = np.unique(ids, return_counts=True)
    existing = np.bincount(ids[labelled], minlength=len(clusters))
    rows = sorted((existing[c], -sizes[c], c) for c in clusters if sizes[c] > 5)  # fewest labelled, then largest
    order = [c for _, _, c in rows]
    ids[labelled] = -1
    picks = []
    for i in range(budget):
        members = np.flatnonzero(ids == order[i % len(order)])
        k = min(20, len(members) // 2)
        distances = np.sort(pairwise(features[members]), axis=1)[:, 1 : k + 1]  # drop itself
        typicality = 1 / (distances.mean(axis=1) + 1e-5)
        pick = members[np.argmax(typicality)]
        picks.append(pick)
        ids[pick] = -1
    return np.asarray(picks)


def test_typiclust_matches_the_naive_version_on_its_own_clusters(data):
    for labelled, budget in ((np.empty(0, np.int64), 6), (np.arange(0, 40, 3), 10)):
        picks = select(data, budget, "typiclust", labelled=labelled, seed=0)
        cluster_ids, _ = kmeans(unit_vectors(data), len(labelled) + budget, seed=0)
        assert picks.tolist() == naive_typiclust(data, cluster_ids, budget, labelled).tolist()


def test_typiclust_visits_clusters_by_fewest_labelled_then_largest_and_never_the_small_ones():
    ids = np.repeat(np.arange(5), [10, 30, 20, 5, 30])  # cluster 3 has 5 images: never visited
    labelled = np.zeros(len(ids), dtype=bool)
    labelled[np.flatnonzero(ids == 1)[:2]] = True  # cluster 1: two labelled
    labelled[np.flatnonzero(ids == 0)[:1]] = True  # cluster 0: one
    assert visiting_order(ids, labelled).tolist() == [4, 2, 0, 1]
    features = unit_vectors(np.random.default_rng(0).normal(size=(len(ids), 4)).astype(np.float32))
    picks = most_typical_per_cluster(features, ids, 6, labelled)
    assert ids[picks].tolist() == [4, 2, 0, 1, 4, 2]  # round and round the same order
    assert not labelled[picks].any() and len(set(picks.tolist())) == 6


@pytest.mark.parametrize("members", [9, 50])
def test_typicality_is_the_inverse_mean_l2_distance_to_the_nearest_half_or_20(members):
    vectors = np.random.default_rng(members).normal(size=(members, 6)).astype(np.float32)
    k = min(20, members // 2)
    nearest = np.sort(pairwise(unit(vectors)), axis=1)[:, 1 : k + 1]
    expected = 1 / (nearest.mean(axis=1) + 1e-5)
    assert np.allclose(typicality(unit_vectors(vectors)).numpy(), expected, rtol=1e-4)


def test_typicality_picks_the_densest_image_of_a_cluster():
    rng = np.random.default_rng(1)
    tight = rng.normal(scale=0.01, size=(15, 3)) + [1, 0, 0]
    loose = rng.normal(scale=0.3, size=(15, 3)) + [1, 0, 0]
    vectors = np.concatenate([loose, tight]).astype(np.float32)
    picks = most_typical_per_cluster(unit_vectors(vectors), np.zeros(30, np.int64), 1, np.zeros(30, dtype=bool))
    assert picks[0] >= 15  # one of the tight group


def test_typiclust_takes_the_small_clusters_only_once_the_others_are_used_up():
    ids = np.repeat([0, 1], [6, 3])
    features = unit_vectors(np.random.default_rng(0).normal(size=(9, 4)).astype(np.float32))
    picks = most_typical_per_cluster(features, ids, 8, np.zeros(9, dtype=bool))
    assert ids[picks].tolist() == [0] * 6 + [1, 1] and len(set(picks.tolist())) == 8


# --------------------------------------------------------------------------- k-means


def test_kmeans_takes_the_image_nearest_each_centre(data):
    budget = 8
    _, centres = kmeans(unit_vectors(data), budget, seed=3)
    distances = np.sqrt(((unit(data)[None] - centres[:, None].astype(np.float64)) ** 2).sum(-1))
    taken, expected = set(), []
    for row in distances:  # each centre in turn, the nearest image not taken
        pick = next(int(i) for i in np.argsort(row) if int(i) not in taken)
        taken.add(pick)
        expected.append(pick)
    assert select(data, budget, "kmeans", seed=3).tolist() == expected


# --------------------------------------------------------------------------- ProbCover


def naive_cover(vectors, delta, budget, labelled):
    """Greedy cover on the dense graph: edges x -> y when ||x - y|| < delta, labelled balls covered first."""
    edges = pairwise(unit(vectors)) < delta
    covered = edges[labelled].any(axis=0)
    picks = []
    for _ in range(budget):
        degrees = (edges & ~covered[None, :]).sum(axis=1)
        pick = int(np.argmax(degrees))
        picks.append(pick)
        covered |= edges[pick]
    return picks, covered.mean()


def naive_delta(vectors, pseudo_labels):
    """The largest grid delta before the first whose purity (share of pure delta-balls) is below 0.95."""
    distances = pairwise(unit(vectors))
    chosen = DELTA_GRID[0]
    for delta in DELTA_GRID:
        balls = distances < delta
        pure = np.array([(pseudo_labels[ball] == pseudo_labels[i]).all() for i, ball in enumerate(balls)])
        if pure.mean() < 0.95:
            break
        chosen = delta
    return float(chosen)


def test_probcover_greedy_cover_matches_the_dense_version(data):
    for labelled in (np.empty(0, np.int64), np.arange(0, 30, 2)):
        mask = np.zeros(len(data), dtype=bool)
        mask[labelled] = True
        picks, random_picks, covered = greedy_cover(radius_graph(unit_vectors(data), 0.3), 8, mask, seed=0)
        expected, expected_covered = naive_cover(data, 0.3, 8, labelled)
        assert random_picks == 0 and picks.tolist() == expected
        assert covered == pytest.approx(expected_covered)


def test_probcover_chooses_delta_by_purity_as_the_dense_version(data):
    features = unit_vectors(data)
    delta, purity = choose_delta(features, classes=6, seed=0)
    pseudo_labels, _ = kmeans(features, 6, seed=0)
    assert delta == naive_delta(data, pseudo_labels) and purity >= 0.95
    assert 0.05 < delta < 2  # somewhere inside the grid, not at an end
    cover = choose(data, 5, "probcover", seed=0, classes=6)
    assert cover.details["delta"] == delta and cover.rows.tolist() == naive_cover(data, delta, 5, [])[0]


def test_probcover_draws_the_rest_at_random_once_everything_is_covered():
    data = blobs([20, 20], spread=0.05)
    cover = choose(data, 6, "probcover", seed=0, delta=0.5)
    assert cover.details["covered"] == 1.0 and cover.details["random_picks"] == 4
    assert len(set(cover.rows.tolist())) == 6


def test_the_radius_graph_is_refused_past_its_edge_bound(data):
    with pytest.raises(UserError, match="give a smaller --delta"):
        radius_graph(unit_vectors(data), 1.9, max_edges=1000)


# --------------------------------------------------------------------------- k-center


def naive_kcenter(vectors, budget, labelled):
    """Sener & Savarese's Algorithm 1: the image farthest from the labelled set, added, again."""
    distances = pairwise(unit(vectors))
    chosen = list(labelled)
    picks = []
    for _ in range(budget):
        nearest = distances[:, chosen].min(axis=1)
        nearest[chosen] = -1
        pick = int(np.argmax(nearest))
        picks.append(pick)
        chosen.append(pick)
    return picks


def test_kcenter_is_the_farthest_first_traversal(data):
    labelled = [5, 17, 101]
    assert select(data, 12, "kcenter", labelled=labelled).tolist() == naive_kcenter(data, 12, labelled)
    first = select(data, 12, "kcenter", seed=4)  # no labels: a random start, then farthest-first
    assert first[1:].tolist() == naive_kcenter(data, 11, [int(first[0])])


# --------------------------------------------------------------------------- every strategy


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_picks_budget_new_images_the_same_for_the_same_seed(data, strategy):
    labelled = np.arange(0, len(data), 7)
    options = {"classes": 6} if strategy == "probcover" else {}
    picks = select(data, 9, strategy, labelled=labelled, seed=2, **options)
    assert len(picks) == 9 and len(set(picks.tolist())) == 9 and picks.dtype == np.int64
    assert not np.isin(picks, labelled).any()
    again = select(data.astype(np.float16), 9, strategy, labelled=labelled, seed=2, **options)
    assert picks.tolist() == again.tolist()


def test_random_follows_its_seed(data):
    assert select(data, 10, "random", seed=1).tolist() != select(data, 10, "random", seed=2).tolist()
    assert select(data, 10, "random", seed=1).tolist() == select(data, 10, "random", seed=1).tolist()


def test_the_labelled_images_steer_the_choice(data):
    """A cluster that holds labels already is where TypiClust goes last and k-center goes away from."""
    cluster_ids, _ = kmeans(unit_vectors(data), 3, seed=0)
    labelled = np.flatnonzero(cluster_ids == 0)[:2]
    picks = select(data, 2, "typiclust", labelled=labelled, seed=0)
    assert len(picks) == 2 and not np.isin(picks, labelled).any()
    far = select(data, 1, "kcenter", labelled=labelled)
    to_labelled = pairwise(unit(data))[:, labelled].min(axis=1)
    assert to_labelled[far[0]] == pytest.approx(to_labelled.max())


@pytest.mark.parametrize(
    "budget, strategy, labelled, words",
    [
        (0, "kmeans", None, "a budget of 0 labels: give 1 to 347"),
        (348, "kmeans", None, "a budget of 348 labels: give 1 to 347"),
        (346, "random", [0, 1], "give 1 to 345, the images not labelled yet (347 in the embeddings, 2 labelled)"),
        (5, "coreset", None, "strategy 'coreset'; choose one of random, kmeans, typiclust, probcover, kcenter"),
        (5, "kcenter", [400], "labelled row 400 is not among the 347 rows"),
        (5, "probcover", None, "give --classes K"),
    ],
)
def test_bad_requests_are_one_line(data, budget, strategy, labelled, words):
    with pytest.raises(UserError) as error:
        select(data, budget, strategy, labelled=labelled)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_features_are_compared_normalised():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(60, 5)).astype(np.float32)
    scaled = vectors * rng.uniform(0.5, 20, size=(60, 1)).astype(np.float32)  # lengths change, directions do not
    for strategy in ("kcenter", "typiclust"):
        assert select(vectors, 5, strategy).tolist() == select(scaled, 5, strategy).tolist()
