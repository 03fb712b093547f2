"""Linear probe: a softmax classifier trained on frozen, cached features.

References:
    [0] SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709 (the linear evaluation protocol)

The encoder runs once (:func:`sslkit.evaluation.features.extract_features`), then only the
(D, C) layer trains, so 100 epochs over 60k cached features take seconds of CPU time. There
is no augmentation: on cached features it would need the encoder in the loop again.

Choices, each for convergence in few epochs and an identical result for a seed:

- Features are standardised with the train set's per-dimension mean and std. Encoders differ
  in feature scale by orders of magnitude (a post-ReLU ResNet average pool against an
  L2-normalised projector), so a fixed learning rate fits one and diverges or crawls on
  another; after standardisation the default ``lr = 0.1`` converged on every kind tried (raw
  pixels, random-init ResNet-18 features, synthetic clusters). It is an affine map the
  linear layer could absorb, so the set of classifiers the probe can express is unchanged.
- SGD with Nesterov momentum 0.9 and a cosine learning rate per step: the problem is convex,
  and the decay to zero settles the last epochs without a tuned step schedule. (AdamW was
  the alternative; its per-coordinate steps are not needed once features are standardised.)
- Zero initial weights (the optimum of a convex problem does not depend on the start, and no
  random numbers are drawn) and a ``torch.Generator`` seeded with ``seed`` for the shuffles.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.evaluation._checks import check_class_ids, check_features
from sslkit.optim import cosine_lr


def _check_probe_args(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    epochs: int,
    lr: float,
    batch_size: int,
    weight_decay: float,
) -> None:
    check_features(train_features, "train_features")
    check_features(test_features, "test_features")
    if test_features.shape[1] != train_features.shape[1]:
        raise ValueError(
            f"test_features must be (M, {train_features.shape[1]}) to match train_features, "
            f"got shape {tuple(test_features.shape)}"
        )
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    check_class_ids(train_labels, "train_labels", train_features.shape[0], num_classes)
    check_class_ids(test_labels, "test_labels", test_features.shape[0], num_classes)
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


@contextlib.contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    """Run the SGD loop on one CPU thread, then give torch its thread count back.

    Each step is a few operations on a (batch, D) block, too small to share between threads:
    every operation then waits for all threads to be scheduled. Measured on 2 cores shared
    with other jobs (60k x 512 features, 590 steps): 2 threads 24-50 s, 1 thread 3-5 s.
    """
    if device.type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, k: int) -> float:
    """Fraction of rows whose label is among the k largest logits. Shape: logits (M, C), labels (M,)."""
    top = logits.topk(k, dim=1).indices  # (M, k)
    return (top == labels[:, None]).any(dim=1).double().mean().item()


def linear_probe(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    epochs: int = 100,
    lr: float = 0.1,
    batch_size: int = 512,
    weight_decay: float = 0.0,
    seed: int = 0,
) -> dict[str, float]:
    """Train a linear softmax classifier on cached features and report its accuracy.

    Minimises the cross-entropy of ``W x_std + b`` over the train features, where
    ``x_std = (x - mean_train) / std_train``, with mini-batch SGD (Nesterov momentum 0.9,
    cosine learning rate from ``lr`` to 0, one step per batch). Runs on ``train_features``'
    device; the result is the same for the same ``seed`` and inputs.

    Args:
        train_features, train_labels: the labelled features the classifier is fitted on.
        test_features, test_labels: held-out features it is scored on.
        num_classes: number of classes (>= 2).
        epochs: passes over the train features.
        lr: peak learning rate (for standardised features; see the module docstring).
        batch_size: rows per SGD step.
        weight_decay: L2 penalty on the weights and bias.
        seed: seeds the order of the mini-batches.

    Shape:
        train_features: (N, D); train_labels: (N,) integer in [0, num_classes)
        test_features: (M, D); test_labels: (M,) integer in [0, num_classes)

    Returns:
        ``{"top1", "train_top1"}`` and, when ``num_classes >= 5``, ``"top5"``: accuracies in
        [0, 1] (``train_top1`` is measured on the train features after training; a large gap
        to ``top1`` means the probe overfits and wants ``weight_decay``).

    >>> x = torch.randn(200, 8, generator=torch.Generator().manual_seed(0)); y = (x[:, 0] > 0).long()
    >>> linear_probe(x, y, x, y, num_classes=2, epochs=20)["top1"] > 0.95
    True
    """
    _check_probe_args(
        train_features, train_labels, test_features, test_labels, num_classes, epochs, lr, batch_size, weight_decay
    )
    device = train_features.device
    x_train = train_features.detach().float()
    mean = x_train.mean(dim=0)  # (D,)
    std = x_train.std(dim=0)  # (D,)
    # A dimension constant over the train set (a dead ReLU unit) carries nothing to learn from;
    # dividing it by ~0 would only blow up whatever value it takes on the test set.
    std = torch.where(std > 1e-6, std, torch.ones_like(std))
    x_train = (x_train - mean) / std  # (N, D)
    x_test = (test_features.detach().to(device).float() - mean) / std  # (M, D)
    y_train = train_labels.to(device=device, dtype=torch.long)
    y_test = test_labels.to(device=device, dtype=torch.long)

    classifier = nn.Linear(x_train.shape[1], num_classes).to(device)
    nn.init.zeros_(classifier.weight)
    nn.init.zeros_(classifier.bias)
    optimizer = torch.optim.SGD(classifier.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)  # on the CPU: the same order on every device

    n = x_train.shape[0]
    steps_per_epoch = math.ceil(n / batch_size)
    total_steps = epochs * steps_per_epoch
    step = 0
    with torch.enable_grad(), _one_cpu_thread(device):
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator).to(device)
            for start in range(0, n, batch_size):
                batch = order[start : start + batch_size]
                for group in optimizer.param_groups:
                    group["lr"] = cosine_lr(step, total_steps, lr)  # no warm-up, decays to 0
                loss = F.cross_entropy(classifier(x_train.index_select(0, batch)), y_train.index_select(0, batch))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1

    with torch.no_grad():
        test_logits = classifier(x_test)  # (M, C)
        results = {"top1": _topk_accuracy(test_logits, y_test, 1)}
        if num_classes >= 5:
            results["top5"] = _topk_accuracy(test_logits, y_test, 5)
        results["train_top1"] = _topk_accuracy(classifier(x_train), y_train, 1)
    return results
