"""Weighted k-nearest-neighbour classification: the InstDisc monitor of representation quality.

References:
    [0] InstDisc / NPID, Wu et al. 2018, "Unsupervised Feature Learning via Non-Parametric
        Instance Discrimination", https://arxiv.org/abs/1805.01978 (section 3.4, weighted kNN)

Why hand-written rather than scikit-learn's ``KNeighborsClassifier``: the InstDisc vote is
``exp(s / T)`` of the cosine *similarity*, which sklearn only reaches through a Python weight
callable, and sklearn holds the whole distance block on the CPU in float64. Here the exact search
of :mod:`sslkit.evaluation.search` (a matrix product and a top-k per chunk of test rows) runs on
whatever device the features are on (``tools/bench/knn.py`` measures the difference). Its order
decides which of several equally similar train rows vote when they straddle the k-th place: the
lower rows.
"""

from __future__ import annotations

import torch

from sslkit.evaluation._checks import check_class_ids, check_features
from sslkit.evaluation.search import exact_search, unit_rows


def _check_knn_args(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    num_classes: int,
    k: int,
    temperature: float,
    chunk_size: int,
) -> None:
    check_features(train_features, "train_features")
    if (
        not isinstance(test_features, torch.Tensor)
        or test_features.ndim != 2
        or test_features.shape[1] != train_features.shape[1]
    ):
        got = tuple(test_features.shape) if isinstance(test_features, torch.Tensor) else type(test_features).__name__
        raise ValueError(f"test_features must be (M, {train_features.shape[1]}) to match train_features, got {got}")
    if test_features.shape[0]:
        check_features(test_features, "test_features")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    check_class_ids(train_labels, "train_labels", train_features.shape[0], num_classes)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


@torch.no_grad()
def weighted_knn_predict(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    num_classes: int,
    k: int = 200,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Predict each test row's class by a similarity-weighted vote of its k nearest train rows.

    Section 3.4 of [0]: with ``s_i`` the cosine similarity between the test feature and its
    i-th nearest train feature (of label ``c_i``), class ``c`` gets the vote::

        w_c = sum_{i <= k, c_i = c} exp(s_i / T)

    and the prediction is ``argmax_c w_c`` (the first class on a tie). Of equally similar train
    rows at the k-th place, the lower rows vote. ``k`` larger than the
    train set is clipped to it. Test rows are processed ``chunk_size`` at a time, so the peak
    memory is one (chunk_size, N) similarity block: 50k train x 10k test never needs the
    full (M, N) matrix. Everything runs on ``train_features``' device in float32.

    Args:
        train_features: bank of labelled features; L2-normalised here.
        train_labels: their classes, in ``[0, num_classes)``.
        test_features: features to classify; L2-normalised here.
        num_classes: number of classes.
        k: neighbours that vote (InstDisc and lightly's monitor use 200).
        temperature: ``T`` of the vote weight; 0.07 as in [0].
        chunk_size: test rows per similarity block.

    Shape:
        train_features: (N, D)
        train_labels: (N,) integer
        test_features: (M, D)
        returns: (M,) int64 predicted classes, on ``train_features``' device.

    >>> train = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    >>> weighted_knn_predict(train, torch.tensor([0, 0, 1]), torch.tensor([[0.1, 1.0]]), num_classes=2, k=1)
    tensor([1])
    """
    _check_knn_args(train_features, train_labels, test_features, num_classes, k, temperature, chunk_size)
    bank = unit_rows(train_features, train_features.device)  # (N, D)
    bank_labels = train_labels.to(device=bank.device, dtype=torch.long)
    # (M, k), most similar first: column 0 is the row maximum. Equal similarities by lower train row.
    top_similarity, top_index = exact_search(test_features, bank, min(k, len(bank)), block_rows=chunk_size)
    # exp((s - s_max) / T) rescales a row's votes by one positive factor, so the argmax is
    # that of exp(s / T), but it cannot overflow: exp(1 / T) is inf in float32 for T < 0.0114.
    weights = ((top_similarity - top_similarity[:, :1]) / temperature).exp()  # (M, k)
    votes = torch.zeros(len(test_features), num_classes, device=bank.device)  # (M, C)
    return votes.scatter_add_(1, bank_labels[top_index], weights).argmax(dim=1)


def knn_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    k: int = 200,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> float:
    """Fraction (in [0, 1]) of test rows whose :func:`weighted_knn_predict` class is right.

    Shape:
        train_features: (N, D); train_labels: (N,); test_features: (M, D); test_labels: (M,)
    """
    check_class_ids(test_labels, "test_labels", len(test_features), num_classes)
    if test_labels.numel() == 0:
        raise ValueError("test_labels is empty: accuracy over no samples is undefined")
    predicted = weighted_knn_predict(
        train_features, train_labels, test_features, num_classes, k, temperature, chunk_size
    )
    return (predicted.cpu() == test_labels.cpu().long()).double().mean().item()
