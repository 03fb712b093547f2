"""VICReg: value and gradient against a loop written from eq. 1-6 of Bardes et al. 2022 with the authors'
averaging, against lightly, over the global batch in two real processes, and under fp16/bf16 autocast."""

import pytest
import torch
from dist_utils import run_in_processes
from loss_utils import (
    assert_processes_match_one_process,
    emulated_processes,
    two_and_multi_view_worker,
    value_and_grads,
)

from sslkit.losses import build
from sslkit.losses.vicreg import VICRegLoss, multi_view_vicreg_loss, vicreg_loss


def variance_reference(z):
    """``v(Z) = 1/D sum_j max(0, 1 - sqrt(Var(z^j) + 1e-4))``, unbiased variance (eq. 1-2)."""
    n, d = z.shape
    terms = []
    for j in range(d):
        mean = sum(z[b, j] for b in range(n)) / n
        var = sum((z[b, j] - mean) ** 2 for b in range(n)) / (n - 1)
        terms.append(torch.clamp(1 - torch.sqrt(var + 1e-4), min=0))
    return sum(terms) / d


def covariance_reference(z):
    """``c(Z) = 1/D sum_{i != j} C_ij^2``, ``C = 1/(N - 1) sum_b (z_b - mean)(z_b - mean)^T`` (eq. 3-4)."""
    n, d = z.shape
    means = [sum(z[b, j] for b in range(n)) / n for j in range(d)]
    total = 0
    for i in range(d):
        for j in range(d):
            if i != j:
                c = sum((z[b, i] - means[i]) * (z[b, j] - means[j]) for b in range(n)) / (n - 1)
                total = total + c**2
    return total / d


def vicreg_reference(z1, z2, weights=(25.0, 25.0, 1.0)):
    """``lambda s + mu (v(Z1) + v(Z2)) / 2 + nu (c(Z1) + c(Z2))``, ``s`` the squared distance over N x D, float64."""
    z1, z2 = z1.double(), z2.double()
    n, d = z1.shape
    s = sum((z1[b, j] - z2[b, j]) ** 2 for b in range(n) for j in range(d)) / (n * d)
    v = (variance_reference(z1) + variance_reference(z2)) / 2
    c = covariance_reference(z1) + covariance_reference(z2)
    return weights[0] * s + weights[1] * v + weights[2] * c


@pytest.mark.parametrize("n,d", [(2, 3), (5, 4), (9, 6)])
@pytest.mark.parametrize("scale", [0.1, 3.0])  # small: the variance hinge is active; large: mostly not
def test_matches_reference_value_and_gradient(n, d, scale):
    g = torch.Generator().manual_seed(n * 100 + d)
    z1, z2 = torch.randn(2, n, d, generator=g, dtype=torch.float64) * scale
    ours = value_and_grads(vicreg_loss, z1, z2)
    ref = value_and_grads(vicreg_reference, z1, z2)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_weights_scale_their_terms():
    z1, z2 = torch.randn(2, 6, 4, dtype=torch.float64)
    weights = (2.0, 0.5, 3.0)
    ours = value_and_grads(vicreg_loss, z1, z2, *weights)
    ref = value_and_grads(vicreg_reference, z1, z2, weights=weights)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scale", [0.3, 2.0])
def test_matches_lightly(scale):
    lightly_loss = pytest.importorskip("lightly.loss").VICRegLoss()
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(2, 16, 32, generator=g, dtype=torch.float64) * scale
    ours = value_and_grads(vicreg_loss, z1, z2)
    theirs = value_and_grads(lightly_loss, z1, z2)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_symmetric_and_order_invariant():
    z1, z2 = torch.randn(2, 12, 6, dtype=torch.float64)
    perm = torch.randperm(12)
    base = vicreg_loss(z1, z2)
    torch.testing.assert_close(base, vicreg_loss(z2, z1))
    torch.testing.assert_close(base, vicreg_loss(z1[perm], z2[perm]))


