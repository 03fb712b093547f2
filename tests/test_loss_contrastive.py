"""Contrastive loss: value and gradient against a loop written from Hadsell et al. eq. 4, against
pytorch-metric-learning, across two real processes, and under fp16/bf16 autocast."""

import pytest
import torch
from dist_utils import run_in_processes
from loss_utils import (
    LABEL_LAYOUTS,
    assert_processes_match_one_process,
    labelled_under_autocast,
    labelled_worker,
    seeded_torch_rng,  # noqa: F401  (autouse: every test starts from torch.manual_seed(0))
    value_and_grads,
)

from sslkit.losses.contrastive import ContrastiveLoss, contrastive_loss


def contrastive_reference(embeddings, labels, pos_margin, neg_margin, squared, normalize):
    """Hadsell et al. eq. 4 (no 1/2) as loops over ordered pairs i != j, float64, mean over pairs."""
    x = embeddings.double()
    if normalize:
        x = x / x.norm(dim=1, keepdim=True)
    terms = []
    for i in range(len(x)):
        for j in range(len(x)):
            if i == j:
                continue
            d = (x[i] - x[j]).norm()
            if labels[i] == labels[j]:
                term = torch.relu(d - pos_margin)
            else:
                term = torch.relu(neg_margin - d)
            terms.append(term**2 if squared else term)
    if not terms:
        return x.sum() * 0
    return torch.stack(terms).mean()


@pytest.mark.parametrize("layout", sorted(LABEL_LAYOUTS))
@pytest.mark.parametrize("d", [3, 16])
@pytest.mark.parametrize("margins", [(0.0, 1.0), (0.3, 1.5), (0.1, 0.5)])
@pytest.mark.parametrize("squared", [True, False])
def test_matches_reference_value_and_gradient(layout, d, margins, squared):
    labels = torch.tensor(LABEL_LAYOUTS[layout])
    g = torch.Generator().manual_seed(len(labels) * 100 + d)
    x = torch.randn(len(labels), d, generator=g, dtype=torch.float64)
    kwargs = dict(pos_margin=margins[0], neg_margin=margins[1], squared=squared)
    ours = value_and_grads(contrastive_loss, x, labels, normalize=True, **kwargs)
    ref = value_and_grads(contrastive_reference, x, labels, normalize=True, **kwargs)
    assert torch.isfinite(ours[0]) and torch.isfinite(ours[1]).all()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_unnormalized_matches_reference():
    labels = torch.tensor(LABEL_LAYOUTS["mixed7"])
    x = torch.randn(7, 5, dtype=torch.float64)
    ours = value_and_grads(contrastive_loss, x, labels, neg_margin=3.0, normalize=False)
    ref = value_and_grads(
        contrastive_reference, x, labels, pos_margin=0.0, neg_margin=3.0, squared=True, normalize=False
    )
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_order_invariant_and_zero_for_perfect_clusters():
    x = torch.randn(12, 8, dtype=torch.float64)
    labels = torch.randint(0, 3, (12,))
    perm = torch.randperm(12)
    torch.testing.assert_close(contrastive_loss(x, labels), contrastive_loss(x[perm], labels[perm]))
    # Two antipodal clusters: positives at distance 0, negatives at 2 > neg_margin.
    v = torch.nn.functional.normalize(torch.randn(1, 8, dtype=torch.float64), dim=1)
    clusters = torch.cat([v.repeat(3, 1), -v.repeat(3, 1)])
    assert contrastive_loss(clusters, torch.tensor([0, 0, 0, 1, 1, 1])).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("pos_margin,neg_margin", [(0.0, 1.0), (0.2, 0.8)])
def test_matches_pytorch_metric_learning(pos_margin, neg_margin):
    pml_losses = pytest.importorskip("pytorch_metric_learning.losses")
    from pytorch_metric_learning.reducers import SumReducer

    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
    x = torch.randn(10, 16, dtype=torch.float64)
    n = len(labels)
    theirs_fn = pml_losses.ContrastiveLoss(pos_margin=pos_margin, neg_margin=neg_margin, reducer=SumReducer())
    # Theirs: unsquared terms over ordered pairs; SumReducer + our mean over N(N-1) pairs.
    theirs = value_and_grads(lambda e, y: theirs_fn(e, y) / (n * (n - 1)), x, labels)
    ours = value_and_grads(contrastive_loss, x, labels, pos_margin=pos_margin, neg_margin=neg_margin, squared=False)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    x = torch.randn(64, 32)
    labels = torch.randint(0, 8, (64,))
    got, _, rounded, expected = labelled_under_autocast(contrastive_loss, x, labels, dtype)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    # The loss itself runs in fp32: on the half-rounded input it agrees with fp32 to rounding.
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-6)
    # What is left is the embeddings' own rounding to half precision.
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"pos_margin": -0.1}, "pos_margin"),
        ({"neg_margin": -1.0}, "neg_margin"),
        ({"neg_margin": float("nan")}, "neg_margin"),
        ({"pos_margin": 0.5, "neg_margin": 0.5}, "neg_margin"),
    ],
)
def test_rejects_bad_margins(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ContrastiveLoss(**kwargs)


def test_rejects_missing_or_mismatched_labels():
    loss_fn = ContrastiveLoss()
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8))
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8), torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="embeddings"):
        loss_fn(torch.randn(4), torch.tensor([0, 1, 0, 1]))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    # Classes straddle the two halves; class 3 has a single sample.
    labels = torch.tensor([0, 1, 2, 0, 1, 3, 0, 2])
    x = torch.randn(8, 16, dtype=torch.float64)
    expected = value_and_grads(contrastive_loss, x, labels, pos_margin=0.1, neg_margin=1.2)
    results = run_in_processes(labelled_worker, ContrastiveLoss, [dict(pos_margin=0.1, neg_margin=1.2)], x, labels)
    assert_processes_match_one_process([r[0] for r in results], expected)
