"""SimSiam's loss: value and gradient against a loop written from section 3 of Chen and He 2020,
against lightly's NegativeCosineSimilarity as its SimSiam example uses it, and under autocast."""

import pytest
import torch
from loss_utils import value_and_grads

from sslkit.losses import build
from sslkit.losses.simsiam import SimSiamLoss, multi_view_simsiam_loss, simsiam_loss


def simsiam_reference(queries, keys):
    """``1/2 D(p1, stopgrad(z2)) + 1/2 D(p2, stopgrad(z1))``, ``D(p, z) = -p/||p|| . z/||z||``, as loops in float64."""
    n = len(queries) // 2
    p, z = queries.double(), keys.double().detach()

    def D(p, z):
        return -sum(p[j] * z[j] for j in range(len(p))) / (p.norm() * z.norm())

    terms = [0.5 * D(p[i], z[n + i]) + 0.5 * D(p[n + i], z[i]) for i in range(n)]
    return torch.stack(terms).mean()


@pytest.mark.parametrize("n,d", [(1, 3), (4, 8), (7, 16)])
def test_matches_reference_value_and_gradient(n, d):
    g = torch.Generator().manual_seed(n * 100 + d)
    queries, keys = torch.randn(2, 2 * n, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(simsiam_loss, queries, keys)
    ref = value_and_grads(simsiam_reference, queries, keys)
    torch.testing.assert_close(ours[:2], ref[:2], rtol=1e-10, atol=1e-12)


def test_the_stop_gradient_is_the_losses_own():
    """The method passes the projections with their gradient; none reaches them through the loss."""
    z = torch.randn(8, 4, requires_grad=True)
    p = torch.randn(8, 4, requires_grad=True)
    simsiam_loss(p, z * 2).backward()
    assert z.grad is None and p.grad is not None


def test_matches_lightly():
    negative_cosine = pytest.importorskip("lightly.loss").NegativeCosineSimilarity()
    g = torch.Generator().manual_seed(3)
    queries, keys = torch.randn(2, 16, 32, generator=g, dtype=torch.float64)

    def lightly_example(q, k):
        p1, p2 = q.chunk(2)
        z1, z2 = k.detach().chunk(2)
        return 0.5 * (negative_cosine(p1, z2) + negative_cosine(p2, z1))

    ours = value_and_grads(simsiam_loss, queries, keys)
    theirs = value_and_grads(lightly_example, queries, keys)
    torch.testing.assert_close(ours[:2], theirs[:2], rtol=1e-10, atol=1e-12)


def test_minus_one_for_aligned_views_and_symmetric_in_the_views():
    z = torch.randn(6, 5, dtype=torch.float64)
    assert simsiam_loss(z, 4 * z.roll(3, dims=0)).item() == pytest.approx(-1.0)
    queries, keys = torch.randn(2, 12, 8, dtype=torch.float64)
    swap = torch.arange(12).roll(6)  # view 2 first
    torch.testing.assert_close(simsiam_loss(queries, keys), simsiam_loss(queries[swap], keys[swap]))


def test_module_and_registry_give_the_function():
    queries, keys = torch.randn(2, 8, 4)
    loss_fn = build("simsiam")
    assert isinstance(loss_fn, SimSiamLoss) and repr(loss_fn) == "SimSiamLoss()"
    torch.testing.assert_close(loss_fn(queries, keys), simsiam_loss(queries, keys))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    g = torch.Generator().manual_seed(2)
    queries, keys = torch.randn(2, 16, 32, generator=g)
    expected = simsiam_loss(queries.to(dtype).float(), keys.to(dtype).float())
    half = queries.to(dtype).requires_grad_(True)
    with torch.autocast("cpu", dtype=dtype):
        loss = simsiam_loss(half, keys.to(dtype))
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(half.grad.float()).all()
    torch.testing.assert_close(loss, expected)


def test_rejects_inputs_that_are_not_both_views():
    x = torch.randn(6, 8)
    with pytest.raises(ValueError, match="even number of rows >= 2, got 5"):
        simsiam_loss(x[:5], x[:5])
    with pytest.raises(ValueError, match="queries must be a torch.Tensor"):
        SimSiamLoss()(None, x)


# --- multi-crop ------------------------------------------------------------------------------


def multi_view_simsiam_reference(queries, keys):
    """``mean_{(g, v), v != g} mean_i D(p_vi, stopgrad(z_gi))`` as loops in float64: the prediction of every
    view v against the projection of each global view g but its own."""
    n = len(keys) // 2
    views = len(queries) // n
    p, z = queries.double(), keys.double().detach()

    def D(p, z):
        return -sum(p[j] * z[j] for j in range(len(p))) / (p.norm() * z.norm())

    pairs = [
        torch.stack([D(p[v * n + i], z[g * n + i]) for i in range(n)]).mean()
        for g in range(2)
        for v in range(views)
        if v != g
    ]
    return torch.stack(pairs).mean()


@pytest.mark.parametrize("views,n", [(3, 1), (4, 5)])
def test_multi_view_matches_reference_value_and_gradient(views, n):
    g = torch.Generator().manual_seed(10 * views + n)
    queries = torch.randn(views * n, 8, generator=g, dtype=torch.float64)
    keys = torch.randn(2 * n, 8, generator=g, dtype=torch.float64)
    ours = value_and_grads(multi_view_simsiam_loss, queries, keys)
    ref = value_and_grads(multi_view_simsiam_reference, queries, keys)
    torch.testing.assert_close(ours[:2], ref[:2], rtol=1e-10, atol=1e-12)
    assert ours[2] is None  # the stop-gradient


def test_multi_view_of_the_two_global_views_is_the_two_view_loss_exactly():
    queries, keys = torch.randn(2, 10, 6, dtype=torch.float64)
    ours = value_and_grads(SimSiamLoss().multi_view, queries, keys)
    two_view = value_and_grads(simsiam_loss, queries, keys)
    assert torch.equal(ours[0], two_view[0]) and torch.equal(ours[1], two_view[1])
