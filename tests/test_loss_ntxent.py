"""NT-Xent: value and gradient against a loop written from SimCLR eq. 1, against lightly and
pytorch-metric-learning, across two real processes, and under fp16/bf16 autocast."""

import math

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import (
    assert_processes_match_one_process,
    emulated_processes,
    rank_slice,
    two_view_worker,
    two_views_under_autocast,
    value_and_grads,
)

from sslkit.losses.ntxent import NTXentLoss, multi_view_infonce_loss, multi_view_ntxent_loss, ntxent_loss


def ntxent_reference(z1, z2, temperature, negatives=None):
    """SimCLR eq. 1 (or MoCo eq. 1 with a bank) as plain Python loops, float64."""
    z1 = F.normalize(z1.double(), dim=1)
    z2 = F.normalize(z2.double(), dim=1)
    if negatives is not None:
        bank = F.normalize(negatives.double(), dim=1)
        losses = []
        for i in range(len(z1)):
            pos = torch.exp(z1[i] @ z2[i] / temperature)
            neg = sum(torch.exp(z1[i] @ bank[j] / temperature) for j in range(len(bank)))
            losses.append(-torch.log(pos / (pos + neg)))
        return torch.stack(losses).mean()
    z = torch.cat([z1, z2])
    n = len(z1)
    losses = []
    for i in range(2 * n):
        p = (i + n) % (2 * n)
        denominator = sum(torch.exp(z[i] @ z[k] / temperature) for k in range(2 * n) if k != i)
        losses.append(-torch.log(torch.exp(z[i] @ z[p] / temperature) / denominator))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d", [(1, 3), (4, 8), (7, 16)])
