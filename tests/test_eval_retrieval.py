"""Retrieval metrics: hand-computed values on points of a circle, pytorch-metric-learning's
AccuracyCalculator as an oracle (leave-one-out and with a gallery), and invariants."""

import math

import pytest
import torch

from sslkit.evaluation import retrieval_metrics


def on_circle(degrees):
    angles = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([angles.cos(), angles.sin()], dim=1)


def test_leave_one_out_by_hand():
    # Cosine order is angular distance. Neighbours (nearest first), relevant ones starred:
    #   0 deg, label 0:   12(1)  20(0)*  90(1)  100(1)           R=1: AP 0
    #  12 deg, label 1:   20(0)  0(0)    90(1)* 100(1)*          R=2: AP 0
    #  20 deg, label 0:   12(1)  0(0)*   90(1)  100(1)           R=1: AP 0
    #  90 deg, label 1:  100(1)* 20(0)   12(1)* 0(0)             R=2: AP (1/1) / 2 = 0.5
    # 100 deg, label 1:   90(1)* 20(0)   12(1)* 0(0)             R=2: AP 0.5
    features = on_circle([0, 12, 20, 90, 100])
    labels = torch.tensor([0, 1, 0, 1, 1])
    metrics = retrieval_metrics(features, labels, ks=(1, 2, 3, 4))
    assert metrics["recall@1"] == pytest.approx(2 / 5)
    assert metrics["recall@2"] == pytest.approx(4 / 5)  # all but the 12-degree query
    assert metrics["recall@3"] == pytest.approx(1.0)
    assert metrics["recall@4"] == pytest.approx(1.0)
    assert metrics["map@r"] == pytest.approx((0 + 0 + 0 + 0.5 + 0.5) / 5)


def test_gallery_by_hand_and_lone_queries_are_left_out():
    # Query at 0 deg, label 0; gallery 5(1) 10(0)* 50(0)*: R=2, AP = (P(2) = 1/2) / 2 = 0.25.
    # The query at 180 deg has label 7, absent from the gallery: it has nothing to find.
    queries = on_circle([0, 180])
    gallery = on_circle([5, 10, 50])
    metrics = retrieval_metrics(queries, torch.tensor([0, 7]), gallery, torch.tensor([1, 0, 0]), ks=(1, 2, 8))
    assert metrics["recall@1"] == 0.0
    assert metrics["recall@2"] == 1.0
    assert metrics["recall@8"] == 1.0  # K beyond the gallery: the whole gallery
    assert metrics["map@r"] == pytest.approx(0.25)


def test_perfect_embedding_scores_one_everywhere():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(6).repeat_interleave(5)
    features = torch.eye(6)[labels] * 10 + 0.1 * torch.randn(30, 6, generator=g)
    metrics = retrieval_metrics(features, labels)
    assert metrics == pytest.approx(
        {"recall@1": 1.0, "recall@2": 1.0, "recall@4": 1.0, "recall@8": 1.0, "map@r": 1.0, "nmi": 1.0}
    )


def clustered(n, d, num_classes, seed, noise=1.0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, d, generator=g)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    return centers[labels] + noise * torch.randn(n, d, generator=g), labels


def pml_accuracy(query, query_labels, reference=None, reference_labels=None):
    pml = pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    assert pml.__version__
    calculator = AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r"),
        k="max_bin_count",
        knn_func=CustomKNN(CosineSimilarity()),
    )
    return calculator.get_accuracy(query, query_labels, reference, reference_labels)


@pytest.mark.parametrize("n,d,num_classes,seed", [(60, 8, 3, 0), (200, 16, 7, 1), (150, 4, 20, 2)])
def test_leave_one_out_matches_pytorch_metric_learning(n, d, num_classes, seed):
    features, labels = clustered(n, d, num_classes, seed)
    expected = pml_accuracy(features, labels)
    ours = retrieval_metrics(features, labels, chunk_size=37)
    # PML's precision_at_1 is "the nearest neighbour is relevant", which is Recall@1.
    assert ours["recall@1"] == pytest.approx(expected["precision_at_1"], abs=1e-9)
    assert ours["map@r"] == pytest.approx(expected["mean_average_precision_at_r"], abs=1e-9)
    assert 0.05 < ours["map@r"] < 0.95  # neither trivial nor hopeless: the comparison can fail


def test_gallery_matches_pytorch_metric_learning():
    features, labels = clustered(260, 12, 8, seed=3, noise=1.2)
    queries, query_labels = features[:60], labels[:60]
    gallery, gallery_labels = features[60:], labels[60:]
    expected = pml_accuracy(queries, query_labels, gallery, gallery_labels)
    ours = retrieval_metrics(queries, query_labels, gallery, gallery_labels, chunk_size=16)
    assert ours["recall@1"] == pytest.approx(expected["precision_at_1"], abs=1e-9)
    assert ours["map@r"] == pytest.approx(expected["mean_average_precision_at_r"], abs=1e-9)


def test_chunk_size_and_order_do_not_change_metrics():
    features, labels = clustered(120, 8, 5, seed=4)
    base = retrieval_metrics(features, labels, ks=(1, 3, 10))
    perm = torch.randperm(120, generator=torch.Generator().manual_seed(0))
    for chunk_size in (1, 7, 120):
        shuffled = retrieval_metrics(features[perm], labels[perm], ks=(1, 3, 10), chunk_size=chunk_size)
        for key in ("recall@1", "recall@3", "recall@10", "map@r"):
            assert shuffled[key] == pytest.approx(base[key], abs=1e-12)


def test_nmi_is_low_for_features_unrelated_to_labels_and_ignores_label_names():
    features, labels = clustered(300, 8, 4, seed=5, noise=0.05)
    renamed = torch.tensor([10, 30, 20, 40])[labels]  # labels need not be 0..C-1
    assert retrieval_metrics(features, renamed)["nmi"] == pytest.approx(1.0)
    shuffled_labels = labels[torch.randperm(300, generator=torch.Generator().manual_seed(1))]
    assert retrieval_metrics(features, shuffled_labels)["nmi"] < 0.1


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
