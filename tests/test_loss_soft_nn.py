"""Soft nearest neighbours: value and gradient against a loop written from Frosst et al. eq. 1,
invariants, across two real processes, and under fp16/bf16 autocast. No peer library has it."""

import math

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import (
    assert_processes_match_one_process,
    labelled_under_autocast,
    labelled_worker,
    make_labels,
    random_labelled_batch,
    value_and_grads,
)

from sslkit.losses.soft_nn import SoftNearestNeighborsLoss, soft_nearest_neighbors_loss


def soft_nn_reference(embeddings, labels, temperature, normalize=False):
    """Eq. 1 of the paper as plain loops, float64; anchors alone in their class are skipped."""
    x = embeddings.double()
    if normalize:
        x = F.normalize(x, dim=1)
    n = len(x)
    losses = []
    for i in range(n):
        same = [j for j in range(n) if j != i and labels[j] == labels[i]]
        if not same:
            continue
        numerator = sum(torch.exp(-((x[i] - x[j]) ** 2).sum() / temperature) for j in same)
        denominator = sum(torch.exp(-((x[i] - x[k]) ** 2).sum() / temperature) for k in range(n) if k != i)
        losses.append(-torch.log(numerator / denominator))
    if not losses:
        return embeddings.sum() * 0.0
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d", [(2, 3), (6, 8), (11, 4)])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 10.0])
@pytest.mark.parametrize("kind", ["mixed", "pairs", "one_class"])
@pytest.mark.parametrize("normalize", [False, True])
def test_matches_reference_value_and_gradient(n, d, temperature, kind, normalize):
    g = torch.Generator().manual_seed(n * 100 + d)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    labels = make_labels(kind, n, g)
    ours = value_and_grads(soft_nearest_neighbors_loss, x, labels, temperature=temperature, normalize=normalize)
    ref = value_and_grads(soft_nn_reference, x, labels, temperature=temperature, normalize=normalize)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_translation_invariant_without_normalisation():
    # distances only: shifting every embedding changes nothing (the dropped ||x_i||^2 term is exact)
    x = torch.randn(10, 6, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 0, 4])
    shifted = x + 3.0 * torch.randn(1, 6, dtype=torch.float64)
    torch.testing.assert_close(soft_nearest_neighbors_loss(x, labels), soft_nearest_neighbors_loss(shifted, labels))


def test_identical_embeddings_give_log_of_class_share():
    # all weights equal: l_i = -log(|same class| / (N - 1)), averaged over anchors with a partner
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    x = torch.randn(1, 8).repeat(6, 1)
    expected = (3 * -math.log(2 / 5) + 2 * -math.log(1 / 5)) / 5
    assert soft_nearest_neighbors_loss(x, labels).item() == pytest.approx(expected, rel=1e-5)


def test_order_invariant():
    x = torch.randn(12, 8, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 3, 3, 4, 0, 5, 1])
    perm = torch.randperm(12)
    torch.testing.assert_close(
        soft_nearest_neighbors_loss(x, labels, 2.0), soft_nearest_neighbors_loss(x[perm], labels[perm], 2.0)
    )


def test_well_separated_classes_give_near_zero_and_mixed_ones_do_not():
    centres = torch.tensor([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]])
    labels = torch.arange(3).repeat_interleave(4)
    x = centres[labels] + 0.1 * torch.randn(12, 2)
    assert soft_nearest_neighbors_loss(x, labels).item() < 1e-6
    assert soft_nearest_neighbors_loss(x, torch.arange(4).repeat(3)).item() > 1.0


def test_large_distances_stay_finite():
    # squared distances ~1e6 / T: exp would underflow to 0 for every term without logsumexp
    x = (1000.0 * torch.randn(8, 4)).requires_grad_(True)
    loss = soft_nearest_neighbors_loss(x, torch.arange(8) // 2, temperature=0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("normalize,temperature", [(False, 4.0), (True, 0.05)])
def test_half_precision_autocast_is_finite_and_close(dtype, normalize, temperature):
    x, labels = random_labelled_batch(64, 16, num_classes=8, seed=2)
    got, grad, rounded, expected = labelled_under_autocast(
        soft_nearest_neighbors_loss, x, labels, dtype, backward=True, temperature=temperature, normalize=normalize
    )
    assert got.dtype == torch.float32 and torch.isfinite(got) and torch.isfinite(grad).all()
    # the math runs in fp32: the only error left is the embeddings' own rounding to half precision
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=3e-2, atol=3e-2)


def test_anchors_without_partner_give_no_nan():
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 2, 3, 4])
    loss = soft_nearest_neighbors_loss(x, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    torch.testing.assert_close(loss.detach(), soft_nn_reference(x.detach(), labels, 1.0))


def test_no_partner_anywhere_is_zero_with_a_graph():
    x = torch.randn(5, 8, requires_grad=True)
    loss = SoftNearestNeighborsLoss()(x, torch.arange(5))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_rejects_bad_temperature(bad):
    with pytest.raises(ValueError, match="temperature"):
        SoftNearestNeighborsLoss(temperature=bad)


def test_rejects_bad_labels():
    with pytest.raises(ValueError, match="labels"):
        soft_nearest_neighbors_loss(torch.randn(4, 8), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        soft_nearest_neighbors_loss(torch.randn(4, 8), torch.zeros(4))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    x = torch.randn(10, 6, dtype=torch.float64)
    # rank 0 holds four anchors with a partner, rank 1 three: the normalisation must be global
    labels = torch.tensor([0, 0, 1, 2, 3, 1, 3, 3, 4, 5])
    expected = value_and_grads(soft_nearest_neighbors_loss, x, labels, temperature=2.0)
    results = run_in_processes(labelled_worker, SoftNearestNeighborsLoss, [dict(temperature=2.0)], x, labels)
    assert_processes_match_one_process([r[0] for r in results], expected)
