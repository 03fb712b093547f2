"""Linear probe: accuracy on linearly separable data and on raw digits pixels, independence
of the feature scale (standardisation), determinism for a seed, and argument checks."""

import pytest
import torch
from sklearn.datasets import load_digits

from sslkit.evaluation import linear_probe
from sslkit.evaluation.linear import cosine_lr


def separable(n, d, num_classes, seed):
    """Labels are the argmax of a random linear map, keeping only points with a clear margin."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(d, num_classes, generator=g)
    x = torch.randn(4 * n, d, generator=g)
    scores = x @ weights  # (4n, C)
    top2 = scores.topk(2, dim=1).values
    keep = (top2[:, 0] - top2[:, 1]) > 0.5
    return x[keep][:n], scores[keep][:n].argmax(dim=1)


def digits_split():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32)  # (1797, 64) raw pixels in 0..16
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, test = order[:1300], order[1300:]
    return x[train], y[train], x[test], y[test]


def test_linearly_separable_data_is_learned():
    x, y = separable(1200, 16, 5, seed=0)
    result = linear_probe(x[:900], y[:900], x[900:], y[900:], num_classes=5, epochs=30, batch_size=64)
    assert set(result) == {"top1", "top5", "train_top1"}
    assert result["train_top1"] >= 0.99
    assert result["top1"] >= 0.97
    assert result["top5"] == 1.0  # 5 classes: the top 5 always holds the label


def test_digits_raw_pixels_beat_ninety_percent():
    result = linear_probe(*digits_split(), num_classes=10, epochs=50)
    assert result["top1"] > 0.9, result


def test_feature_scale_does_not_matter():
    # An encoder whose features sit at 1e3 +- 1e2 would need a 1e4 times smaller learning rate
    # without standardisation; with it, the probe gives the same result.
    x_train, y_train, x_test, y_test = digits_split()
    base = linear_probe(x_train, y_train, x_test, y_test, num_classes=10, epochs=10)
    scaled = linear_probe(x_train * 100 + 1e3, y_train, x_test * 100 + 1e3, y_test, num_classes=10, epochs=10)
    assert scaled["top1"] == pytest.approx(base["top1"], abs=0.01)
    assert scaled["top1"] > 0.9


def test_constant_feature_does_not_blow_up_on_the_test_set():
    x_train, y_train, x_test, y_test = digits_split()
    # Pixel column 0 is always 0 in digits; make it nonzero on the test set only.
    assert x_train[:, 0].abs().max() == 0
    x_test = x_test.clone()
    x_test[:, 0] = 16.0
    assert linear_probe(x_train, y_train, x_test, y_test, num_classes=10, epochs=10)["top1"] > 0.9


def test_same_seed_same_result_and_seed_changes_the_order():
    x_train, y_train, x_test, y_test = digits_split()
    args = (x_train[:300], y_train[:300], x_test, y_test)
    first = linear_probe(*args, num_classes=10, epochs=3, batch_size=32, seed=1)
    assert linear_probe(*args, num_classes=10, epochs=3, batch_size=32, seed=1) == first
    others = [linear_probe(*args, num_classes=10, epochs=3, batch_size=32, seed=s) for s in (2, 3)]
    assert any(other != first for other in others)


def test_top5_only_with_five_classes_or_more_and_threads_restored():
    x, y = separable(200, 4, 3, seed=1)
    threads = torch.get_num_threads()
    result = linear_probe(x, y, x, y, num_classes=3, epochs=5)
    assert set(result) == {"top1", "train_top1"}
    assert torch.get_num_threads() == threads


def test_cosine_lr_goes_from_base_to_zero():
    assert cosine_lr(0, 100, 0.1) == pytest.approx(0.1)
    assert cosine_lr(50, 100, 0.1) == pytest.approx(0.05)
    assert cosine_lr(100, 100, 0.1) == pytest.approx(0.0)


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"epochs": 0}, "epochs"),
        ({"lr": 0.0}, "lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"num_classes": 1}, "num_classes"),
        ({"test_labels": torch.tensor([0, 1, 5])}, "test_labels"),
        ({"train_labels": torch.tensor([0, 1])}, "train_labels"),
        ({"test_features": torch.randn(3, 2)}, "test_features"),
        (
            {"train_labels": torch.tensor([0.0, 1.7, 2.0, 0.0])},
            "train_labels must be integer",
        ),  # not truncated silently
        (
            {
                "train_features": torch.tensor(
                    [[0.0, 1.0, 2.0], [float("nan"), 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 2.0, 1.0]]
                )
            },
            "train_features has NaN",
        ),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, argument):
    arguments = {
        "train_features": torch.randn(4, 3),
        "train_labels": torch.tensor([0, 1, 2, 0]),
        "test_features": torch.randn(3, 3),
        "test_labels": torch.tensor([0, 1, 2]),
        "num_classes": 3,
    }
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=argument):
        linear_probe(**arguments)