@pytest.mark.parametrize("temperature", [0.05, 0.2, 1.0])
def test_matches_reference_value_and_gradient(n, d, temperature):
    g = torch.Generator().manual_seed(n * 100 + d)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = torch.randn(n, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(ntxent_loss, z1, z2, temperature=temperature)
    ref = value_and_grads(ntxent_reference, z1, z2, temperature=temperature)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def multi_view_reference(views, temperature):
    """NT-Xent over V views as loops, float64: anchor (v, i) against the other V - 1 views of image i
    (positives, each in its own term), every other row of the batch in the denominator."""
    z = [F.normalize(view.double(), dim=1) for view in views]
    rows = [(v, i) for v in range(len(z)) for i in range(len(z[0]))]
    losses = []
    for v, i in rows:
        denominator = sum(torch.exp(z[v][i] @ z[w][k] / temperature) for w, k in rows if (w, k) != (v, i))
        positives = [
            torch.log(torch.exp(z[v][i] @ z[w][i] / temperature) / denominator) for w in range(len(z)) if w != v
        ]
        losses.append(-torch.stack(positives).mean())
    return torch.stack(losses).mean()


@pytest.mark.parametrize("views,n", [(3, 1), (4, 5), (8, 3)])  # 8: 2 global and 6 local views
def test_multi_view_matches_reference_value_and_gradient(views, n):
    g = torch.Generator().manual_seed(views * 10 + n)
    z = list(torch.randn(views, n, 6, generator=g, dtype=torch.float64))
    ours = value_and_grads(lambda *z: multi_view_ntxent_loss(z, 0.2), *z)
    ref = value_and_grads(lambda *z: multi_view_reference(z, 0.2), *z)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_multi_view_of_two_views_is_ntxent():
    z1, z2 = torch.randn(2, 6, 8, dtype=torch.float64)
    for a, b in zip(value_and_grads(ntxent_loss, z1, z2, 0.3), value_and_grads(NTXentLoss(0.3).multi_view, z1, z2)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("k", [1, 5])
def test_bank_matches_moco_reference(k):
    g = torch.Generator().manual_seed(k)
    z1, z2 = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    bank = torch.randn(k, 8, generator=g, dtype=torch.float64)
    ours = value_and_grads(ntxent_loss, z1, z2, temperature=0.1, negatives=bank)
    ref = value_and_grads(ntxent_reference, z1, z2, temperature=0.1, negatives=bank)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_identical_embeddings_give_log_2n_minus_1():
    z = torch.randn(1, 16).repeat(10, 1)
    assert ntxent_loss(z, z.clone(), temperature=0.3).item() == pytest.approx(math.log(2 * 10 - 1), rel=1e-5)


def test_symmetric_and_order_invariant():
    z1, z2 = torch.randn(2, 12, 32, dtype=torch.float64)
    perm = torch.randperm(12)
    base = ntxent_loss(z1, z2, 0.2)
    torch.testing.assert_close(base, ntxent_loss(z2, z1, 0.2))
    torch.testing.assert_close(base, ntxent_loss(z1[perm], z2[perm], 0.2))


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_matches_lightly(temperature):
    lightly_loss = pytest.importorskip("lightly.loss").NTXentLoss
    z1, z2 = torch.randn(2, 16, 32, dtype=torch.float64)
    ours = value_and_grads(ntxent_loss, z1, z2, temperature=temperature)
    theirs = value_and_grads(lightly_loss(temperature=temperature), z1, z2)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_matches_pytorch_metric_learning():
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    z1, z2 = torch.randn(2, 10, 16, dtype=torch.float64)
    labels = torch.arange(10).repeat(2)
    ours = value_and_grads(ntxent_loss, z1, z2, temperature=0.2)
    theirs = value_and_grads(lambda a, b: pml.NTXentLoss(temperature=0.2)(torch.cat([a, b]), labels), z1, z2)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    z1, z2 = torch.randn(2, 64, 32)
    expected = ntxent_loss(z1, z2, 0.05)
    got, _ = two_views_under_autocast(ntxent_loss, dtype, z1, z2, requires_grad=False, temperature=0.05)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    # the only error left is the embeddings' own rounding to half precision
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan")])
def test_rejects_bad_temperature(bad):
    with pytest.raises(ValueError, match="temperature"):
        NTXentLoss(temperature=bad)


def test_rejects_mismatched_views():
    with pytest.raises(ValueError, match="z1 and z2"):
        ntxent_loss(torch.randn(4, 8), torch.randn(5, 8))
    with pytest.raises(ValueError, match="negatives"):
        ntxent_loss(torch.randn(4, 8), torch.randn(4, 8), negatives=torch.randn(3, 7))


def multi_view_infonce_reference(queries, keys, negatives, temperature):
    """MoCo's eq. 1 for multi-crop as loops, float64: the mean over the pairs (global view g, view v != g) of
    ``-log(exp(q_vi.k_gi / T) / (exp(q_vi.k_gi / T) + sum_j exp(q_vi.n_j / T)))`` averaged over the images."""
    n = len(keys) // 2
    views = len(queries) // n
    q, k = F.normalize(queries.double(), dim=1), F.normalize(keys.double().detach(), dim=1)
    bank = F.normalize(negatives.double(), dim=1)
    pairs = []
    for g in range(2):
        for v in range(views):
            if v == g:
                continue
            terms = []
            for i in range(n):
                pos = torch.exp(q[v * n + i] @ k[g * n + i] / temperature)
                neg = sum(torch.exp(q[v * n + i] @ bank[j] / temperature) for j in range(len(bank)))
                terms.append(-torch.log(pos / (pos + neg)))
            pairs.append(torch.stack(terms).mean())
    return torch.stack(pairs).mean()


@pytest.mark.parametrize("views,n", [(3, 1), (4, 5)])
def test_multi_view_infonce_matches_reference_value_and_gradient(views, n):
    g = torch.Generator().manual_seed(10 * views + n)
    queries = torch.randn(views * n, 8, generator=g, dtype=torch.float64)
    keys, bank = torch.randn(2 * n, 8, generator=g, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    ours = value_and_grads(multi_view_infonce_loss, queries, keys, negatives=bank, temperature=0.2)
    ref = value_and_grads(multi_view_infonce_reference, queries, keys, negatives=bank, temperature=0.2)
    torch.testing.assert_close(ours[:2], ref[:2], rtol=1e-10, atol=1e-12)


def test_multi_view_infonce_of_the_two_global_views_is_mocos_symmetric_loss_exactly():
    """``[q1; q2]`` against ``[k2; k1]`` and the bank: what MoCo computes for two views."""
    queries, keys = torch.randn(2, 10, 6, dtype=torch.float64)
    bank = torch.randn(7, 6, dtype=torch.float64)
    ours = value_and_grads(multi_view_infonce_loss, queries, keys, bank, 0.2)
    two_view = value_and_grads(ntxent_loss, queries, keys.roll(5, dims=0), 0.2, bank)
    assert torch.equal(ours[0], two_view[0]) and torch.equal(ours[1], two_view[1])
    with pytest.raises(ValueError, match="negatives must be a torch.Tensor"):
        multi_view_infonce_loss(queries, keys, None)


def two_and_multi_view_worker(rank, world, z1, z2, views):
    """The two-view loss, then the multi-view one, in the same processes (one spawn for both)."""
    local = [rank_slice(view, rank, world).clone().requires_grad_(True) for view in views]
    loss = multi_view_ntxent_loss(local, 0.3)
    loss.backward()
    two_view = two_view_worker(rank, world, NTXentLoss, [(z1, z2, None, dict(temperature=0.3))])[0]
    return two_view, (loss.detach(), *(view.grad for view in local))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    """Two views, and three (multi-view): there image i of one process and image i of the other are
    different images, negatives of each other."""
    z1, z2 = torch.randn(2, 8, 16, dtype=torch.float64)
    views = list(torch.randn(3, 8, 16, dtype=torch.float64))
    results = run_in_processes(two_and_multi_view_worker, z1, z2, views)
    assert_processes_match_one_process([r[0] for r in results], value_and_grads(ntxent_loss, z1, z2, temperature=0.3))
    expected = value_and_grads(lambda *z: multi_view_ntxent_loss(z, 0.3), *views)
    assert_processes_match_one_process([r[1] for r in results], expected)


# --- the fused forward/backward (sslkit/losses/_fused.py) -----------------------------------


@pytest.mark.parametrize("negatives", [False, True])
@pytest.mark.parametrize("temperature", [0.5, 0.001])  # 1/T = 1000 > 600: the row-max branch in float64
def test_gradcheck(negatives, temperature):
    g = torch.Generator().manual_seed(3)
    z1, z2 = (torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    bank = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True) if negatives else None
    inputs = (z1, z2) if bank is None else (z1, z2, bank)
    assert torch.autograd.gradcheck(lambda *x: ntxent_loss(*x[:2], temperature, *x[2:]), inputs)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("temperature", [0.3, 0.001])
def test_emulated_processes_match_one_process(monkeypatch, world, temperature):
    # The cross-process path of the fused function (separate candidates, offsets, the row-max
    # branch at 1/T > 600 in float64) without spawning: see loss_utils.emulated_processes.
    g = torch.Generator().manual_seed(world)
    z1, z2 = torch.randn(2, 2 * world, 8, generator=g, dtype=torch.float64)
    expected = value_and_grads(ntxent_loss, z1, z2, temperature=temperature)
    got = emulated_processes(monkeypatch, lambda a, b: ntxent_loss(a, b, temperature), z1, z2, world)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("temperature", [1 / 60, 0.01, 0.002])
@pytest.mark.parametrize("negatives", [False, True])
def test_low_temperature_float32_matches_float64(temperature, negatives):
    # 1/T = 60 is the last temperature without a row shift in fp32 (exp(+-60) are normal
    # numbers); 0.01 and 0.002 take the row-max branch. Rows 0 and 1 are near-duplicates, so
    # without the shift exp(1/T) would overflow at 0.002.
    g = torch.Generator().manual_seed(5)
    z1, z2, bank = torch.randn(3, 16, 8, generator=g, dtype=torch.float64)
    z1[1] = z1[0] + 1e-3 * z2[0]
    bank = bank if negatives else None
    expected = value_and_grads(ntxent_loss, z1, z2, temperature=temperature, negatives=bank)
    got = value_and_grads(
        ntxent_loss, z1.float(), z2.float(), temperature=temperature, negatives=None if bank is None else bank.float()
    )
    for a, b in zip(got, expected):
        assert torch.isfinite(a).all()
        # fp32 logits carry ~1e-7 * 1/T absolute error: scale the tolerance with 1/T
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-6 / temperature)


def test_backward_twice_with_retain_graph_gives_the_same_gradient():
    # The backward edits the saved exp matrix in place and must leave it as it found it.
    z1, z2 = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    loss = ntxent_loss(z1, z2, 0.2)
    first = torch.autograd.grad(loss, (z1, z2), retain_graph=True)
    second = torch.autograd.grad(loss, (z1, z2))
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
