"""Retrieval metrics: hand-computed values on points of a circle, a naive full-matrix reference
written from the definitions, pytorch-metric-learning's AccuracyCalculator as an oracle
(leave-one-out and with a gallery, exact ties, classes of one sample), chunk sizes, two real
processes, and invariants."""

import math

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes

from sslkit.evaluation import retrieval_metrics
from sslkit.evaluation.clustering import KMEANS_RESTARTS, kmeans


def on_circle(degrees):
    angles = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([angles.cos(), angles.sin()], dim=1)


def test_leave_one_out_by_hand():
    # Cosine order is angular distance. Neighbours (nearest first), relevant ones starred:
    #   0 deg, label 0:   12(1)  20(0)*  90(1)  100(1)           R=1: AP 0, R-Prec 0
    #  12 deg, label 1:   20(0)  0(0)    90(1)* 100(1)*          R=2: AP 0, R-Prec 0
    #  20 deg, label 0:   12(1)  0(0)*   90(1)  100(1)           R=1: AP 0, R-Prec 0
    #  90 deg, label 1:  100(1)* 20(0)   12(1)* 0(0)             R=2: AP (1/1) / 2 = 0.5, R-Prec 1/2
    # 100 deg, label 1:   90(1)* 20(0)   12(1)* 0(0)             R=2: AP 0.5, R-Prec 1/2
    features = on_circle([0, 12, 20, 90, 100])
    labels = torch.tensor([0, 1, 0, 1, 1])
    metrics = retrieval_metrics(features, labels, ks=(1, 2, 3, 4))
    assert metrics["recall@1"] == pytest.approx(2 / 5)
    assert metrics["recall@2"] == pytest.approx(4 / 5)  # all but the 12-degree query
    assert metrics["recall@3"] == pytest.approx(1.0)
    assert metrics["recall@4"] == pytest.approx(1.0)
    assert metrics["r_precision"] == pytest.approx((0 + 0 + 0 + 0.5 + 0.5) / 5)
    assert metrics["map@r"] == pytest.approx((0 + 0 + 0 + 0.5 + 0.5) / 5)


def test_gallery_by_hand_and_lone_queries_are_left_out():
    # Query at 0 deg, label 0; gallery 5(1) 10(0)* 50(0)*: R=2, AP = (P(2) = 1/2) / 2 = 0.25, R-Prec 1/2.
    # The query at 180 deg has label 7, absent from the gallery: it has nothing to find.
    queries = on_circle([0, 180])
    gallery = on_circle([5, 10, 50])
    metrics = retrieval_metrics(queries, torch.tensor([0, 7]), gallery, torch.tensor([1, 0, 0]), ks=(1, 2, 8))
    assert metrics["recall@1"] == 0.0
    assert metrics["recall@2"] == 1.0
    assert metrics["recall@8"] == 1.0  # K beyond the gallery: the whole gallery
    assert metrics["r_precision"] == pytest.approx(0.5)
    assert metrics["map@r"] == pytest.approx(0.25)


def test_exact_ties_go_to_the_lowest_gallery_index():
    # The query (label 0) is equally similar to gallery rows 0 (label 1) and 1 (label 0): row 0 ranks first.
    query, gallery = on_circle([0]), on_circle([30, -30, 90])
    metrics = retrieval_metrics(query, torch.tensor([0]), gallery, torch.tensor([1, 0, 1]), ks=(1, 2))
    assert (metrics["recall@1"], metrics["recall@2"], metrics["map@r"]) == (0.0, 1.0, 0.0)
    swapped = retrieval_metrics(query, torch.tensor([0]), gallery, torch.tensor([0, 1, 1]), ks=(1, 2))
    assert (swapped["recall@1"], swapped["map@r"]) == (1.0, 1.0)


