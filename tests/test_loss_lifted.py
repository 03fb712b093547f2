"""Lifted structured loss: value and gradient against a loop written from Song et al. eq. 4, against
pytorch-metric-learning, across two real processes, and under fp16/bf16 autocast."""

import math

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

from sslkit.losses.lifted import LiftedStructureLoss, lifted_structure_loss


def lifted_reference(embeddings, labels, margin, normalize=True):
    """Song et al. eq. 4 as loops over ordered positive pairs, float64."""
    x = embeddings.double()
    if normalize:
        x = x / x.norm(dim=1, keepdim=True)
    n = len(x)

    def d(i, j):
        return (x[i] - x[j]).norm()

    terms = []
    for i in range(n):
        for j in range(n):
            if i == j or labels[i] != labels[j]:
                continue
            exps = [torch.exp(margin - d(i, k)) for k in range(n) if labels[k] != labels[i]]
            exps += [torch.exp(margin - d(j, m)) for m in range(n) if labels[m] != labels[j]]
            if not exps:  # log(0) = -inf: the hinge is 0
                terms.append(x.sum() * 0)
                continue
            j_ij = torch.log(torch.stack(exps).sum()) + d(i, j)
            terms.append(torch.relu(j_ij) ** 2)
    if not terms:
        return x.sum() * 0
    return torch.stack(terms).sum() / (2 * len(terms))


@pytest.mark.parametrize("layout", sorted(LABEL_LAYOUTS))
@pytest.mark.parametrize("d", [3, 16])
@pytest.mark.parametrize("margin", [0.0, 0.5, 1.0, 2.0])
def test_matches_reference_value_and_gradient(layout, d, margin):
    labels = torch.tensor(LABEL_LAYOUTS[layout])
    g = torch.Generator().manual_seed(len(labels) * 100 + d)
    x = torch.randn(len(labels), d, generator=g, dtype=torch.float64)
    ours = value_and_grads(lifted_structure_loss, x, labels, margin=margin)
    ref = value_and_grads(lifted_reference, x, labels, margin=margin)
    assert torch.isfinite(ours[0]) and torch.isfinite(ours[1]).all()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_large_margin_does_not_overflow_fp32():
    # exp(100) overflows fp32; the logsumexp form does not.
    labels = torch.tensor(LABEL_LAYOUTS["mixed7"])
    x = torch.randn(7, 8, dtype=torch.float64) * 10
    got = lifted_structure_loss(x.float(), labels, margin=100.0, normalize=False)
    expected = lifted_reference(x, labels, margin=100.0, normalize=False)
    assert torch.isfinite(got)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("margin", [0.5, 1.0])
def test_matches_pytorch_metric_learning(margin):
    pml_losses = pytest.importorskip("pytorch_metric_learning.losses")
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
    x = torch.randn(10, 16, dtype=torch.float64)
    theirs = value_and_grads(pml_losses.LiftedStructureLoss(neg_margin=margin, pos_margin=0), x, labels)
    ours = value_and_grads(lifted_structure_loss, x, labels, margin=margin)
    assert ours[0] > 0
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_order_invariant_and_closed_form_for_two_points_per_class():
    x = torch.randn(12, 8, dtype=torch.float64)
    labels = torch.randint(0, 3, (12,))
    perm = torch.randperm(12)
    torch.testing.assert_close(lifted_structure_loss(x, labels), lifted_structure_loss(x[perm], labels[perm]))
    # Two classes at opposite poles, two copies each: d_ij = 0, all four negatives at distance 2.
    v = torch.nn.functional.normalize(torch.randn(1, 8, dtype=torch.float64), dim=1)
    x = torch.cat([v, v, -v, -v])
    j = math.log(4 * math.exp(3.0 - 2.0))
    expected = j**2 / 2
    assert lifted_structure_loss(x, torch.tensor([0, 0, 1, 1]), margin=3.0).item() == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    x, labels = random_labelled_batch(64, 32, num_classes=8, seed=0)
    got, _, rounded, expected = labelled_under_autocast(lifted_structure_loss, x, labels, dtype)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_rejects_bad_margin(bad):
    with pytest.raises(ValueError, match="margin"):
        LiftedStructureLoss(margin=bad)


def test_rejects_missing_or_mismatched_labels():
    loss_fn = LiftedStructureLoss()
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8))
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8), torch.tensor([0, 1, 0, 1, 1]))
    with pytest.raises(ValueError, match="embeddings"):
        loss_fn(torch.randint(0, 3, (4, 8)), torch.tensor([0, 1, 0, 1]))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    # Positive pairs cross the halves, rank 1 holds more of them, class 3 has one sample.
    labels = torch.tensor([0, 1, 2, 3, 0, 0, 1, 2, 1, 0])
    x = torch.randn(10, 6, dtype=torch.float64)
    expected = value_and_grads(lifted_structure_loss, x, labels, margin=1.5)
    assert expected[0] > 0
    results = run_in_processes(labelled_worker, LiftedStructureLoss, [dict(margin=1.5)], x, labels)
    assert_processes_match_one_process([r[0] for r in results], expected)
