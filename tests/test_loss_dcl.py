"""DCL: value and gradient against a loop written from eq. 6 of Yeh et al. 2021, against lightly,
across two real processes, and under fp16/bf16 autocast."""

import math

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import (
    HALF_RTOL,
    assert_processes_match_one_process,
    emulated_processes,
    two_view_worker,
    two_views_under_autocast,
    value_and_grads,
)

from sslkit.losses.dcl import DCLLoss, dcl_loss
from sslkit.losses.ntxent import ntxent_loss


def dcl_reference(z1, z2, temperature, negatives=None, weights=None):
    """DCL eq. 6 (mean over the 2N anchors), or one direction against a bank, as plain loops in float64."""
    z1 = F.normalize(z1.double(), dim=1)
    z2 = F.normalize(z2.double(), dim=1)
    n = len(z1)
    w = [1.0] * n if weights is None else weights
    if negatives is not None:
        bank = F.normalize(negatives.double(), dim=1)
        losses = []
        for i in range(n):
            denominator = sum(torch.exp(z1[i] @ bank[j] / temperature) for j in range(len(bank)))
            losses.append(-w[i] * (z1[i] @ z2[i]) / temperature + torch.log(denominator))
        return torch.stack(losses).mean()
    views = (z1, z2)
    losses = []
    for k in range(2):
        for i in range(n):
            anchor = views[k][i]
            denominator = sum(
                torch.exp(anchor @ views[v][j] / temperature) for v in range(2) for j in range(n) if j != i
            )
            losses.append(-w[i] * (z1[i] @ z2[i]) / temperature + torch.log(denominator))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d", [(2, 3), (4, 8), (7, 16)])