def test_perfect_embedding_scores_one_everywhere():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(6).repeat_interleave(5)
    features = torch.eye(6)[labels] * 10 + 0.1 * torch.randn(30, 6, generator=g)
    metrics = retrieval_metrics(features, labels)
    expected = {"recall@1": 1.0, "recall@2": 1.0, "recall@4": 1.0, "recall@8": 1.0, "r_precision": 1.0}
    assert metrics == pytest.approx(expected | {"map@r": 1.0, "nmi": 1.0})


def clustered(n, d, num_classes, seed, noise=1.0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, d, generator=g)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    return centers[labels] + noise * torch.randn(n, d, generator=g), labels


def tied(n, d, num_classes, seed):
    """Features drawn from a few integer vectors: many exact duplicates and equal similarities,
    across classes too; labels with a few classes of one sample (lone queries in leave-one-out)."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randint(-1, 2, (n, d), generator=g).double()
    features[features.abs().sum(dim=1) == 0, 0] = 1.0  # no zero vector: its cosine is undefined
    labels = (features[:, 0] + 1 + 3 * torch.randint(0, num_classes // 3, (n,), generator=g)).long()
    labels[:3] = torch.tensor([100, 101, 102])
    return features, labels


def naive_metrics(queries, query_labels, gallery, gallery_labels, ks):
    """Loops over the full float64 similarity matrix, straight from the definitions: neighbours by
    decreasing cosine, ties by lower gallery index, a query never its own neighbour."""
    leave_one_out = gallery is None
    if leave_one_out:
        gallery, gallery_labels = queries, query_labels
    similarity = F.normalize(queries.double(), dim=1) @ F.normalize(gallery.double(), dim=1).T
    totals, scored = {f"recall@{k}": 0.0 for k in ks} | {"r_precision": 0.0, "map@r": 0.0}, 0
    for q in range(len(queries)):
        others = [j for j in range(len(gallery)) if not (leave_one_out and j == q)]
        ranking = sorted(others, key=lambda j: (-similarity[q, j].item(), j))
        rel = [int(gallery_labels[j] == query_labels[q]) for j in ranking]
        r = sum(rel)
        if r == 0:
            continue
        scored += 1
        for k in ks:
            totals[f"recall@{k}"] += float(any(rel[:k]))
        totals["r_precision"] += sum(rel[:r]) / r
        totals["map@r"] += sum(sum(rel[: i + 1]) / (i + 1) for i in range(r) if rel[i]) / r
    return {name: total / scored for name, total in totals.items()}


@pytest.mark.parametrize("data", ["clustered", "tied"])
@pytest.mark.parametrize("gallery", [False, True])
def test_matches_naive_loops(data, gallery):
    features, labels = clustered(90, 6, 5, seed=6) if data == "clustered" else tied(90, 4, 6, seed=6)
    ks = (1, 2, 5, 100)
    if gallery:
        args = (features[:30], labels[:30], features[30:], labels[30:])
    else:
        args = (features, labels, None, None)
    expected = naive_metrics(*args, ks)
    ours = retrieval_metrics(*args, ks=ks, chunk_size=7)
    for name, value in expected.items():
        assert ours[name] == pytest.approx(value, abs=1e-12), name


class IndexOrderKNN:
    """pytorch-metric-learning's default kNN (faiss' exact index) ranks equal distances by lower index;
    faiss is not a test dependency, so this does the same with a stable sort (CustomKNN's topk does not)."""

    def __call__(self, query, k, reference, ref_includes_query=False):
        from pytorch_metric_learning.utils.inference import return_results

        similarity = F.normalize(query, dim=1) @ F.normalize(reference, dim=1).T
        distances, indices = similarity.sort(dim=1, descending=True, stable=True)
        k += int(ref_includes_query)
        return return_results(distances[:, :k], indices[:, :k], ref_includes_query)


def pml_clusters(features: torch.Tensor, num_clusters: int, seed: int) -> torch.Tensor:
    """sslkit's NMI clustering, for pytorch-metric-learning's ``kmeans_func``."""
    clusters, _ = kmeans(F.normalize(features, dim=1).double(), num_clusters, seed, restarts=KMEANS_RESTARTS)
    return torch.from_numpy(clusters)


def pml_accuracy(query, query_labels, reference=None, reference_labels=None, knn="custom", seed=0):
    pml = pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    assert pml.__version__
    calculator = AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r", "NMI"),
        k="max_bin_count",
        device=torch.device("cpu"),
        knn_func=CustomKNN(CosineSimilarity()) if knn == "custom" else IndexOrderKNN(),
        # Its default k-means is faiss' (not installed): given sslkit's clustering, NMI must be equal.
        kmeans_func=lambda x, num_clusters: pml_clusters(x, num_clusters, seed),
    )
    return calculator.get_accuracy(query, query_labels, reference, reference_labels)


