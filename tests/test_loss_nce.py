"""NCE: value and gradient against a loop written from NPID eq. 5-8 (no peer library implements it),
NPID's frozen normaliser, two real processes, and fp16/bf16 autocast."""

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

from sslkit.losses.nce import NCELoss, nce_loss


def nce_reference(z1, z2, temperature, negatives=None, bank_size=None, normalizer=None):
    """NPID eq. 5-8 as plain loops in float64.

    Each anchor f has a positive v+ and K noise samples from M entries (P_n = 1/M);
    P(v|f) = exp(f.v/T) / Z, h(v) = P(v|f) / (P(v|f) + K P_n), 1 - h(v) = K P_n / (P(v|f) + K P_n);
    Z = M * mean over all (anchor, noise) pairs of exp(f.v/T), a constant, unless given.
    """
    z1 = F.normalize(z1.double(), dim=1)
    z2 = F.normalize(z2.double(), dim=1)
    n = len(z1)
    if negatives is not None:
        bank = F.normalize(negatives.double(), dim=1)
        # (anchor, positive, noise samples), one direction
        triples = [(z1[i], z2[i], [bank[j] for j in range(len(bank))]) for i in range(n)]
        m = bank_size
    else:
        # both directions; the noise for z1[i] is the other view's other samples, and vice versa
        triples = [(a[i], b[i], [b[j] for j in range(n) if j != i]) for a, b in ((z1, z2), (z2, z1)) for i in range(n)]
        m = n
    k = len(triples[0][2])
    if normalizer is None:
        with torch.no_grad():
            noise = [torch.exp(f @ v / temperature) for f, _, vs in triples for v in vs]
            normalizer = m * sum(noise) / len(noise)
    p_noise = 1.0 / m
    losses = []
    for f, positive, noise in triples:
        p_pos = torch.exp(f @ positive / temperature) / normalizer
        loss = -torch.log(p_pos / (p_pos + k * p_noise))
        for v in noise:
            p = torch.exp(f @ v / temperature) / normalizer
            loss = loss - torch.log(k * p_noise / (p + k * p_noise))
        losses.append(loss)
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d", [(2, 3), (5, 16)])
@pytest.mark.parametrize("temperature", [0.07, 0.5])
@pytest.mark.parametrize("normalizer", [None, 1.0, 30.0])
def test_in_batch_matches_reference_value_and_gradient(n, d, temperature, normalizer):
    g = torch.Generator().manual_seed(n * 100 + d)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = torch.randn(n, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(nce_loss, z1, z2, temperature=temperature, normalizer=normalizer)
    ref = value_and_grads(nce_reference, z1, z2, temperature=temperature, normalizer=normalizer)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n,k", [(1, 1), (6, 7)])
@pytest.mark.parametrize("normalizer", [None, 1.0])
def test_bank_matches_reference_value_and_gradient(n, k, normalizer):
    g = torch.Generator().manual_seed(k)
    z1, z2 = torch.randn(2, n, 8, generator=g, dtype=torch.float64)
    bank = torch.randn(k, 8, generator=g, dtype=torch.float64)
    kwargs = dict(temperature=0.07, negatives=bank, bank_size=50, normalizer=normalizer)
    ours = value_and_grads(nce_loss, z1, z2, **kwargs)
    ref = value_and_grads(nce_reference, z1, z2, **kwargs)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_estimated_normalizer_makes_bank_size_cancel():
    # G = s/T - log(M E[exp]) - log(K/M): M drops out with the eq. 8 estimate, not with a fixed Z.
    z1, z2, bank = torch.randn(3, 6, 8, dtype=torch.float64)
    small = nce_loss(z1, z2, negatives=bank, bank_size=10)
    torch.testing.assert_close(small, nce_loss(z1, z2, negatives=bank, bank_size=10_000))
    fixed = [nce_loss(z1, z2, negatives=bank, bank_size=m, normalizer=1.0) for m in (10, 10_000)]
    assert not torch.allclose(fixed[0], fixed[1])


def test_module_freezes_the_first_estimate():
    loss_fn = NCELoss(temperature=0.1)
    assert torch.isnan(loss_fn.log_mean_exp)
    first = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(loss_fn(*first), nce_loss(*first, temperature=0.1))
    frozen = loss_fn.log_mean_exp.clone()
    # Z = M E_j[exp(s_j/T)]: a later batch of another size keeps E_j, so Z follows M.
    later = torch.randn(2, 4, 8, dtype=torch.float64) * 3
    expected = nce_reference(*later, temperature=0.1, normalizer=4 * frozen.exp())
    torch.testing.assert_close(loss_fn(*later), expected)
    assert not torch.allclose(expected, nce_loss(*later, temperature=0.1))  # the frozen Z mattered
    torch.testing.assert_close(loss_fn.log_mean_exp, frozen)
    # it is part of the state, so a resumed run keeps the same Z
    restored = NCELoss(temperature=0.1)
    restored.load_state_dict(loss_fn.state_dict())
    torch.testing.assert_close(restored(*later), expected)
    loss_fn.reset_normalizer()
    torch.testing.assert_close(loss_fn(*later), nce_loss(*later, temperature=0.1))


def test_fixed_normalizer_module_matches_functional():
    z1, z2, bank = torch.randn(3, 5, 8)
    loss_fn = NCELoss(temperature=0.2, bank_size=100, normalizer=2.0)
    expected = nce_loss(z1, z2, 0.2, bank, bank_size=100, normalizer=2.0)
    torch.testing.assert_close(loss_fn(z1, z2, bank), expected)
    assert torch.isnan(loss_fn.log_mean_exp)  # nothing estimated


def test_symmetric_and_order_invariant():
    z1, z2 = torch.randn(2, 12, 32, dtype=torch.float64)
    perm = torch.randperm(12)
    base = nce_loss(z1, z2, 0.2)
    torch.testing.assert_close(base, nce_loss(z2, z1, 0.2))
    torch.testing.assert_close(base, nce_loss(z1[perm], z2[perm], 0.2))


def test_better_separated_embeddings_give_lower_loss():
    z = F.normalize(torch.randn(8, 16, dtype=torch.float64), dim=1)
    aligned = nce_loss(z, z + 0.01 * torch.randn_like(z), 0.1)
    shuffled = nce_loss(z, z[torch.roll(torch.arange(8), 1)], 0.1)
    assert aligned < shuffled


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_bank", [False, True])
def test_half_precision_autocast_is_finite_and_close(dtype, with_bank):
    z1, z2 = torch.randn(2, 64, 32)
    bank = torch.randn(128, 32) if with_bank else None
    expected = nce_loss(z1, z2, 0.05, bank, bank_size=1000)
    got, halves = two_views_under_autocast(nce_loss, dtype, z1, z2, bank, temperature=0.05, bank_size=1000)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    # The only error left is the embeddings' own rounding to half precision (see HALF_RTOL).
    torch.testing.assert_close(got, expected, rtol=HALF_RTOL[dtype], atol=0)
    got.backward()
    assert all(torch.isfinite(x.grad).all() for x in halves)


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_rejects_bad_temperature_and_normalizer(bad):
    with pytest.raises(ValueError, match="temperature"):
        NCELoss(temperature=bad)
    with pytest.raises(ValueError, match="normalizer"):
        NCELoss(normalizer=bad)


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "10"])
def test_rejects_bad_bank_size(bad):
    """The module and the function check it alike (the function once compared a string with 1)."""
    with pytest.raises(ValueError, match="bank_size must be a positive integer"):
        NCELoss(bank_size=bad)
    z, bank = torch.randn(4, 8), torch.randn(5, 8)
    with pytest.raises(ValueError, match="bank_size must be a positive integer"):
        nce_loss(z, z, negatives=bank, bank_size=bad)


