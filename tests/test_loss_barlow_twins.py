"""Barlow Twins: value and gradient against a loop written from eq. 1-2 of Zbontar et al. 2021, against
lightly, over the global batch in two real processes, and under fp16/bf16 autocast."""

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
from sslkit.losses.barlow_twins import BarlowTwinsLoss, barlow_twins_loss, multi_view_barlow_twins_loss


def standardised_reference(z):
    """Each feature over the batch: ``(z - mean) / sqrt(biased var + 1e-5)``, as loops."""
    n, d = z.shape
    columns = []
    for j in range(d):
        mean = sum(z[b, j] for b in range(n)) / n
        var = sum((z[b, j] - mean) ** 2 for b in range(n)) / n
        columns.append(torch.stack([(z[b, j] - mean) / torch.sqrt(var + 1e-5) for b in range(n)]))
    return torch.stack(columns, dim=1)


def barlow_twins_reference(z1, z2, off_diagonal_weight):
    """``sum_i (1 - C_ii)^2 + lambda sum_{i != j} C_ij^2``, ``C_ij = sum_b zn1_bi zn2_bj / N``, in float64."""
    a, b = standardised_reference(z1.double()), standardised_reference(z2.double())
    n, d = a.shape
    loss = 0
    for i in range(d):
        for j in range(d):
            c = sum(a[k, i] * b[k, j] for k in range(n)) / n
            loss = loss + ((1 - c) ** 2 if i == j else off_diagonal_weight * c**2)
    return loss