def test_module_and_registry_give_the_function():
    z1, z2 = torch.randn(2, 8, 4)
    loss_fn = build("vicreg", covariance_weight=2.0)
    assert repr(loss_fn) == (
        "VICRegLoss(invariance_weight=25.0, variance_weight=25.0, covariance_weight=2.0, gather_distributed=True)"
    )
    torch.testing.assert_close(loss_fn(z1, z2), vicreg_loss(z1, z2, covariance_weight=2.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    z1, z2 = torch.randn(2, 64, 32)
    expected = vicreg_loss(z1.to(dtype).float(), z2.to(dtype).float())
    halves = [z1.to(dtype).requires_grad_(True), z2.to(dtype).requires_grad_(True)]
    with torch.autocast("cpu", dtype=dtype):
        got = vicreg_loss(*halves)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    torch.testing.assert_close(got, expected)  # the same rounded inputs, in fp32 both
    got.backward()
    assert all(torch.isfinite(x.grad).all() for x in halves)


def test_a_batch_too_small_for_its_statistics_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^z1 and z2 must hold at least 2 samples in all, got 1: VICReg"):
        VICRegLoss()(torch.randn(1, 8), torch.randn(1, 8))


@pytest.mark.parametrize("argument", ["invariance_weight", "variance_weight", "covariance_weight"])
def test_rejects_a_bad_weight(argument):
    with pytest.raises(ValueError, match=argument):
        VICRegLoss(**{argument: -1.0})


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    """Variance and covariance over the global batch, two views and four (multi-crop): n = 1 per process is a
    valid batch of 2."""
    g = torch.Generator().manual_seed(5)
    cases = [(*torch.randn(2, 2 * n, 6, generator=g, dtype=torch.float64) * 0.5, None, {}) for n in (1, 4)]
    views = list(torch.randn(4, 4, 6, generator=g, dtype=torch.float64) * 0.5)  # 2 global, 2 local views
    results = run_in_processes(two_and_multi_view_worker, VICRegLoss, cases, views)
    multi_view = [r[1] for r in results]
    assert_processes_match_one_process(multi_view, value_and_grads(lambda *z: multi_view_vicreg_loss(z), *views))
    results = [r[0] for r in results]
    for c, (z1, z2, _, _) in enumerate(cases):
        expected = value_and_grads(vicreg_loss, z1, z2)
        assert_processes_match_one_process([r[c] for r in results], expected)


@pytest.mark.parametrize("world", [2, 3])
def test_emulated_processes_match_one_process(monkeypatch, world):
    # The gathered path with W processes' slices as separate leaves, without spawning.
    g = torch.Generator().manual_seed(world)
    z1, z2 = torch.randn(2, 2 * world, 5, generator=g, dtype=torch.float64)
    expected = value_and_grads(vicreg_loss, z1, z2)
    got = emulated_processes(monkeypatch, vicreg_loss, z1, z2, world)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


# --- multi-crop ------------------------------------------------------------------------------


def multi_view_reference(views):
    """The mean of the two-view reference over the pairs (global g, view v), each unordered pair once:
    (1, 2), (1, l), (2, l) for two global views and the local views l."""
    z = [view.double() for view in views]
    pairs = [(g, v) for g in range(2) for v in range(len(z)) if v > g]
    return sum(vicreg_reference(z[g], z[v]) for g, v in pairs) / len(pairs)


@pytest.mark.parametrize("views,n", [(3, 2), (4, 5)])
def test_multi_view_matches_reference_value_and_gradient(views, n):
    g = torch.Generator().manual_seed(10 * views + n)
    z = list(torch.randn(views, n, 4, generator=g, dtype=torch.float64) * 0.5)
    ours = value_and_grads(lambda *z: multi_view_vicreg_loss(z), *z)
    ref = value_and_grads(lambda *z: multi_view_reference(z), *z)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_multi_view_of_the_two_global_views_is_the_two_view_loss_exactly():
    z1, z2 = torch.randn(2, 10, 6, dtype=torch.float64) * 0.5
    ours, two_view = value_and_grads(VICRegLoss().multi_view, z1, z2), value_and_grads(vicreg_loss, z1, z2)
    assert all(torch.equal(a, b) for a, b in zip(ours, two_view))