@pytest.mark.parametrize("temperature", [0.05, 0.2, 1.0])
def test_matches_reference_value_and_gradient(n, d, temperature):
    g = torch.Generator().manual_seed(n * 100 + d)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = torch.randn(n, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(dcl_loss, z1, z2, temperature=temperature)
    ref = value_and_grads(dcl_reference, z1, z2, temperature=temperature)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n,k", [(1, 1), (6, 5)])
def test_bank_matches_reference(n, k):
    g = torch.Generator().manual_seed(k)
    z1, z2 = torch.randn(2, n, 8, generator=g, dtype=torch.float64)
    bank = torch.randn(k, 8, generator=g, dtype=torch.float64)
    ours = value_and_grads(dcl_loss, z1, z2, temperature=0.1, negatives=bank)
    ref = value_and_grads(dcl_reference, z1, z2, temperature=0.1, negatives=bank)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_positive_weight_scales_only_the_positive_term():
    z1, z2 = torch.randn(2, 5, 8, dtype=torch.float64)
    w = torch.tensor([0.5, 1.5, 1.0, 2.0, 0.0], dtype=torch.float64)
    ours = value_and_grads(dcl_loss, z1, z2, temperature=0.2, positive_weight=w)
    ref = value_and_grads(dcl_reference, z1, z2, temperature=0.2, weights=w.tolist())
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_identical_embeddings_give_log_2n_minus_2():
    # Every similarity is 1: -1/T + log((2N - 2) e^{1/T}) = log(2N - 2).
    z = torch.randn(1, 16).repeat(10, 1)
    assert dcl_loss(z, z.clone(), temperature=0.3).item() == pytest.approx(math.log(2 * 10 - 2), rel=1e-5)


def test_is_ntxent_without_the_positive_in_the_denominator():
    # Per anchor, DCL = NT-Xent + log(1 - p_i), p_i the softmax probability of the positive; so DCL < NT-Xent.
    z1, z2 = torch.randn(2, 6, 8, dtype=torch.float64)
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = z @ z.T / 0.2
    logits.fill_diagonal_(float("-inf"))
    p = logits.softmax(dim=1)[torch.arange(12), (torch.arange(12) + 6) % 12]
    torch.testing.assert_close(dcl_loss(z1, z2, 0.2), ntxent_loss(z1, z2, 0.2) + torch.log1p(-p).mean())


def test_symmetric_and_order_invariant():
    z1, z2 = torch.randn(2, 12, 32, dtype=torch.float64)
    perm = torch.randperm(12)
    base = dcl_loss(z1, z2, 0.2)
    torch.testing.assert_close(base, dcl_loss(z2, z1, 0.2))
    torch.testing.assert_close(base, dcl_loss(z1[perm], z2[perm], 0.2))


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_matches_lightly(temperature):
    # lightly averages the two view directions, each a mean over N anchors: the same mean over 2N.
    lightly_loss = pytest.importorskip("lightly.loss").DCLLoss
    z1, z2 = torch.randn(2, 16, 32, dtype=torch.float64)
    ours = value_and_grads(dcl_loss, z1, z2, temperature=temperature)
    theirs = value_and_grads(lightly_loss(temperature=temperature), z1, z2)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_bank", [False, True])
def test_half_precision_autocast_is_finite_and_close(dtype, with_bank):
    z1, z2, bank = torch.randn(3, 64, 32)
    bank = bank if with_bank else None
    expected = dcl_loss(z1, z2, 0.05, negatives=bank)
    got, halves = two_views_under_autocast(dcl_loss, dtype, z1, z2, bank, temperature=0.05)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    # The only error left is the embeddings' own rounding to half precision (see HALF_RTOL).
    torch.testing.assert_close(got, expected, rtol=HALF_RTOL[dtype], atol=0)
    got.backward()
    assert all(torch.isfinite(x.grad).all() for x in halves)


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_rejects_bad_temperature(bad):
    with pytest.raises(ValueError, match="temperature"):
        DCLLoss(temperature=bad)


def test_rejects_bad_inputs():
    loss_fn = DCLLoss()
    with pytest.raises(ValueError, match="z1 and z2"):
        loss_fn(torch.randn(4, 8), torch.randn(5, 8))
    with pytest.raises(ValueError, match="z1 and z2"):
        loss_fn(torch.randn(4, 8), torch.randn(4, 7))
    with pytest.raises(ValueError, match="negatives"):
        loss_fn(torch.randn(4, 8), torch.randn(4, 8), negatives=torch.randn(3, 7))
    with pytest.raises(ValueError, match="negatives"):
        loss_fn(torch.randn(4, 8), torch.randn(4, 8), negatives=torch.randn(0, 8))
    # one image has no negative at all: the denominator would be empty
    with pytest.raises(ValueError, match="at least 2"):
        loss_fn(torch.randn(1, 8), torch.randn(1, 8))
    with pytest.raises(ValueError, match="positive_weight"):
        dcl_loss(torch.randn(4, 8), torch.randn(4, 8), positive_weight=torch.ones(3))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    # n = 1 per process is valid: the negatives come from the other process.
    bank = torch.randn(5, 16, dtype=torch.float64)
    cases = [
        (*torch.randn(2, 2 * n, 16, dtype=torch.float64), negatives, dict(temperature=0.3))
        for n in (1, 4)
        for negatives in (None, bank)
    ]
    results = run_in_processes(two_view_worker, DCLLoss, cases)  # one spawn for all cases: it is the slow part
    for c, (z1, z2, negatives, _) in enumerate(cases):
        expected = value_and_grads(dcl_loss, z1, z2, temperature=0.3, negatives=negatives)
        assert_processes_match_one_process([r[c] for r in results], expected)


# --- the fused forward/backward (sslkit/losses/_fused.py) -----------------------------------


@pytest.mark.parametrize("negatives", [False, True])
@pytest.mark.parametrize("temperature", [0.5, 0.001])  # 1/T = 1000 > 600: the row-max branch in float64
def test_gradcheck(negatives, temperature):
    # positive_weight requires grad here, so its gradient is checked too
    g = torch.Generator().manual_seed(4)
    z1, z2 = (torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w = torch.rand(5, generator=g, dtype=torch.float64, requires_grad=True)
    bank = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True) if negatives else None
    inputs = (z1, z2, w) if bank is None else (z1, z2, w, bank)

    def loss(z1, z2, w, bank=None):
        return dcl_loss(z1, z2, temperature, negatives=bank, positive_weight=w)

    assert torch.autograd.gradcheck(loss, inputs)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("temperature", [0.3, 0.001])
@pytest.mark.parametrize("weighted", [False, True])
def test_emulated_processes_match_one_process(monkeypatch, world, temperature, weighted):
    # The cross-process path of the fused function (separate candidates, offsets for self and
    # positive, the row-max branch at 1/T > 600 in float64) without spawning.
    from sslkit import distributed

    g = torch.Generator().manual_seed(world)
    z1, z2 = torch.randn(2, 2 * world, 8, generator=g, dtype=torch.float64)
    w = torch.rand(2 * world, generator=g, dtype=torch.float64) * 2 if weighted else None
    expected = value_and_grads(dcl_loss, z1, z2, temperature=temperature, positive_weight=w)

    def local_loss(a, b):
        local_w = None if w is None else w.chunk(world)[distributed.rank()]
        return dcl_loss(a, b, temperature, positive_weight=local_w)

    got = emulated_processes(monkeypatch, local_loss, z1, z2, world)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("temperature", [1 / 60, 0.01, 0.002])
@pytest.mark.parametrize("negatives", [False, True])
def test_low_temperature_float32_matches_float64(temperature, negatives):
    # 1/T = 60 is the last temperature without a row shift in fp32; 0.01 and 0.002 take the
    # row-max branch. The views are near-duplicates: a row max taken over the (left-out)
    # positive would push every negative of a row to exp(-hundreds) = 0 and the loss to inf.
    g = torch.Generator().manual_seed(6)
    z1, noise, bank = torch.randn(3, 16, 8, generator=g, dtype=torch.float64)
    z2 = z1 + 1e-3 * noise
    bank = bank if negatives else None
    expected = value_and_grads(dcl_loss, z1, z2, temperature=temperature, negatives=bank)
    got = value_and_grads(
        dcl_loss, z1.float(), z2.float(), temperature=temperature, negatives=None if bank is None else bank.float()
    )
    for a, b in zip(got, expected):
        assert torch.isfinite(a).all()
        # fp32 logits carry ~1e-7 * 1/T absolute error: scale the tolerance with 1/T
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-6 / temperature)


def test_backward_twice_with_retain_graph_gives_the_same_gradient():
    z1, z2 = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    loss = dcl_loss(z1, z2, 0.2)
    first = torch.autograd.grad(loss, (z1, z2), retain_graph=True)
    second = torch.autograd.grad(loss, (z1, z2))
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
