"""Triplet loss (all, batch-hard, semi-hard): value and gradient against loops written from FaceNet
and Hermans et al., against pytorch-metric-learning's loss + miners, across two real processes, and
under fp16/bf16 autocast."""

import pytest
import torch

from dist_utils import run_in_processes
from sslkit.losses.triplet import TripletLoss, triplet_loss


@pytest.fixture(autouse=True)
def _seed():
    # Every test draws the same numbers on every run: a random-input test must not be flaky.
    torch.manual_seed(0)


LABELS = {
    "balanced": [0, 0, 1, 1, 2, 2],
    "singleton": [0, 0, 0, 1, 1, 2],
    "one_class": [4, 4, 4, 4],
    "all_distinct": [0, 1, 2, 3, 5],
    "mixed7": [1, 0, 1, 2, 0, 1, 3],
}
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


def _value_and_grad(fn, embeddings, labels, **kwargs):
    x = embeddings.clone().requires_grad_(True)
    loss = fn(x, labels, **kwargs)
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("layout", sorted(LABELS))
@pytest.mark.parametrize("mining", MINING)
@pytest.mark.parametrize("squared_distance,margin", [(True, 0.2), (True, 1.0), (False, 0.3), (False, 0.0)])
@pytest.mark.parametrize("reduction", ["mean", "mean_nonzero"])
def test_matches_reference_value_and_gradient(layout, mining, squared_distance, margin, reduction):
    labels = torch.tensor(LABELS[layout])
    g = torch.Generator().manual_seed(len(labels) * 7 + int(margin * 10))
    x = torch.randn(len(labels), 8, generator=g, dtype=torch.float64)
    kwargs = dict(margin=margin, mining=mining, squared_distance=squared_distance, reduction=reduction)
    ours = _value_and_grad(triplet_loss, x, labels, **kwargs)
    ref = _value_and_grad(triplet_reference, x, labels, **kwargs)
    assert torch.isfinite(ours[0]) and torch.isfinite(ours[1]).all()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("mining", MINING)
def test_larger_batch_matches_reference(mining):
    # Enough triplets that "semihard" selects a strict, non-empty subset of "all".
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 3, 2])
    x = torch.randn(10, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ours = _value_and_grad(triplet_loss, x, labels, margin=0.5, mining=mining)
    ref = _value_and_grad(
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
    ours = _value_and_grad(triplet_loss, x, labels, **kwargs)
    theirs = _value_and_grad(theirs_fn, x, labels)
    assert ours[0] > 0
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("mining", MINING)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(mining, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g)
    labels = torch.randint(0, 8, (64,), generator=g)
    loss_fn = TripletLoss(margin=0.2, mining=mining)
    expected = loss_fn(x, labels)
    with torch.autocast("cpu", dtype=dtype):
        got = loss_fn(x.to(dtype), labels)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    # The loss runs in fp32: on the half-rounded input it matches fp32 to rounding.
    torch.testing.assert_close(got, loss_fn(x.to(dtype).float(), labels), rtol=1e-5, atol=1e-6)
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


def _two_process_triplet(rank, world, x, labels):
    n = x.shape[0] // world
    results = []
    for mining, reduction in CASES:
        local = x[rank * n:(rank + 1) * n].clone().requires_grad_(True)
        loss = TripletLoss(margin=0.5, mining=mining, reduction=reduction)(local, labels[rank * n:(rank + 1) * n])
        loss.backward()
        results.append((loss.detach(), local.grad))
    return results


def test_two_processes_match_one_process_on_whole_batch():
    # Classes straddle the halves, rank 1 holds more triplets than rank 0, class 3 has one sample.
    labels = torch.tensor([0, 1, 2, 3, 0, 0, 1, 2, 1, 0])
    x = torch.randn(10, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = run_in_processes(_two_process_triplet, x, labels)
    for k, (mining, reduction) in enumerate(CASES):
        loss, grad = _value_and_grad(triplet_loss, x, labels, margin=0.5, mining=mining, reduction=reduction)
        assert loss > 0
        torch.testing.assert_close(torch.stack([r[k][0] for r in results]).mean(), loss)
        torch.testing.assert_close(torch.cat([r[k][1] for r in results]) / 2, grad)