PML_NAMES = {"recall@1": "precision_at_1", "r_precision": "r_precision", "map@r": "mean_average_precision_at_r"}


def assert_agrees_with_pml(ours, expected):
    for name, pml_name in PML_NAMES.items():
        assert ours[name] == pytest.approx(expected[pml_name], abs=1e-9), name
    assert ours["nmi"] == pytest.approx(expected["NMI"], abs=1e-12)


@pytest.mark.parametrize("n,d,num_classes,seed", [(60, 8, 3, 0), (200, 16, 7, 1), (150, 4, 20, 2)])
def test_leave_one_out_matches_pytorch_metric_learning(n, d, num_classes, seed):
    features, labels = clustered(n, d, num_classes, seed)
    ours = retrieval_metrics(features, labels, chunk_size=37)
    assert_agrees_with_pml(ours, pml_accuracy(features, labels))
    assert 0.05 < ours["map@r"] < 0.95  # neither trivial nor hopeless: the comparison can fail


def test_random_features_with_a_gallery_match_pytorch_metric_learning():
    g = torch.Generator().manual_seed(3)
    features, labels = torch.randn(260, 12, generator=g), torch.randint(0, 8, (260,), generator=g)
    queries, query_labels = features[:60], labels[:60]
    gallery, gallery_labels = features[60:], labels[60:]
    ours = retrieval_metrics(queries, query_labels, gallery, gallery_labels, chunk_size=16)
    assert_agrees_with_pml(ours, pml_accuracy(queries, query_labels, gallery, gallery_labels))


@pytest.mark.parametrize("gallery", [False, True])
def test_exact_ties_and_classes_of_one_match_pytorch_metric_learning(gallery):
    features, labels = tied(240, 4, 9, seed=7)
    args = (features[:80], labels[:80], features[80:], labels[80:]) if gallery else (features, labels)
    ours = retrieval_metrics(*args, chunk_size=50)
    assert_agrees_with_pml(ours, pml_accuracy(*args, knn="index_order"))
    assert 0.05 < ours["map@r"] < 0.95


def test_nmi_with_another_kmeans_agrees_within_its_variation():
    # pytorch-metric-learning's faiss k-means is another clustering: here k-means from another seed, which
    # splits the overlapping classes a little differently (NMI 0.888 against 0.874).
    features, labels = clustered(400, 8, 5, seed=8, noise=0.8)
    ours = retrieval_metrics(features, labels)["nmi"]
    other = pml_accuracy(features, labels, seed=7)["NMI"]
    assert ours != other
    assert ours == pytest.approx(other, abs=0.03)


@pytest.mark.parametrize("data", ["clustered", "tied"])
def test_chunk_size_does_not_change_metrics(data):
    features, labels = clustered(120, 8, 5, seed=4) if data == "clustered" else tied(120, 4, 6, seed=4)
    base = retrieval_metrics(features, labels, ks=(1, 3, 10), chunk_size=120)
    for chunk_size in (1, 7, 64):
        # The neighbours are the same; only the order of the float64 sums changes.
        chunked = retrieval_metrics(features, labels, ks=(1, 3, 10), chunk_size=chunk_size)
        assert chunked == pytest.approx(base, abs=1e-12)


