"""Weighted kNN: against a loop written from InstDisc's vote, against scikit-learn's
KNeighborsClassifier with the same weights, and the invariants that catch real bugs
(chunking, k beyond the train set, tiny temperatures)."""

import math

import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier

from sslkit.evaluation import knn_accuracy, weighted_knn_predict


def knn_reference(train, train_labels, test, num_classes, k, temperature):
    """InstDisc section 3.4 as loops, float64: votes w_c = sum over the k nearest of class c of exp(s/T)."""
    train = torch.nn.functional.normalize(train.double(), dim=1)
    test = torch.nn.functional.normalize(test.double(), dim=1)
    predictions = []
    for query in test:
        similarities = [(float(query @ row), int(label)) for row, label in zip(train, train_labels)]
        similarities.sort(key=lambda pair: -pair[0])
        votes = [0.0] * num_classes
        for similarity, label in similarities[:k]:
            votes[label] += math.exp(similarity / temperature)
        predictions.append(max(range(num_classes), key=lambda c: (votes[c], -c)))  # first class on a tie
    return torch.tensor(predictions)


def random_problem(n, m, d, num_classes, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, d, generator=g)
    train_labels = torch.randint(0, num_classes, (n,), generator=g)
    test_labels = torch.randint(0, num_classes, (m,), generator=g)
    # Overlapping classes: the neighbours disagree, so the weighting decides predictions.
    train = centers[train_labels] + 1.5 * torch.randn(n, d, generator=g)
    test = centers[test_labels] + 1.5 * torch.randn(m, d, generator=g)
    return train, train_labels, test, test_labels


@pytest.mark.parametrize("n,m,d,num_classes", [(30, 10, 4, 3), (80, 25, 16, 5), (120, 40, 8, 10)])
@pytest.mark.parametrize("k", [1, 5, 20])
@pytest.mark.parametrize("temperature", [0.07, 0.5])
def test_matches_instdisc_reference_loop(n, m, d, num_classes, k, temperature):
    train, train_labels, test, _ = random_problem(n, m, d, num_classes, seed=n + k)
    ours = weighted_knn_predict(train, train_labels, test, num_classes, k=k, temperature=temperature)
    torch.testing.assert_close(ours, knn_reference(train, train_labels, test, num_classes, k, temperature))


@pytest.mark.parametrize("k", [1, 7, 50, 200])
@pytest.mark.parametrize("temperature", [0.07, 0.2])
def test_matches_sklearn_with_the_instdisc_weight(k, temperature):
    train, train_labels, test, _ = random_problem(400, 150, 12, 6, seed=k)
    # sklearn's cosine distance is d = 1 - s, so exp((1 - d) / T) is InstDisc's exp(s / T).
    sklearn_knn = KNeighborsClassifier(
        n_neighbors=k, metric="cosine", algorithm="brute", weights=lambda d: np.exp((1.0 - d) / temperature)
    ).fit(train.double().numpy(), train_labels.numpy())
    expected = torch.from_numpy(sklearn_knn.predict(test.double().numpy()))
    ours = weighted_knn_predict(train, train_labels, test, num_classes=6, k=k, temperature=temperature)
    torch.testing.assert_close(ours, expected)


def test_k1_matches_sklearn_nearest_neighbour():
    train, train_labels, test, _ = random_problem(300, 100, 8, 4, seed=1)
    sklearn_knn = KNeighborsClassifier(n_neighbors=1, metric="cosine", algorithm="brute").fit(
        train.numpy(), train_labels.numpy()
    )
    ours = weighted_knn_predict(train, train_labels, test, num_classes=4, k=1)
    torch.testing.assert_close(ours, torch.from_numpy(sklearn_knn.predict(test.numpy())))


def test_weighting_lets_one_close_neighbour_outvote_two_far_ones():
    # Test point at angle 0; class 1 at 5 degrees, class 0 twice at 40 degrees.
    angles = torch.tensor([5.0, 40.0, -40.0]) * math.pi / 180
    train = torch.stack([angles.cos(), angles.sin()], dim=1)
    labels = torch.tensor([1, 0, 0])
    test = torch.tensor([[1.0, 0.0]])
    # Votes: class 1 exp(cos 5 / T), class 0 2 exp(cos 40 / T); class 1 wins iff T < (cos 5 - cos 40) / log 2.
    boundary = (math.cos(angles[0]) - math.cos(angles[1])) / math.log(2)
    assert weighted_knn_predict(train, labels, test, 2, k=3, temperature=0.9 * boundary).item() == 1
    assert weighted_knn_predict(train, labels, test, 2, k=3, temperature=1.1 * boundary).item() == 0