@pytest.mark.parametrize("n,d", [(2, 3), (5, 4), (9, 6)])
@pytest.mark.parametrize("off_diagonal_weight", [5e-3, 0.5])
def test_matches_reference_value_and_gradient(n, d, off_diagonal_weight):
    g = torch.Generator().manual_seed(n * 100 + d)
    z1, z2 = torch.randn(2, n, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(barlow_twins_loss, z1, z2, off_diagonal_weight=off_diagonal_weight)
    ref = value_and_grads(barlow_twins_reference, z1, z2, off_diagonal_weight=off_diagonal_weight)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("off_diagonal_weight", [5e-3, 0.1])
def test_matches_lightly(off_diagonal_weight):
    lightly_loss = pytest.importorskip("lightly.loss").BarlowTwinsLoss(lambda_param=off_diagonal_weight)
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(2, 16, 32, generator=g, dtype=torch.float64)
    ours = value_and_grads(barlow_twins_loss, z1, z2, off_diagonal_weight=off_diagonal_weight)
    theirs = value_and_grads(lightly_loss, z1, z2)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_symmetric_order_and_feature_scale_invariant():
    z1, z2 = torch.randn(2, 12, 6, dtype=torch.float64)
    perm = torch.randperm(12)
    base = barlow_twins_loss(z1, z2)
    torch.testing.assert_close(base, barlow_twins_loss(z2, z1))
    torch.testing.assert_close(base, barlow_twins_loss(z1[perm], z2[perm]))
    # Standardisation removes each feature's shift and scale (up to the 1e-5 inside the root).
    scale, shift = torch.rand(6, dtype=torch.float64) * 10 + 1, torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(base, barlow_twins_loss(z1 * scale + shift, z2), rtol=1e-5, atol=0)


def test_near_zero_for_identical_decorrelated_views():
    # Orthonormal columns orthogonal to the ones vector (mean 0), times sqrt(N): variance 1, C = I / (1 + 1e-5).
    basis = torch.cat([torch.ones(64, 1, dtype=torch.float64), torch.randn(64, 8, dtype=torch.float64)], dim=1)
    z = torch.linalg.qr(basis)[0][:, 1:] * 8
    assert barlow_twins_loss(z, z).item() == pytest.approx(8 * (1 - 1 / (1 + 1e-5)) ** 2, rel=1e-6)
    assert barlow_twins_loss(z, z.roll(1, dims=0)).item() > 1.0  # another pairing of the images is far from it


def test_module_and_registry_give_the_function():
    z1, z2 = torch.randn(2, 8, 4)
    loss_fn = build("barlow_twins", off_diagonal_weight=0.01)
    assert repr(loss_fn) == "BarlowTwinsLoss(off_diagonal_weight=0.01, gather_distributed=True)"
    torch.testing.assert_close(loss_fn(z1, z2), barlow_twins_loss(z1, z2, 0.01))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    z1, z2 = torch.randn(2, 64, 32)
    expected = barlow_twins_loss(z1.to(dtype).float(), z2.to(dtype).float())
    halves = [z1.to(dtype).requires_grad_(True), z2.to(dtype).requires_grad_(True)]
    with torch.autocast("cpu", dtype=dtype):
        got = barlow_twins_loss(*halves)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    torch.testing.assert_close(got, expected)  # the same rounded inputs, in fp32 both
    got.backward()
    assert all(torch.isfinite(x.grad).all() for x in halves)


def test_a_batch_too_small_for_its_statistics_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^z1 and z2 must hold at least 2 samples in all, got 1: Barlow Twins"):
        BarlowTwinsLoss()(torch.randn(1, 8), torch.randn(1, 8))


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_rejects_a_bad_weight(bad):
    with pytest.raises(ValueError, match="off_diagonal_weight"):
        BarlowTwinsLoss(off_diagonal_weight=bad)


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    """Standardised and correlated over the global batch, two views and four (multi-crop): n = 1 per process
    is a valid batch of 2."""
    g = torch.Generator().manual_seed(5)
    cases = [(*torch.randn(2, 2 * n, 6, generator=g, dtype=torch.float64), None, {}) for n in (1, 4)]
    views = list(torch.randn(4, 4, 6, generator=g, dtype=torch.float64))  # 2 global, 2 local views
    results = run_in_processes(two_and_multi_view_worker, BarlowTwinsLoss, cases, views)
    multi_view = [r[1] for r in results]
    assert_processes_match_one_process(multi_view, value_and_grads(lambda *z: multi_view_barlow_twins_loss(z), *views))
    results = [r[0] for r in results]
    for c, (z1, z2, _, _) in enumerate(cases):
        expected = value_and_grads(barlow_twins_loss, z1, z2)
        per_rank = [r[c] for r in results]
        assert_processes_match_one_process(per_rank, expected)
        # every process holds the loss of the whole batch, not a share of it
        torch.testing.assert_close(per_rank[0][0], per_rank[1][0])


@pytest.mark.parametrize("world", [2, 3])
def test_emulated_processes_match_one_process(monkeypatch, world):
    # The gathered path with W processes' slices as separate leaves, without spawning.
    g = torch.Generator().manual_seed(world)
    z1, z2 = torch.randn(2, 2 * world, 5, generator=g, dtype=torch.float64)
    expected = value_and_grads(barlow_twins_loss, z1, z2)
    got = emulated_processes(monkeypatch, barlow_twins_loss, z1, z2, world)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


# --- multi-crop ------------------------------------------------------------------------------


def multi_view_reference(views):
    """The mean of the two-view reference over the pairs (global g, view v), each unordered pair once:
    (1, 2), (1, l), (2, l) for two global views and the local views l."""
    z = [view.double() for view in views]
    pairs = [(g, v) for g in range(2) for v in range(len(z)) if v > g]
    return sum(barlow_twins_reference(z[g], z[v], 5e-3) for g, v in pairs) / len(pairs)


@pytest.mark.parametrize("views,n", [(3, 2), (4, 5)])
def test_multi_view_matches_reference_value_and_gradient(views, n):
    g = torch.Generator().manual_seed(10 * views + n)
    z = list(torch.randn(views, n, 4, generator=g, dtype=torch.float64))
    ours = value_and_grads(lambda *z: multi_view_barlow_twins_loss(z), *z)
    ref = value_and_grads(lambda *z: multi_view_reference(z), *z)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_multi_view_of_the_two_global_views_is_the_two_view_loss_exactly():
    z1, z2 = torch.randn(2, 10, 6, dtype=torch.float64)
    ours, two_view = value_and_grads(BarlowTwinsLoss().multi_view, z1, z2), value_and_grads(barlow_twins_loss, z1, z2)
    assert all(torch.equal(a, b) for a, b in zip(ours, two_view))
