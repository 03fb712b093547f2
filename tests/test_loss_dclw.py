"""DCLW: value and gradient against a loop written from eq. 6 and w_vMF of Yeh et al. 2021, against
lightly, across two real processes (weights over the global batch), and under fp16/bf16 autocast."""

import math

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import (
    HALF_RTOL,
    assert_processes_match_one_process,
    two_view_worker,
    two_views_under_autocast,
    value_and_grads,
)

from sslkit.losses.dcl import dcl_loss
from sslkit.losses.dclw import DCLWLoss, dclw_loss, vmf_weights


def vmf_reference(z1, z2, sigma):
    """w_i = 2 - exp(s_i / sigma) / E_j[exp(s_j / sigma)], a constant (no gradient), as loops in float64."""
    with torch.no_grad():
        z1 = F.normalize(z1.double(), dim=1)
        z2 = F.normalize(z2.double(), dim=1)
        n = len(z1)
        e = [torch.exp(z1[i] @ z2[i] / sigma) for i in range(n)]
        mean = sum(e) / n
        return [2 - e[i] / mean for i in range(n)]


def dclw_reference(z1, z2, temperature, sigma, negatives=None):
    """DCL eq. 6 with w = w_vMF, mean over the 2N anchors (or N queries against a bank), float64 loops."""
    w = vmf_reference(z1, z2, sigma)
    z1 = F.normalize(z1.double(), dim=1)
    z2 = F.normalize(z2.double(), dim=1)
    n = len(z1)
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
            denominator = sum(
                torch.exp(views[k][i] @ views[v][j] / temperature) for v in range(2) for j in range(n) if j != i
            )
            losses.append(-w[i] * (z1[i] @ z2[i]) / temperature + torch.log(denominator))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d", [(2, 3), (4, 8), (7, 16)])
