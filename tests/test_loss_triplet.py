"""Triplet loss (all, batch-hard, semi-hard): value and gradient against loops written from FaceNet
and Hermans et al., against pytorch-metric-learning's loss + miners, across two real processes, and
under fp16/bf16 autocast."""

import pytest
import torch
from dist_utils import run_in_processes
from loss_utils import (
    LABEL_LAYOUTS,
    assert_processes_match_one_process,
    labelled_under_autocast,
    labelled_worker,
    random_labelled_batch,
    seeded_torch_rng,  # noqa: F401  (autouse: every test starts from torch.manual_seed(0))
    value_and_grads,
)

from sslkit.losses.triplet import TripletLoss, triplet_loss

MINING = ["all", "hard", "semihard"]


def triplet_reference(embeddings, labels, margin, mining, squared_distance, reduction):
    """FaceNet's hinge over the mined triplets, as loops, float64."""
    x = embeddings.double()
    x = x / x.norm(dim=1, keepdim=True)

    def d(i, j):
        dist = (x[i] - x[j]).norm()
        return dist**2 if squared_distance else dist

    losses = []
    for a in range(len(x)):
        positives = [p for p in range(len(x)) if p != a and labels[p] == labels[a]]
        negatives = [k for k in range(len(x)) if labels[k] != labels[a]]
        if mining == "hard":
            if positives and negatives:  # Hermans et al.: farthest positive, closest negative
                hardest_p = torch.stack([d(a, p) for p in positives]).max()
                hardest_n = torch.stack([d(a, k) for k in negatives]).min()
                losses.append(torch.relu(hardest_p - hardest_n + margin))
            continue
        for p in positives:
            for k in negatives:
                d_ap, d_an = d(a, p), d(a, k)
                if mining == "semihard" and not (d_ap < d_an < d_ap + margin):
                    continue
                losses.append(torch.relu(d_ap - d_an + margin))
    if reduction == "mean_nonzero":
        losses = [loss for loss in losses if loss > 0]
    if not losses:
        return x.sum() * 0
    return torch.stack(losses).mean()


@pytest.mark.parametrize("layout", sorted(LABEL_LAYOUTS))
@pytest.mark.parametrize("mining", MINING)
@pytest.mark.parametrize("squared_distance,margin", [(True, 0.2), (True, 1.0), (False, 0.3), (False, 0.0)])
@pytest.mark.parametrize("reduction", ["mean", "mean_nonzero"])
def test_matches_reference_value_and_gradient(layout, mining, squared_distance, margin, reduction):
    labels = torch.tensor(LABEL_LAYOUTS[layout])
    g = torch.Generator().manual_seed(len(labels) * 7 + int(margin * 10))
    x = torch.randn(len(labels), 8, generator=g, dtype=torch.float64)
    kwargs = dict(margin=margin, mining=mining, squared_distance=squared_distance, reduction=reduction)
    ours = value_and_grads(triplet_loss, x, labels, **kwargs)
    ref = value_and_grads(triplet_reference, x, labels, **kwargs)
    assert torch.isfinite(ours[0]) and torch.isfinite(ours[1]).all()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("mining", MINING)
def test_larger_batch_matches_reference(mining):
    # Enough triplets that "semihard" selects a strict, non-empty subset of "all".
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 3, 2])
    x = torch.randn(10, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ours = value_and_grads(triplet_loss, x, labels, margin=0.5, mining=mining)
    ref = value_and_grads(
        triplet_reference, x, labels, margin=0.5, mining=mining, squared_distance=True, reduction="mean"
    )
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert ours[0] > 0


def _pml_triplet(mining, margin, squared_distance, reduction):
    losses = pytest.importorskip("pytorch_metric_learning.losses")
    from pytorch_metric_learning import distances, miners, reducers

    distance = distances.LpDistance(normalize_embeddings=True, p=2, power=2 if squared_distance else 1)
    reducer = reducers.MeanReducer() if reduction == "mean" else reducers.AvgNonZeroReducer()
    loss_fn = losses.TripletMarginLoss(margin=margin, distance=distance, reducer=reducer)
    if mining == "all":
        miner = None
    elif mining == "hard":
        miner = miners.BatchHardMiner(distance=distance)
    else:
        miner = miners.TripletMarginMiner(margin=margin, type_of_triplets="semihard", distance=distance)

    def fn(embeddings, labels):
        return loss_fn(embeddings, labels, None if miner is None else miner(embeddings, labels))

    return fn


@pytest.mark.parametrize("mining", MINING)
@pytest.mark.parametrize("squared_distance,margin", [(True, 0.2), (False, 0.1)])
@pytest.mark.parametrize("reduction", ["mean", "mean_nonzero"])
def test_matches_pytorch_metric_learning(mining, squared_distance, margin, reduction):
    theirs_fn = _pml_triplet(mining, margin, squared_distance, reduction)
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 4, 4, 1])
    x = torch.randn(12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    kwargs = dict(margin=margin, mining=mining, squared_distance=squared_distance, reduction=reduction)
    ours = value_and_grads(triplet_loss, x, labels, **kwargs)
    theirs = value_and_grads(theirs_fn, x, labels)
    assert ours[0] > 0
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("mining", MINING)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(mining, dtype):
    x, labels = random_labelled_batch(64, 32, num_classes=8, seed=0)
    got, _, rounded, expected = labelled_under_autocast(TripletLoss(margin=0.2, mining=mining), x, labels, dtype)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    # The loss runs in fp32: on the half-rounded input it matches fp32 to rounding.
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-6)
    # What is left is the embeddings' own rounding (which can also move a few semi-hard triplets).
    torch.testing.assert_close(got, expected, rtol=5e-2, atol=2e-2)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"margin": -0.1}, "margin"),
        ({"margin": float("inf")}, "margin"),
        ({"mining": "hardest"}, "mining"),
        ({"reduction": "sum"}, "reduction"),
    ],
)
def test_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TripletLoss(**kwargs)


def test_functional_rejects_unknown_mining():
    with pytest.raises(ValueError, match="mining"):
        triplet_loss(torch.randn(4, 8), torch.tensor([0, 0, 1, 1]), mining="Hard")


def test_rejects_missing_or_mismatched_labels():
    loss_fn = TripletLoss()
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8))
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8), torch.tensor([[0, 1], [0, 1]]))
    with pytest.raises(ValueError, match="embeddings"):
        loss_fn(torch.randn(4, 8, 2), torch.tensor([0, 1, 0, 1]))


CASES = [(mining, reduction) for mining in MINING for reduction in ("mean", "mean_nonzero")]


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    # Classes straddle the halves, rank 1 holds more triplets than rank 0, class 3 has one sample.
    labels = torch.tensor([0, 1, 2, 3, 0, 0, 1, 2, 1, 0])
    x = torch.randn(10, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cases = [dict(margin=0.5, mining=mining, reduction=reduction) for mining, reduction in CASES]
    results = run_in_processes(labelled_worker, TripletLoss, cases, x, labels)
    for k, kwargs in enumerate(cases):
        expected = value_and_grads(triplet_loss, x, labels, **kwargs)
        assert expected[0] > 0
        assert_processes_match_one_process([r[k] for r in results], expected)
