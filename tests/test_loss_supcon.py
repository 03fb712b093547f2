"""SupCon: value and gradient against a loop written from Khosla et al. eq. 2 (L_out), against
pytorch-metric-learning and NT-Xent, across two real processes, and under fp16/bf16 autocast."""

import math

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import (
    assert_processes_match_one_process,
    labelled_under_autocast,
    labelled_worker,
    make_labels,
    random_labelled_batch,
    value_and_grads,
)

from sslkit.losses.ntxent import ntxent_loss
from sslkit.losses.supcon import SupConLoss, _SupConWeightedSum, supcon_loss


def supcon_reference(embeddings, labels, temperature, base_temperature=None):
    """Eq. 2 of the paper (L_out) as plain loops, float64; anchors without a positive are skipped."""
    z = F.normalize(embeddings.double(), dim=1)
    n = len(z)
    losses = []
    for i in range(n):
        positives = [p for p in range(n) if p != i and labels[p] == labels[i]]
        if not positives:
            continue
        denominator = sum(torch.exp(z[i] @ z[a] / temperature) for a in range(n) if a != i)
        terms = [torch.log(torch.exp(z[i] @ z[p] / temperature) / denominator) for p in positives]
        losses.append(-sum(terms) / len(positives))
    if not losses:
        return embeddings.sum() * 0.0
    scale = 1.0 if base_temperature is None else temperature / base_temperature
    return scale * torch.stack(losses).mean()


@pytest.mark.parametrize("n,d", [(2, 3), (6, 8), (11, 16)])
@pytest.mark.parametrize("temperature", [0.05, 1.0])
@pytest.mark.parametrize("kind", ["mixed", "pairs", "one_class"])
def test_matches_reference_value_and_gradient(n, d, temperature, kind):
    g = torch.Generator().manual_seed(n * 100 + d)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    labels = make_labels(kind, n, g)
    ours = value_and_grads(supcon_loss, x, labels, temperature=temperature)
    ref = value_and_grads(supcon_reference, x, labels, temperature=temperature)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_base_temperature_scales_by_t_over_base_t():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 8, generator=g, dtype=torch.float64)
    labels = make_labels("mixed", 9, g)
    ours = value_and_grads(SupConLoss(temperature=0.1, base_temperature=0.07), x, labels)
    ref = value_and_grads(supcon_reference, x, labels, temperature=0.1, base_temperature=0.07)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    plain = supcon_loss(x, labels, 0.1)
    torch.testing.assert_close(ours[0], plain * 0.1 / 0.07)


def test_custom_backward_passes_gradcheck_with_separate_candidates():
    # The path that runs across processes: candidates are another tensor, anchors at an offset.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    candidates = torch.randn(8, 5, generator=g, dtype=torch.float64)
    candidates[4:] = 2 * x.detach()
    candidates.requires_grad_(True)
    class_of = torch.tensor([0, 1, 1, 2, 0, 2, 1, 3])
    weight = torch.rand(4, generator=g, dtype=torch.float64)
    row_weight = torch.tensor([0.7, 0.0, 1.3, 0.2], dtype=torch.float64)  # one anchor skipped
    for inv_t in (3.0, 700.0):  # without and with the row-maximum shift (fp64 switches at 600)
        assert torch.autograd.gradcheck(
            lambda a, c: _SupConWeightedSum.apply(a, c, inv_t, 4, class_of, 4, weight, row_weight),
            (x, candidates),
        )


def test_small_temperature_row_max_path_matches_double():
    # T = 0.01: fp32 takes the max-subtraction path (1/T > 60), fp64 does not (1/T < 600).
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 8, generator=g)
    labels = torch.arange(16) // 4
    got = value_and_grads(supcon_loss, x, labels, temperature=0.01)
    expected = value_and_grads(supcon_loss, x.double(), labels, temperature=0.01)
    torch.testing.assert_close(got[0].double(), expected[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1].double(), expected[1], rtol=1e-4, atol=1e-4)
    # fp64 at T = 0.001 takes the shift path too and stays finite where exp(1/T) would overflow
    value, grad = value_and_grads(supcon_loss, x.double(), labels, temperature=0.001)
    assert torch.isfinite(value) and torch.isfinite(grad).all()


def test_identical_embeddings_one_class_give_log_n_minus_1():
    # every similarity is 1: each anchor's softmax is uniform over N - 1 candidates
    z = torch.randn(1, 16).repeat(10, 1)
    assert supcon_loss(z, torch.zeros(10, dtype=torch.long), 0.1).item() == pytest.approx(math.log(9), rel=1e-5)


def test_one_label_per_pair_is_ntxent():
    # Each anchor's only positive is its other view: SupCon on two views is SimCLR's NT-Xent.
    z1, z2 = torch.randn(2, 7, 16, dtype=torch.float64)
    labels = torch.arange(7)
    for temperature in (0.1, 0.5):
        ours = value_and_grads(lambda a, y: supcon_loss(torch.cat([a, z2]), y.repeat(2), temperature), z1, labels)
        theirs = value_and_grads(lambda a, y: ntxent_loss(a, z2, temperature), z1, labels)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_order_invariant():
    x = torch.randn(12, 8, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 3, 3, 4, 0, 5, 1])
    perm = torch.randperm(12)
    torch.testing.assert_close(supcon_loss(x, labels, 0.2), supcon_loss(x[perm], labels[perm], 0.2))


