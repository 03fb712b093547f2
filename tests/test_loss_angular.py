"""Angular loss (smooth batch form and triplet hinge form): value and gradient against loops
written from Wang et al. 2017, against pytorch-metric-learning, across two real processes, and
under fp16/bf16 autocast."""

import math

import pytest
import torch
import torch.nn.functional as F
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

from sslkit.losses.angular import AngularLoss, angular_loss


def _triples(labels):
    """Every ordered positive pair (a, p), with the negatives of a."""
    n = len(labels)
    for a in range(n):
        for p in range(n):
            if p != a and labels[p] == labels[a]:
                yield a, p, [k for k in range(n) if labels[k] != labels[a]]


def angular_smooth_reference(embeddings, labels, alpha_degrees):
    """Wang et al. eq. 8 as loops over (a, p) pairs and their negatives, float64."""
    x = embeddings.double()
    x = x / x.norm(dim=1, keepdim=True)
    t = math.tan(math.radians(alpha_degrees)) ** 2
    terms = []
    for a, p, negatives in _triples(labels):
        s = x.sum() * 0  # keeps the graph when there is no negative
        for k in negatives:
            s = s + torch.exp(4 * t * (x[a] + x[p]) @ x[k] - 2 * (1 + t) * x[a] @ x[p])
        terms.append(torch.log(1 + s))
    return torch.stack(terms).mean() if terms else x.sum() * 0


def angular_hinge_reference(embeddings, labels, alpha_degrees, normalize=True):
    """The triplet form [||x_a - x_p||^2 - 4 tan^2(alpha) ||x_n - x_c||^2]_+, mean over triplets."""
    x = embeddings.double()
    if normalize:
        x = x / x.norm(dim=1, keepdim=True)
    t = math.tan(math.radians(alpha_degrees)) ** 2
    terms = []
    for a, p, negatives in _triples(labels):
        centre = (x[a] + x[p]) / 2
        for k in negatives:
            terms.append(torch.relu((x[a] - x[p]).square().sum() - 4 * t * (x[k] - centre).square().sum()))
    return torch.stack(terms).mean() if terms else x.sum() * 0


@pytest.mark.parametrize("layout", sorted(LABEL_LAYOUTS))
@pytest.mark.parametrize("d", [3, 16])
@pytest.mark.parametrize("alpha_degrees", [20.0, 40.0, 60.0])
@pytest.mark.parametrize("smooth", [True, False])
def test_matches_reference_value_and_gradient(layout, d, alpha_degrees, smooth):
    labels = torch.tensor(LABEL_LAYOUTS[layout])
    g = torch.Generator().manual_seed(len(labels) * 100 + d)
    x = torch.randn(len(labels), d, generator=g, dtype=torch.float64)
    reference = angular_smooth_reference if smooth else angular_hinge_reference
    ours = value_and_grads(angular_loss, x, labels, alpha_degrees=alpha_degrees, smooth=smooth)
    ref = value_and_grads(reference, x, labels, alpha_degrees=alpha_degrees)
    assert torch.isfinite(ours[0]) and torch.isfinite(ours[1]).all()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_hinge_form_without_normalisation_matches_reference():
    labels = torch.tensor(LABEL_LAYOUTS["mixed7"])
    x = torch.randn(7, 5, dtype=torch.float64) * 3
    ours = value_and_grads(angular_loss, x, labels, alpha_degrees=30.0, smooth=False, normalize=False)
    ref = value_and_grads(angular_hinge_reference, x, labels, alpha_degrees=30.0, normalize=False)
    assert ours[0] > 0
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_smooth_exponent_is_the_hinge_argument_minus_a_constant():
    # The docstring's identity: for unit vectors, hinge argument = f(a, p, n) + 2 - 6 tan^2(alpha).
    x = F.normalize(torch.randn(3, 8, dtype=torch.float64), dim=1)
    a, p, n = x
    t = math.tan(math.radians(40.0)) ** 2
    f = 4 * t * (a + p) @ n - 2 * (1 + t) * a @ p
    hinge_argument = (a - p).square().sum() - 4 * t * (n - (a + p) / 2).square().sum()
    torch.testing.assert_close(hinge_argument, f + 2 - 6 * t)


@pytest.mark.parametrize("alpha_degrees", [35.0, 45.0])
def test_matches_pytorch_metric_learning(alpha_degrees):
    pml_losses = pytest.importorskip("pytorch_metric_learning.losses")
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
    # Theirs leaves the negatives unnormalised: compare on unit vectors, where the values agree.
    x = F.normalize(torch.randn(10, 16, dtype=torch.float64), dim=1)
    ours = value_and_grads(angular_loss, x, labels, alpha_degrees=alpha_degrees)
    theirs = value_and_grads(pml_losses.AngularLoss(alpha=alpha_degrees), x, labels)
    assert ours[0] > 0
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-8, atol=1e-10)

    # Their negatives' gradient keeps a radial part (no normalisation to differentiate through);
    # along the sphere, the gradients agree.
    def tangential(grad):
        return grad - (grad * x).sum(dim=1, keepdim=True) * x

    torch.testing.assert_close(ours[1], tangential(ours[1]), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(ours[1], tangential(theirs[1]), rtol=1e-8, atol=1e-10)
    assert not torch.allclose(theirs[1], tangential(theirs[1]))


@pytest.mark.parametrize("smooth", [True, False])
def test_order_invariant(smooth):
    x = torch.randn(12, 8, dtype=torch.float64)
    labels = torch.randint(0, 3, (12,))
    perm = torch.randperm(12)
    torch.testing.assert_close(
        angular_loss(x, labels, smooth=smooth), angular_loss(x[perm], labels[perm], smooth=smooth)
    )


@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(smooth, dtype):
    x, labels = random_labelled_batch(64, 32, num_classes=8, seed=0)
    got, _, rounded, expected = labelled_under_autocast(angular_loss, x, labels, dtype, smooth=smooth)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bad", [0.0, -10.0, 90.0, 120.0, float("nan")])
def test_rejects_bad_alpha(bad):
    with pytest.raises(ValueError, match="alpha_degrees"):
        AngularLoss(alpha_degrees=bad)


def test_rejects_missing_or_mismatched_labels():
    loss_fn = AngularLoss()
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8))
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8), torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="embeddings"):
        loss_fn(torch.randn(4), torch.tensor([0, 1, 0, 1]))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    # Positive pairs cross the halves, rank 1 holds more of them, class 3 has one sample.
    labels = torch.tensor([0, 1, 2, 3, 0, 0, 1, 2, 1, 0])
    x = torch.randn(10, 6, dtype=torch.float64)
    cases = [dict(alpha_degrees=30, smooth=smooth) for smooth in (True, False)]
    results = run_in_processes(labelled_worker, AngularLoss, cases, x, labels)
    for k, kwargs in enumerate(cases):
        expected = value_and_grads(angular_loss, x, labels, **kwargs)
        assert expected[0] > 0
        assert_processes_match_one_process([r[k] for r in results], expected)