def test_rejects_bad_inputs():
    loss_fn = NCELoss()
    with pytest.raises(ValueError, match="z1 and z2"):
        loss_fn(torch.randn(4, 8), torch.randn(5, 8))
    with pytest.raises(ValueError, match="negatives"):
        loss_fn(torch.randn(4, 8), torch.randn(4, 8), negatives=torch.randn(3, 7))
    with pytest.raises(ValueError, match="negatives"):
        loss_fn(torch.randn(4, 8), torch.randn(4, 8), negatives=torch.randn(0, 8))
    # one sample in-batch leaves no noise to contrast with
    with pytest.raises(ValueError, match="at least 2"):
        loss_fn(torch.randn(1, 8), torch.randn(1, 8))
    # P_noise = 1/bank_size is needed once Z is fixed
    with pytest.raises(ValueError, match="bank_size"):
        NCELoss(normalizer=1.0)(torch.randn(4, 8), torch.randn(4, 8), negatives=torch.randn(3, 8))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    bank = torch.randn(5, 16, dtype=torch.float64)
    cases = [
        (*torch.randn(2, 8, 16, dtype=torch.float64), negatives, dict(temperature=0.2, bank_size=40, normalizer=z))
        for negatives in (None, bank)
        for z in (None, 3.0)
    ]
    results = run_in_processes(two_view_worker, NCELoss, cases)  # one spawn for all cases: it is the slow part
    for c, (z1, z2, negatives, kwargs) in enumerate(cases):
        expected = value_and_grads(nce_loss, z1, z2, negatives=negatives, **kwargs)
        assert_processes_match_one_process([r[c] for r in results], expected)
        if kwargs["normalizer"] is None:
            # Both processes froze the same, global estimate of Z.
            one_process = NCELoss(temperature=0.2, bank_size=40)
            one_process(z1, z2, negatives)
            for r in results:
                torch.testing.assert_close(r[c][3]["log_mean_exp"], one_process.log_mean_exp)
