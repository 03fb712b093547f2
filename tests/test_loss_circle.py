"""Circle loss: value and gradient against a loop written from Sun et al. eq. 6, against
pytorch-metric-learning, across two real processes, and under fp16/bf16 autocast."""

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

from sslkit.losses.circle import CircleLoss, circle_loss


def circle_reference(embeddings, labels, margin, gamma, detach_weights=True):
    """Eq. 6 of the paper as plain loops over (negative, positive) pairs, float64.

    ``log(1 + sum_n sum_p exp(g (a_n (s_n - D_n) - a_p (s_p - D_p))))``, the 1 and the pair
    terms summed by logsumexp because with g = 256 single terms exceed exp(700). Anchors
    with no positive or no negative are skipped.
    """
    z = F.normalize(embeddings.double(), dim=1)
    n = len(z)
    losses = []
    for i in range(n):
        pos = [z[i] @ z[j] for j in range(n) if j != i and labels[j] == labels[i]]
        neg = [z[i] @ z[j] for j in range(n) if labels[j] != labels[i]]
        if not pos or not neg:
            continue
        terms = [torch.zeros((), dtype=torch.float64)]  # the 1 inside the log
        for s_n in neg:
            a_n = torch.clamp(s_n + margin, min=0)
            for s_p in pos:
                a_p = torch.clamp(1 + margin - s_p, min=0)
                if detach_weights:
                    a_n, a_p = a_n.detach(), a_p.detach()
                terms.append(gamma * (a_n * (s_n - margin) - a_p * (s_p - (1 - margin))))
        losses.append(torch.logsumexp(torch.stack(terms), dim=0))
    if not losses:
        return embeddings.sum() * 0.0
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d", [(3, 3), (6, 8), (10, 16)])
@pytest.mark.parametrize("margin,gamma", [(0.25, 256.0), (0.4, 80.0), (0.1, 1.0)])
@pytest.mark.parametrize("kind", ["mixed", "pairs", "one_class"])
def test_matches_reference_value_and_gradient(n, d, margin, gamma, kind):
    g = torch.Generator().manual_seed(n * 100 + d)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    labels = make_labels(kind, n, g)
    ours = value_and_grads(circle_loss, x, labels, margin=margin, gamma=gamma)
    ref = value_and_grads(circle_reference, x, labels, margin=margin, gamma=gamma)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_weights_are_detached():
    # Same value either way; the gradient is the paper's only with a_p, a_n held constant.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    ours = value_and_grads(circle_loss, x, labels, margin=0.25, gamma=4.0)
    through = value_and_grads(circle_reference, x, labels, margin=0.25, gamma=4.0, detach_weights=False)
    torch.testing.assert_close(ours[0], through[0])
    assert not torch.allclose(ours[1], through[1], rtol=1e-3, atol=1e-6)


def test_order_invariant():
    x = torch.randn(12, 8, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 3, 3, 4, 0, 5, 1])
    perm = torch.randperm(12)
    torch.testing.assert_close(circle_loss(x, labels), circle_loss(x[perm], labels[perm]))


@pytest.mark.parametrize("margin,gamma", [(0.25, 256.0), (0.4, 80.0), (0.25, 128.0)])
@pytest.mark.parametrize("kind", ["mixed", "pairs"])
def test_matches_pytorch_metric_learning(margin, gamma, kind):
    # pml's CircleLoss detaches the weights too and averages over anchors with a non-zero loss
    # (AvgNonZeroReducer), i.e. over anchors with a positive and a negative, as here.
    # Its defaults are m=0.4, gamma=80; sslkit's are the paper's face-recognition 0.25, 256.
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    g = torch.Generator().manual_seed(11)
    x = torch.randn(13, 16, generator=g, dtype=torch.float64)
    labels = make_labels(kind, 13, g)
    ours = value_and_grads(circle_loss, x, labels, margin=margin, gamma=gamma)
    theirs = value_and_grads(pml.CircleLoss(m=margin, gamma=gamma), x, labels)
    # pml's nn.Softplus turns linear above 20 (error < 2e-9 relative); sslkit's is exact
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    x, labels = random_labelled_batch(64, 32, num_classes=8, seed=2)
    # gamma = 256 (the default): terms up to exp(1000)
    got, grad, rounded, expected = labelled_under_autocast(circle_loss, x, labels, dtype, backward=True)
    assert got.dtype == torch.float32 and torch.isfinite(got) and torch.isfinite(grad).all()
    # the math runs in fp32: the only error left is the embeddings' own rounding to half precision,
    # which gamma = 256 amplifies (a similarity off by 4e-3 in bf16 moves a logit by ~1)
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_extreme_similarities_stay_finite():
    # positives pointing opposite ways (s_p = -1) and identical negatives (s_n = 1)
    base = torch.randn(1, 8)
    x = torch.cat([base, -base, base, base]).requires_grad_(True)
    loss = circle_loss(x, torch.tensor([0, 0, 1, 2]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all() and loss.item() > 500


def test_anchors_without_pairs_give_no_nan():
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 2, 3, 4])  # only anchors 0 and 1 have a positive
    loss = circle_loss(x, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    torch.testing.assert_close(loss.detach(), circle_reference(x.detach(), labels, 0.25, 256.0))


@pytest.mark.parametrize("labels", [torch.arange(5), torch.zeros(5, dtype=torch.long)])
def test_no_pair_anywhere_is_zero_with_a_graph(labels):
    x = torch.randn(5, 8, requires_grad=True)
    loss = CircleLoss()(x, labels)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan")])
def test_rejects_bad_margin(bad):
    with pytest.raises(ValueError, match=r"margin must be in \[0, 1\)"):  # the range it states is the one it checks
        CircleLoss(margin=bad)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf")])
def test_rejects_bad_gamma(bad):
    with pytest.raises(ValueError, match="gamma"):
        CircleLoss(gamma=bad)


def test_rejects_bad_labels():
    with pytest.raises(ValueError, match="labels"):
        circle_loss(torch.randn(4, 8), torch.zeros(3, dtype=torch.long))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    x = torch.randn(10, 6, dtype=torch.float64)
    # rank 0 holds four anchors with pairs, rank 1 three: the normalisation must be global
    labels = torch.tensor([0, 0, 1, 2, 3, 1, 3, 3, 4, 5])
    expected = value_and_grads(circle_loss, x, labels, margin=0.25, gamma=32.0)
    results = run_in_processes(labelled_worker, CircleLoss, [dict(margin=0.25, gamma=32.0)], x, labels)
    assert_processes_match_one_process([r[0] for r in results], expected)