def test_query_order_does_not_change_metrics_without_ties():
    features, labels = clustered(120, 8, 5, seed=4)
    base = retrieval_metrics(features, labels, ks=(1, 3, 10))
    perm = torch.randperm(120, generator=torch.Generator().manual_seed(0))
    shuffled = retrieval_metrics(features[perm], labels[perm], ks=(1, 3, 10), chunk_size=7)
    for key in ("recall@1", "recall@3", "recall@10", "r_precision", "map@r"):
        assert shuffled[key] == pytest.approx(base[key], abs=1e-12)


def test_nmi_is_low_for_features_unrelated_to_labels_and_ignores_label_names():
    features, labels = clustered(300, 8, 4, seed=5, noise=0.05)
    renamed = torch.tensor([10, 30, 20, 40])[labels]  # labels need not be 0..C-1
    assert retrieval_metrics(features, renamed)["nmi"] == pytest.approx(1.0)
    shuffled_labels = labels[torch.randperm(300, generator=torch.Generator().manual_seed(1))]
    assert retrieval_metrics(features, shuffled_labels)["nmi"] < 0.1


def test_nmi_false_leaves_out_nmi_only():
    features, labels = clustered(80, 6, 4, seed=10)
    everything = retrieval_metrics(features, labels)
    without = retrieval_metrics(features, labels, nmi=False)
    assert without == {name: value for name, value in everything.items() if name != "nmi"}


def _two_process_metrics(rank, world):
    """Run by dist_utils.run_in_processes: the metrics of each case, and the error for unequal inputs."""
    features, labels = tied(101, 4, 6, seed=9)  # odd: the processes get 51 and 50 queries
    results = {
        "leave_one_out": retrieval_metrics(features, labels, chunk_size=16),
        "gallery": retrieval_metrics(features[:41], labels[:41], features[41:], labels[41:], chunk_size=16),
    }
    try:
        retrieval_metrics(features[rank:], labels[rank:])  # one process passes one query fewer
    except ValueError as error:
        results["unequal"] = str(error)
    return results


@pytest.mark.slow
def test_two_processes_give_the_one_process_metrics():
    by_rank = run_in_processes(_two_process_metrics)
    features, labels = tied(101, 4, 6, seed=9)
    expected = {
        "leave_one_out": retrieval_metrics(features, labels),
        "gallery": retrieval_metrics(features[:41], labels[:41], features[41:], labels[41:]),
    }
    for results in by_rank:
        for case, metrics in expected.items():
            assert results[case] == pytest.approx(metrics, abs=1e-12), case
        assert results["unequal"].startswith("query_features differ between processes (100 to 101 queries")


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"ks": ()}, "ks"),
        ({"ks": (0, 1)}, "ks"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"gallery_features": torch.randn(4, 3)}, "gallery_features and gallery_labels"),
        (
            {"gallery_features": torch.randn(4, 5), "gallery_labels": torch.zeros(4, dtype=torch.long)},
            "gallery_features",
        ),
        (
            {"gallery_features": torch.randn(4, 3), "gallery_labels": torch.zeros(3, dtype=torch.long)},
            "gallery_labels",
        ),
        ({"query_labels": torch.zeros(5, dtype=torch.long)}, "query_labels"),
        ({"query_features": torch.randn(1, 3), "query_labels": torch.zeros(1, dtype=torch.long)}, "leave-one-out"),
        ({"ks": 4}, "ks must be a list"),
        ({"query_labels": torch.tensor([0.0, 1, 2, 0, 1, 2])}, "query_labels must be integer"),
        (
            {"query_features": torch.tensor([[0.0, 1, 2]] * 5 + [[float("inf"), 0, 0]])},
            "query_features has NaN or inf",
        ),
        ({"query_features": torch.randn(6, 3).numpy()}, "torch.from_numpy"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, argument):
    arguments = {"query_features": torch.randn(6, 3), "query_labels": torch.tensor([0, 1, 2, 0, 1, 2])}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=argument):
        retrieval_metrics(**arguments)