def test_chunk_size_does_not_change_predictions():
    train, train_labels, test, _ = random_problem(500, 97, 16, 7, seed=3)
    full = weighted_knn_predict(train, train_labels, test, 7, k=30, chunk_size=1024)
    for chunk_size in (1, 10, 96, 97):
        torch.testing.assert_close(
            weighted_knn_predict(train, train_labels, test, 7, k=30, chunk_size=chunk_size), full
        )


def test_k_beyond_train_set_is_clipped_to_it():
    train, train_labels, test, _ = random_problem(15, 20, 4, 3, seed=4)
    torch.testing.assert_close(
        weighted_knn_predict(train, train_labels, test, 3, k=200),
        knn_reference(train, train_labels, test, 3, k=15, temperature=0.07),
    )


def test_tiny_temperature_does_not_overflow():
    # exp(1 / 0.005) = exp(200) is inf in float32: votes must be computed relative to the row maximum.
    train, train_labels, test, _ = random_problem(100, 40, 8, 5, seed=5)
    ours = weighted_knn_predict(train, train_labels, test, 5, k=10, temperature=0.005)
    torch.testing.assert_close(ours, knn_reference(train, train_labels, test, 5, k=10, temperature=0.005))


def test_scale_invariance_and_dtype_and_empty_test_set():
    train, train_labels, test, _ = random_problem(60, 20, 8, 3, seed=6)
    base = weighted_knn_predict(train, train_labels, test, 3, k=10)
    assert base.dtype == torch.int64 and base.shape == (20,)
    # Cosine similarity: scaling the features changes nothing, float64 input is accepted.
    torch.testing.assert_close(weighted_knn_predict(train.double() * 1e3, train_labels, test * 1e-3, 3, k=10), base)
    assert weighted_knn_predict(train, train_labels, test[:0], 3).shape == (0,)


def test_accuracy_on_separable_data_and_against_predictions():
    train, train_labels, test, test_labels = random_problem(200, 80, 8, 4, seed=7)
    predictions = weighted_knn_predict(train, train_labels, test, 4, k=20)
    expected = (predictions == test_labels).double().mean().item()
    assert knn_accuracy(train, train_labels, test, test_labels, 4, k=20) == pytest.approx(expected)
    assert 0.0 < expected < 1.0  # the problem is hard enough for the comparison to mean something
    separable = torch.eye(4)[train_labels] * 10 + 0.01 * torch.randn(200, 4)
    assert knn_accuracy(separable, train_labels, torch.eye(4)[test_labels], test_labels, 4) == 1.0


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"k": 0}, "k"),
        ({"temperature": 0.0}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"num_classes": 2}, "train_labels"),  # labels go up to 2
        ({"test_features": torch.randn(5, 3)}, "test_features"),
        ({"train_labels": torch.zeros(4, dtype=torch.long)}, "train_labels"),
        ({"train_labels": None}, "train_labels"),
        ({"train_labels": torch.tensor([0.0, 1.5, 2.0, 0.0, 1.0, 2.0])}, "train_labels"),
        ({"train_features": torch.randn(6)}, "train_features"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, argument):
    """(weighted_knn_predict; knn_accuracy's own test labels below.)"""
    arguments = {
        "train_features": torch.randn(6, 4),
        "train_labels": torch.tensor([0, 1, 2, 0, 1, 2]),
        "test_features": torch.randn(5, 4),
        "num_classes": 3,
    }
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=argument):
        weighted_knn_predict(**arguments)


@pytest.mark.parametrize(
    "test_labels,words",
    [
        (torch.tensor([0.0, 1.5, 2.0, 0.0, 1.0]), "test_labels must be integer"),  # was truncated to ints
        (torch.tensor([0, 1, 9, 0, 1]), "test_labels must lie in [0, num_classes=3)"),  # was counted as a miss
        (torch.tensor([0, 1, 2]), "test_labels must have shape (5,)"),
    ],
)
def test_knn_accuracy_checks_test_labels_as_it_checks_train_labels(test_labels, words):
    train, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError) as caught:
        knn_accuracy(train, labels, torch.randn(5, 4), test_labels, 3)
    assert words in str(caught.value)


def test_knn_refuses_features_with_nan():
    train = torch.randn(6, 4)
    train[3, 1] = float("nan")
    with pytest.raises(ValueError, match="train_features has NaN or inf values .first in row 3"):
        knn_accuracy(train, torch.tensor([0, 1, 2, 0, 1, 2]), torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]), 3)