@pytest.mark.parametrize("temperature,sigma", [(0.05, 0.5), (0.2, 0.1), (1.0, 2.0)])
def test_matches_reference_value_and_gradient(n, d, temperature, sigma):
    g = torch.Generator().manual_seed(n * 100 + d)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = torch.randn(n, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(dclw_loss, z1, z2, temperature=temperature, sigma=sigma)
    ref = value_and_grads(dclw_reference, z1, z2, temperature=temperature, sigma=sigma)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("k", [1, 5])
def test_bank_matches_reference(k):
    g = torch.Generator().manual_seed(k)
    z1, z2 = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    bank = torch.randn(k, 8, generator=g, dtype=torch.float64)
    ours = value_and_grads(dclw_loss, z1, z2, temperature=0.1, sigma=0.5, negatives=bank)
    ref = value_and_grads(dclw_reference, z1, z2, temperature=0.1, sigma=0.5, negatives=bank)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_weights_follow_the_formula_and_average_to_one():
    z1, z2 = torch.randn(2, 9, 8, dtype=torch.float64, requires_grad=True)
    w = vmf_weights(z1, z2, sigma=0.3)
    torch.testing.assert_close(w, torch.stack(vmf_reference(z1, z2, 0.3)))
    torch.testing.assert_close(w.mean(), torch.tensor(1.0, dtype=torch.float64))
    assert not w.requires_grad
    # the closest pair gets the smallest weight
    s = (F.normalize(z1, dim=1) * F.normalize(z2, dim=1)).sum(dim=1)
    assert w.argmin() == s.argmax()


def test_identical_embeddings_give_log_2n_minus_2():
    # Every pair is equally close, so w = 1 and DCLW is DCL: log(2N - 2).
    z = torch.randn(1, 16).repeat(10, 1)
    assert dclw_loss(z, z.clone(), temperature=0.3).item() == pytest.approx(math.log(2 * 10 - 2), rel=1e-5)


def test_large_sigma_tends_to_dcl():
    # sigma -> inf makes every weight 2 - 1 = 1.
    z1, z2 = torch.randn(2, 8, 16, dtype=torch.float64)
    torch.testing.assert_close(dclw_loss(z1, z2, 0.2, sigma=1e9), dcl_loss(z1, z2, 0.2))
    assert not torch.allclose(dclw_loss(z1, z2, 0.2, sigma=0.5), dcl_loss(z1, z2, 0.2))


def test_symmetric_and_order_invariant():
    z1, z2 = torch.randn(2, 12, 32, dtype=torch.float64)
    perm = torch.randperm(12)
    base = dclw_loss(z1, z2, 0.2)
    torch.testing.assert_close(base, dclw_loss(z2, z1, 0.2))
    torch.testing.assert_close(base, dclw_loss(z1[perm], z2[perm], 0.2))


@pytest.mark.filterwarnings("ignore:To copy construct:UserWarning")  # lightly wraps its weights in torch.tensor()
@pytest.mark.parametrize("temperature,sigma", [(0.1, 0.5), (0.5, 0.2)])
def test_matches_lightly(temperature, sigma):
    # lightly: 2 - N softmax(s / sigma), detached, over the (here: only) batch; mean of the two directions.
    lightly_loss = pytest.importorskip("lightly.loss").DCLWLoss
    z1, z2 = torch.randn(2, 16, 32, dtype=torch.float64)
    ours = value_and_grads(dclw_loss, z1, z2, temperature=temperature, sigma=sigma)
    theirs = value_and_grads(lightly_loss(temperature=temperature, sigma=sigma), z1, z2)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    z1, z2 = torch.randn(2, 64, 32)
    expected = dclw_loss(z1, z2, 0.05)
    got, halves = two_views_under_autocast(dclw_loss, dtype, z1, z2, temperature=0.05)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    # The only error left is the embeddings' own rounding to half precision (see HALF_RTOL).
    torch.testing.assert_close(got, expected, rtol=HALF_RTOL[dtype], atol=0)
    got.backward()
    assert all(torch.isfinite(x.grad).all() for x in halves)


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_rejects_bad_temperature_and_sigma(bad):
    with pytest.raises(ValueError, match="temperature"):
        DCLWLoss(temperature=bad)
    with pytest.raises(ValueError, match="sigma"):
        DCLWLoss(sigma=bad)


def test_rejects_bad_inputs():
    loss_fn = DCLWLoss()
    with pytest.raises(ValueError, match="z1 and z2"):
        loss_fn(torch.randn(4, 8), torch.randn(5, 8))
    with pytest.raises(ValueError, match="negatives"):
        loss_fn(torch.randn(4, 8), torch.randn(4, 8), negatives=torch.randn(3, 7))
    with pytest.raises(ValueError, match="negatives"):
        loss_fn(torch.randn(4, 8), torch.randn(4, 8), negatives=torch.randn(8))
    with pytest.raises(ValueError, match="at least 2"):
        loss_fn(torch.randn(1, 8), torch.randn(1, 8))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    # The weights' E_j is over the global batch: local weights would fail this comparison.
    bank = torch.randn(5, 16, dtype=torch.float64)
    kwargs = dict(temperature=0.3, sigma=0.2)
    cases = [(*torch.randn(2, 8, 16, dtype=torch.float64), negatives, kwargs) for negatives in (None, bank)]
    results = run_in_processes(two_view_worker, DCLWLoss, cases)
    for c, (z1, z2, negatives, _) in enumerate(cases):
        expected = value_and_grads(dclw_loss, z1, z2, **kwargs, negatives=negatives)
        assert_processes_match_one_process([r[c] for r in results], expected)


@pytest.mark.parametrize("negatives", [False, True])
@pytest.mark.parametrize("temperature", [0.5, 0.001])  # 1/T = 1000 > 600: the fused function's row-max branch
def test_gradcheck(negatives, temperature):
    # w_vMF is a constant (detached): gradcheck's finite differences see it move with the
    # inputs, so hold it fixed at the inputs' value, exactly what the analytic gradient assumes.
    g = torch.Generator().manual_seed(7)
    z1, z2 = (torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    bank = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True) if negatives else None
    w = vmf_weights(z1, z2, sigma=0.5)
    inputs = (z1, z2) if bank is None else (z1, z2, bank)

    def loss(z1, z2, bank=None):
        return dcl_loss(z1, z2, temperature, negatives=bank, positive_weight=w)

    assert torch.autograd.gradcheck(loss, inputs)
    torch.testing.assert_close(loss(*inputs), dclw_loss(z1, z2, temperature, 0.5, negatives=bank))