@pytest.mark.parametrize("kind", ["mixed", "pairs"])
@pytest.mark.parametrize("temperature", [0.07, 0.5])
def test_matches_pytorch_metric_learning(kind, temperature):
    # pml's SupConLoss: same L_out, cosine similarity, mean over anchors with a positive
    # (AvgNonZeroReducer); it has no base_temperature factor, like sslkit's default.
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(13, 16, generator=g, dtype=torch.float64)
    labels = make_labels(kind, 13, g)
    ours = value_and_grads(supcon_loss, x, labels, temperature=temperature)
    theirs = value_and_grads(pml.SupConLoss(temperature=temperature), x, labels)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_pytorch_metric_learning_returns_zero_without_negatives_where_eq_2_does_not():
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    x = torch.randn(6, 8, dtype=torch.float64)
    labels = torch.zeros(6, dtype=torch.long)
    assert pml.SupConLoss(temperature=0.1)(x, labels).item() == 0.0
    torch.testing.assert_close(supcon_loss(x, labels, 0.1), supcon_reference(x, labels, 0.1))
    assert supcon_loss(x, labels, 0.1).item() > 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.05, 0.1])
def test_half_precision_autocast_is_finite_and_close(dtype, temperature):
    x, labels = random_labelled_batch(64, 32, num_classes=10, seed=2)
    got, grad, rounded, expected = labelled_under_autocast(
        supcon_loss, x, labels, dtype, backward=True, temperature=temperature
    )
    assert got.dtype == torch.float32 and torch.isfinite(got) and torch.isfinite(grad).all()
    # the math runs in fp32: the only error left is the embeddings' own rounding to half precision
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_fp16_tiny_temperature_stays_finite():
    # exp(1 / 0.01) overflows fp16 (and fp32): the loss must never form it
    x = torch.randn(32, 16).half().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = supcon_loss(x, torch.arange(32) // 2, 0.01)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


def test_anchors_without_positive_give_no_nan():
    x = torch.randn(7, 8, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 2, 3, 4, 5])  # five anchors with no positive
    loss = supcon_loss(x, labels, 0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    # ... and the loss is the mean over the two anchors that have one
    z = F.normalize(x.detach(), dim=1)
    others = [torch.cat([z[i] @ z[:i].T, z[i] @ z[i + 1 :].T]) for i in (0, 1)]  # s_ia, a != i
    per_anchor = [torch.logsumexp(s / 0.1, 0) - z[0] @ z[1] / 0.1 for s in others]
    torch.testing.assert_close(loss.detach(), torch.stack(per_anchor).mean())


def test_no_positive_anywhere_is_zero_with_a_graph():
    x = torch.randn(5, 8, requires_grad=True)
    loss = SupConLoss()(x, torch.arange(5))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert SupConLoss()(torch.randn(1, 4), torch.zeros(1, dtype=torch.long)).item() == 0.0


def test_zero_embedding_stays_finite():
    x = torch.randn(6, 8)
    x[2] = 0.0
    x.requires_grad_(True)
    loss = supcon_loss(x, torch.tensor([0, 0, 1, 1, 2, 2]), 0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    expected = supcon_reference(x.detach(), [0, 0, 1, 1, 2, 2], 0.1)
    torch.testing.assert_close(loss.detach().double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_rejects_bad_temperature(bad):
    with pytest.raises(ValueError, match="temperature"):
        SupConLoss(temperature=bad)
    with pytest.raises(ValueError, match="base_temperature"):
        SupConLoss(base_temperature=bad)


def test_rejects_bad_labels():
    with pytest.raises(ValueError, match="labels"):
        supcon_loss(torch.randn(4, 8), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        supcon_loss(torch.randn(4, 8), torch.zeros(4))
    with pytest.raises(ValueError, match="labels"):
        SupConLoss()(torch.randn(4, 8), None)
    with pytest.raises(ValueError, match="embeddings"):
        supcon_loss(torch.randn(4, 8, 2), torch.zeros(4, dtype=torch.long))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    x = torch.randn(10, 16, dtype=torch.float64)
    # rank 0 holds four anchors with a positive, rank 1 three: the normalisation must be global
    labels = torch.tensor([0, 0, 1, 2, 3, 1, 3, 3, 4, 5])
    cases = [dict(temperature=0.2), dict(temperature=0.2, gather_distributed=False)]
    results = run_in_processes(labelled_worker, SupConLoss, cases, x, labels)
    expected = value_and_grads(supcon_loss, x, labels, temperature=0.2)
    assert_processes_match_one_process([r[0] for r in results], expected)
    # gather_distributed=False: each process sees only its own half
    for rank, r in enumerate(results):
        torch.testing.assert_close(
            r[1][0], supcon_loss(x[rank * 5 : (rank + 1) * 5], labels[rank * 5 : (rank + 1) * 5], 0.2)
        )


@pytest.mark.parametrize("temperature", [0.1, 0.01])  # 0.01: past the no-shift bound, the general backward
def test_supcon_backward_twice_with_retain_graph_gives_the_same_gradient(temperature):
    """The one-process backward fills a buffer the forward kept; a second backward must not see a stale one."""
    x = torch.randn(12, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 0, 3, 3, 1, 4, 4])
    loss = SupConLoss(temperature=temperature)(x, labels)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    x.grad = None
    loss.backward()
    torch.testing.assert_close(x.grad, first)
