"""MoCo v3's loss: value and gradient against a loop written from Algorithm 1 of the paper, in two
real processes against one, and under bf16 autocast."""

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import value_and_grads

from sslkit.losses import build
from sslkit.losses.mocov3 import MoCoV3Loss, mocov3_loss, multi_view_mocov3_loss


def mocov3_reference(queries, keys, temperature):
    """``ctr(q1, k2) + ctr(q2, k1)``, ``ctr(q, k) = 2 T mean_i -log(exp(q_i.k_i / T) / sum_j exp(q_i.k_j / T))``.

    MoCo v3, Algorithm 1, as plain Python loops in float64; the keys are constants (``k.detach()``).
    """
    q = F.normalize(queries.double(), dim=1)
    k = F.normalize(keys.double().detach(), dim=1)
    n = len(q) // 2

    def ctr(q, k):
        terms = []
        for i in range(n):
            denominator = sum(torch.exp(q[i] @ k[j] / temperature) for j in range(n))
            terms.append(-torch.log(torch.exp(q[i] @ k[i] / temperature) / denominator))
        return 2 * temperature * torch.stack(terms).mean()

    return ctr(q[:n], k[n:]) + ctr(q[n:], k[:n])


@pytest.mark.parametrize("n,d", [(1, 3), (4, 8), (7, 16)])
@pytest.mark.parametrize("temperature", [0.05, 0.2, 1.0])
def test_matches_reference_value_and_gradient(n, d, temperature):
    g = torch.Generator().manual_seed(n * 100 + d)
    queries, keys = torch.randn(2, 2 * n, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(mocov3_loss, queries, keys, temperature=temperature)
    ref = value_and_grads(mocov3_reference, queries, keys, temperature=temperature)
    for a, b in zip(ours[:2], ref[:2]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert ours[2] is None and ref[2] is None  # no gradient reaches the keys


def test_two_t_scale_makes_it_cross_entropy_at_one_half():
    """At T = 0.5 the 2T factor is 1: each ctr is plain cross-entropy over the cosines / T."""
    g = torch.Generator().manual_seed(0)
    q, k = F.normalize(torch.randn(2, 10, 8, generator=g, dtype=torch.float64), dim=2)
    target = torch.arange(5)
    expected = F.cross_entropy(q[:5] @ k[5:].T / 0.5, target) + F.cross_entropy(q[5:] @ k[:5].T / 0.5, target)
    torch.testing.assert_close(mocov3_loss(q, k, temperature=0.5), expected)


def test_module_and_registry_give_the_function():
    g = torch.Generator().manual_seed(1)
    queries, keys = torch.randn(2, 8, 4, generator=g)
    loss_fn = build("mocov3", temperature=0.3)
    assert isinstance(loss_fn, MoCoV3Loss) and repr(loss_fn) == "MoCoV3Loss(temperature=0.3, gather_distributed=True)"
    torch.testing.assert_close(loss_fn(queries, keys), mocov3_loss(queries, keys, 0.3))
    # One process: gathering or not is the same loss.
    torch.testing.assert_close(MoCoV3Loss(0.3, gather_distributed=False)(queries, keys), loss_fn(queries, keys))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    g = torch.Generator().manual_seed(2)
    queries, keys = torch.randn(2, 16, 32, generator=g)
    expected = mocov3_loss(queries.to(dtype).float(), keys.to(dtype).float())
    half = queries.to(dtype).requires_grad_(True)
    with torch.autocast("cpu", dtype=dtype):
        loss = mocov3_loss(half, keys.to(dtype))
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(half.grad.float()).all()
    torch.testing.assert_close(loss, expected)


def test_rejects_inputs_that_are_not_both_views():
    x = torch.randn(6, 8)
    with pytest.raises(ValueError, match="even number of rows >= 2, got 5"):
        mocov3_loss(x[:5], x[:5])
    with pytest.raises(ValueError, match=r"same shape, got \(6, 8\) and \(4, 8\)"):
        mocov3_loss(x, x[:4])
    with pytest.raises(ValueError, match="keys must be a torch.Tensor"):
        mocov3_loss(x, None)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        MoCoV3Loss(temperature=0.0)


def _queries_and_keys():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(2, 16, 5, generator=generator, dtype=torch.float64)  # [view 1; view 2] of 8 images


def _rank_share(t, rank):
    """Rank ``rank``'s 4 of the 8 images, both views: rows [4r, 4r + 4) of each view."""
    return torch.cat([t[4 * rank : 4 * rank + 4], t[8 + 4 * rank : 8 + 4 * rank + 4]])


def _multi_view_queries():
    """Queries of 4 views (2 global, 2 local) of the 8 images, view by view."""
    return torch.randn(4 * 8, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _multi_view_rank_share(t, rank):
    """Rank ``rank``'s 4 of the 8 images, every one of the 4 views."""
    return torch.cat([t[8 * v + 4 * rank : 8 * v + 4 * rank + 4] for v in range(4)])


def _two_process_loss(rank: int, world: int) -> dict:
    """Both views, then multi-crop's four (one spawn for both)."""
    queries, keys = _queries_and_keys()
    results = {}
    for name, loss_fn, share in [
        ("two_view", mocov3_loss, _rank_share(queries, rank)),
        ("multi_view", multi_view_mocov3_loss, _multi_view_rank_share(_multi_view_queries(), rank)),
    ]:
        local = share.clone().requires_grad_(True)
        loss = loss_fn(local, _rank_share(keys, rank), temperature=0.3)
        loss.backward()
        results[name] = {"loss": loss.detach(), "grad": local.grad}
    return results


@pytest.fixture(scope="module")
def two_process_results() -> list:
    return run_in_processes(_two_process_loss)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["two_view", "multi_view"])
def test_two_processes_match_one_process(two_process_results, name):
    """Each process contrasts its queries (of every view, multi-view) with every process's keys: the
    mean of the processes' losses is the 1-process loss, and each one's gradient is world_size x its
    share of the 1-process gradient (DDP's mean divides it out)."""
    results = [r[name] for r in two_process_results]
    queries, keys = _queries_and_keys()
    loss_fn, share = mocov3_loss, _rank_share
    if name == "multi_view":
        queries, loss_fn, share = _multi_view_queries(), multi_view_mocov3_loss, _multi_view_rank_share
    queries.requires_grad_(True)
    full = loss_fn(queries, keys, temperature=0.3)
    full.backward()
    torch.testing.assert_close((results[0]["loss"] + results[1]["loss"]) / 2, full.detach())
    for rank in range(2):
        torch.testing.assert_close(results[rank]["grad"], 2 * share(queries.grad, rank))


# --- multi-crop ------------------------------------------------------------------------------


def multi_view_mocov3_reference(queries, keys, temperature):
    """``2 mean_{(g, v), v != g} ctr(q_v, k_g)`` as loops in float64: the queries of every view v against the
    keys of each global view g but its own, the other images' keys of view g the negatives."""
    n = len(keys) // 2
    views = len(queries) // n
    q = F.normalize(queries.double(), dim=1)
    k = F.normalize(keys.double().detach(), dim=1)

    def ctr(v, g):
        terms = []
        for i in range(n):
            denominator = sum(torch.exp(q[v * n + i] @ k[g * n + j] / temperature) for j in range(n))
            terms.append(-torch.log(torch.exp(q[v * n + i] @ k[g * n + i] / temperature) / denominator))
        return 2 * temperature * torch.stack(terms).mean()

    return 2 * torch.stack([ctr(v, g) for g in range(2) for v in range(views) if v != g]).mean()


@pytest.mark.parametrize("views,n", [(3, 1), (4, 5)])
@pytest.mark.parametrize("temperature", [0.1, 1.0])
def test_multi_view_matches_reference_value_and_gradient(views, n, temperature):
    g = torch.Generator().manual_seed(10 * views + n)
    queries = torch.randn(views * n, 8, generator=g, dtype=torch.float64)
    keys = torch.randn(2 * n, 8, generator=g, dtype=torch.float64)
    ours = value_and_grads(multi_view_mocov3_loss, queries, keys, temperature=temperature)
    ref = value_and_grads(multi_view_mocov3_reference, queries, keys, temperature=temperature)
    torch.testing.assert_close(ours[:2], ref[:2], rtol=1e-10, atol=1e-12)
    assert ours[2] is None  # no gradient reaches the keys


def test_multi_view_of_the_two_global_views_is_the_two_view_loss_exactly():
    queries, keys = torch.randn(2, 10, 6, dtype=torch.float64)
    ours = value_and_grads(MoCoV3Loss(0.3).multi_view, queries, keys)
    two_view = value_and_grads(mocov3_loss, queries, keys, temperature=0.3)
    assert torch.equal(ours[0], two_view[0]) and torch.equal(ours[1], two_view[1])
