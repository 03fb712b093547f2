"""BYOL's loss: value and gradient against a loop written from eq. 2 of Grill et al. 2020, against
lightly's negative cosine up to the documented scale, and under fp16/bf16 autocast."""

import pytest
import torch
from loss_utils import value_and_grads

from sslkit.losses import build
from sslkit.losses.byol import BYOLLoss, byol_loss, multi_view_byol_loss
from sslkit.losses.simsiam import simsiam_loss


def byol_reference(queries, keys):
    """``L + L~``, ``L = mean_i ||q_i / ||q_i|| - z'_i / ||z'_i|| ||^2`` (eq. 2), as loops in float64.

    ``q`` the prediction of one view, ``z'`` the target of the other; the targets are constants.
    """
    n = len(queries) // 2
    q, z = queries.double(), keys.double().detach()

    def direction(predictions, targets):
        terms = []
        for i in range(n):
            difference = predictions[i] / predictions[i].norm() - targets[i] / targets[i].norm()
            terms.append(sum(difference[j] ** 2 for j in range(len(difference))))
        return torch.stack(terms).mean()

    return direction(q[:n], z[n:]) + direction(q[n:], z[:n])


@pytest.mark.parametrize("n,d", [(1, 3), (4, 8), (7, 16)])
def test_matches_reference_value_and_gradient(n, d):
    g = torch.Generator().manual_seed(n * 100 + d)
    queries, keys = torch.randn(2, 2 * n, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(byol_loss, queries, keys)
    ref = value_and_grads(byol_reference, queries, keys)
    torch.testing.assert_close(ours[:2], ref[:2], rtol=1e-10, atol=1e-12)
    assert ours[2] is None and ref[2] is None  # no gradient reaches the targets


def test_matches_lightly_up_to_the_documented_scale():
    """lightly's BYOL example trains ``(NegativeCosineSimilarity(p1, z2) + NegativeCosineSimilarity(p2, z1)) / 2``:
    the paper's sum of normalised MSEs is ``4 + 4 x`` that, with 4 times its gradient."""
    negative_cosine = pytest.importorskip("lightly.loss").NegativeCosineSimilarity()
    g = torch.Generator().manual_seed(3)
    queries, keys = torch.randn(2, 16, 32, generator=g, dtype=torch.float64)

    def lightly_example(q, k):
        p1, p2 = q.chunk(2)
        z1, z2 = k.detach().chunk(2)
        return 0.5 * (negative_cosine(p1, z2) + negative_cosine(p2, z1))

    ours = value_and_grads(byol_loss, queries, keys)
    theirs = value_and_grads(lightly_example, queries, keys)
    torch.testing.assert_close(ours[0], 4 + 4 * theirs[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours[1], 4 * theirs[1], rtol=1e-10, atol=1e-12)


def test_is_four_plus_four_times_simsiam():
    # 2 - 2 cos summed over the two directions against -cos averaged over them: the same cosines.
    queries, keys = torch.randn(2, 10, 6, dtype=torch.float64)
    torch.testing.assert_close(byol_loss(queries, keys), 4 + 4 * simsiam_loss(queries, keys))


def test_zero_for_aligned_views_and_eight_for_opposite_ones():
    z = torch.randn(6, 5, dtype=torch.float64)
    swapped = z.roll(3, dims=0)  # each query's other-view key is its own direction
    assert byol_loss(z, 2.5 * swapped).item() == pytest.approx(0.0, abs=1e-12)
    assert byol_loss(z, -swapped).item() == pytest.approx(8.0)


def test_order_and_scale_invariant():
    queries, keys = torch.randn(2, 12, 8, dtype=torch.float64)
    perm = torch.randperm(6)
    both = torch.cat([perm, perm + 6])  # the same images reordered in both views
    base = byol_loss(queries, keys)
    torch.testing.assert_close(base, byol_loss(queries[both], keys[both]))
    torch.testing.assert_close(base, byol_loss(3 * queries, 0.1 * keys))


def test_module_and_registry_give_the_function():
    queries, keys = torch.randn(2, 8, 4)
    loss_fn = build("byol")
    assert isinstance(loss_fn, BYOLLoss) and repr(loss_fn) == "BYOLLoss()"
    torch.testing.assert_close(loss_fn(queries, keys), byol_loss(queries, keys))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    g = torch.Generator().manual_seed(2)
    queries, keys = torch.randn(2, 16, 32, generator=g)
    expected = byol_loss(queries.to(dtype).float(), keys.to(dtype).float())
    half = queries.to(dtype).requires_grad_(True)
    with torch.autocast("cpu", dtype=dtype):
        loss = byol_loss(half, keys.to(dtype))
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(half.grad.float()).all()
    torch.testing.assert_close(loss, expected)


def test_rejects_inputs_that_are_not_both_views():
    x = torch.randn(6, 8)
    with pytest.raises(ValueError, match="even number of rows >= 2, got 5"):
        byol_loss(x[:5], x[:5])
    with pytest.raises(ValueError, match=r"same shape, got \(6, 8\) and \(4, 8\)"):
        BYOLLoss()(x, x[:4])


# --- multi-crop ------------------------------------------------------------------------------


def multi_view_byol_reference(queries, keys):
    """``2 mean_{(g, v), v != g} mean_i ||q_vi / ||q_vi|| - z'_gi / ||z'_gi|| ||^2`` as loops in float64:
    the prediction of every view v against the target of each global view g but its own."""
    n = len(keys) // 2
    views = len(queries) // n
    q, z = queries.double(), keys.double().detach()
    pairs = []
    for g in range(2):
        for v in range(views):
            if v != g:
                terms = []
                for i in range(n):
                    difference = q[v * n + i] / q[v * n + i].norm() - z[g * n + i] / z[g * n + i].norm()
                    terms.append(sum(difference[j] ** 2 for j in range(len(difference))))
                pairs.append(torch.stack(terms).mean())
    return 2 * torch.stack(pairs).mean()


@pytest.mark.parametrize("views,n", [(3, 1), (4, 5)])
def test_multi_view_matches_reference_value_and_gradient(views, n):
    g = torch.Generator().manual_seed(10 * views + n)
    queries = torch.randn(views * n, 8, generator=g, dtype=torch.float64)
    keys = torch.randn(2 * n, 8, generator=g, dtype=torch.float64)
    ours = value_and_grads(multi_view_byol_loss, queries, keys)
    ref = value_and_grads(multi_view_byol_reference, queries, keys)
    torch.testing.assert_close(ours[:2], ref[:2], rtol=1e-10, atol=1e-12)
    assert ours[2] is None  # no gradient reaches the targets


def test_multi_view_of_the_two_global_views_is_the_two_view_loss_exactly():
    queries, keys = torch.randn(2, 10, 6, dtype=torch.float64)
    ours, two_view = value_and_grads(BYOLLoss().multi_view, queries, keys), value_and_grads(byol_loss, queries, keys)
    assert torch.equal(ours[0], two_view[0]) and torch.equal(ours[1], two_view[1])


def test_multi_view_rejects_queries_that_are_not_every_view_of_the_keys_images():
    with pytest.raises(ValueError, match=r"a multiple of 3 rows, at least 6, got 7"):
        multi_view_byol_loss(torch.randn(7, 4), torch.randn(6, 4))
    with pytest.raises(ValueError, match="keys must hold the two global views"):
        multi_view_byol_loss(torch.randn(9, 4), torch.randn(3, 4))
