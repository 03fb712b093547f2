"""Proxy-NCA: value and gradient (embeddings and proxies) against a loop written from the NCA
loss of Movshovitz-Attias et al. 2017 on proxies, against pytorch-metric-learning (softmax
form), a closed form, fp16/bf16 autocast, the optimizer groups and the argument checks."""

import math

import pytest
import torch
import torch.nn.functional as F
from loss_utils import labelled_under_autocast, pml_proxy_value_and_grads, value_and_grads

from sslkit.losses.proxy_nca import ProxyNCAHead, proxy_nca_loss

# name -> (num_classes, labels): a class present once, classes absent from the batch,
# one class only, one sample per class, two classes (a single negative proxy).
LABELS = {
    "mixed_with_absent_and_singleton": (7, [0, 0, 2, 2, 2, 3, 5, 5]),
    "single_class": (4, [1, 1, 1, 1, 1]),
    "one_per_class": (6, [0, 1, 2, 3, 4, 5]),
    "two_classes": (2, [1, 0, 1]),
    "more_classes_than_samples": (20, [4, 9, 9, 17, 0, 4, 13]),
}


def proxy_nca_reference(x, labels, proxies, scale, include_positive=False):
    """-log(exp(-s d(x, p_y)) / sum_{c != y} exp(-s d(x, p_c))), loops, d = ||x - p||^2 on unit vectors."""
    x = F.normalize(x.double(), dim=1)
    p = F.normalize(proxies.double(), dim=1)
    losses = []
    for i in range(len(x)):
        y = int(labels[i])
        dist = [((x[i] - p[c]) ** 2).sum() for c in range(len(p))]
        numerator = torch.exp(-scale * dist[y])
        denominator = sum(torch.exp(-scale * dist[c]) for c in range(len(p)) if include_positive or c != y)
        losses.append(-torch.log(numerator / denominator))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("case", sorted(LABELS))
@pytest.mark.parametrize("d", [3, 16])
@pytest.mark.parametrize("scale", [1.0, 9.0, 30.0])
@pytest.mark.parametrize("include_positive", [False, True])
def test_matches_reference_value_and_gradient(case, d, scale, include_positive):
    num_classes, labels = LABELS[case]
    labels = torch.tensor(labels)
    g = torch.Generator().manual_seed(len(case) * 10 + d)
    x = torch.randn(len(labels), d, generator=g, dtype=torch.float64)
    proxies = torch.randn(num_classes, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(
        lambda a, y, p: proxy_nca_loss(a, y, p, scale, include_positive_in_denominator=include_positive),
        x,
        labels,
        proxies,
    )
    ref = value_and_grads(lambda a, y, p: proxy_nca_reference(a, y, p, scale, include_positive), x, labels, proxies)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_head_matches_reference_and_excludes_the_positive_by_default():
    head = ProxyNCAHead(embedding_dim=8, num_classes=5).double()
    x = torch.randn(6, 8, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 1, 3])
    expected = proxy_nca_reference(x, labels, head.proxies.detach(), 9.0)
    torch.testing.assert_close(head(x, labels), expected, rtol=1e-10, atol=1e-12)
    # The softmax form is log(1 + exp(-paper's loss)) per sample: strictly larger, and > 0.
    softmax_form = proxy_nca_loss(x, labels, head.proxies, 9.0, include_positive_in_denominator=True)
    assert softmax_form.item() > max(expected.item(), 0.0)


def test_closed_form_when_embeddings_sit_on_orthogonal_proxies():
    # Each sample on its own proxy (d = 0), orthonormal proxies (d = 2 to the C - 1 others):
    # l = 0 + log((C - 1) exp(-2 s)).
    c, scale = 5, 9.0
    proxies = torch.eye(c, 12, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 4, 4, 1])
    loss = proxy_nca_loss(proxies[labels] * 2.5, labels, proxies, scale)
    assert loss.item() == pytest.approx(math.log(c - 1) - 2 * scale, rel=1e-12)


def test_invariant_to_batch_order_and_norms():
    x = torch.randn(10, 16, dtype=torch.float64)
    labels = torch.randint(0, 4, (10,))
    proxies = torch.randn(6, 16, dtype=torch.float64)
    perm = torch.randperm(10)
    base = proxy_nca_loss(x, labels, proxies)
    torch.testing.assert_close(proxy_nca_loss(x[perm], labels[perm], proxies), base)
    torch.testing.assert_close(proxy_nca_loss(x * 7.0, labels, proxies * 0.1), base)


@pytest.mark.parametrize("case", ["mixed_with_absent_and_singleton", "single_class", "more_classes_than_samples"])
@pytest.mark.parametrize("scale", [1.0, 9.0])
def test_matches_pytorch_metric_learning_softmax_form(case, scale):
    # pml's ProxyNCALoss is a softmax over ALL proxies (positive included) of
    # -softmax_scale * squared distance: our include_positive_in_denominator=True.
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    num_classes, labels = LABELS[case]
    labels = torch.tensor(labels)
    x = torch.randn(len(labels), 16, dtype=torch.float64)
    proxies = torch.randn(num_classes, 16, dtype=torch.float64)
    theirs = pml_proxy_value_and_grads(pml.ProxyNCALoss(num_classes, 16, softmax_scale=scale), x, labels, proxies)
    ours = value_and_grads(
        lambda a, y, p: proxy_nca_loss(a, y, p, scale, include_positive_in_denominator=True), x, labels, proxies
    )
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(ours[2], theirs[2], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("include_positive", [False, True])
def test_half_precision_autocast_is_finite_and_close(dtype, include_positive):
    torch.manual_seed(0)
    head = ProxyNCAHead(embedding_dim=32, num_classes=10, include_positive_in_denominator=include_positive)
    x = torch.randn(64, 32)
    labels = torch.randint(0, 10, (64,))
    got, _, _, expected = labelled_under_autocast(head, x, labels, dtype, backward=True)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    assert torch.isfinite(head.proxies.grad).all()
    # the only error left is the embeddings' own rounding to half precision (times scale 9)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_logits_are_scaled_negative_squared_distances():
    head = ProxyNCAHead(embedding_dim=8, num_classes=4, scale=3.0)
    x = torch.randn(5, 8)
    expected = -3.0 * torch.cdist(F.normalize(x, dim=1), F.normalize(head.proxies.detach(), dim=1)) ** 2
    torch.testing.assert_close(head.logits(x).detach(), expected, rtol=1e-5, atol=1e-5)


def test_param_groups_hold_the_proxies_once():
    head = ProxyNCAHead(embedding_dim=8, num_classes=4)
    groups = head.param_groups()
    grouped = [p for g in groups for p in g["params"]]
    assert sorted(map(id, grouped)) == sorted(map(id, head.parameters()))
    assert len(grouped) == len(set(map(id, grouped))) == 1
    assert groups[0]["lr_scale"] == 100.0 and isinstance(groups[0]["name"], str)
    assert ProxyNCAHead(8, 4, proxy_lr_scale=2.5).param_groups()[0]["lr_scale"] == 2.5
    assert head.num_classes == 4 and head.proxies.shape == (4, 8)


@pytest.mark.parametrize("name", ["scale", "proxy_lr_scale"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_rejects_bad_positive_arguments(name, bad):
    with pytest.raises(ValueError, match=name):
        ProxyNCAHead(8, 4, **{name: bad})


def test_rejects_a_single_class_without_negatives():
    with pytest.raises(ValueError, match="num_classes"):
        ProxyNCAHead(8, 1)
    ProxyNCAHead(8, 1, include_positive_in_denominator=True)  # the softmax form is defined


@pytest.mark.parametrize("bad", [[0, 4], [-1, 2]])
def test_rejects_labels_out_of_range(bad):
    head = ProxyNCAHead(8, 4)
    with pytest.raises(ValueError, match="labels"):
        head(torch.randn(2, 8), torch.tensor(bad))


def test_rejects_wrong_embedding_dim():
    head = ProxyNCAHead(8, 4)
    with pytest.raises(ValueError, match="embedding_dim"):
        head(torch.randn(2, 7), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="embedding_dim"):
        head.logits(torch.randn(2, 7))


@pytest.mark.parametrize("include_positive", [False, True])
def test_float32_at_a_scale_that_needs_the_row_shift(include_positive):
    """2s = 100 is past what fp32 exp sums without subtracting the row maximum: the fused loss
    shifts (by the largest negative when the positive is left out of the sum) and matches a
    float64 log-sum-exp reference; the plain loop would overflow here."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 16, generator=g, dtype=torch.float64)
    proxies = torch.randn(6, 16, generator=g, dtype=torch.float64)
    # Sample 4 sits on its proxy and opposite every other one: its positive logit is +100, its
    # negatives about -100, so shifting its row by the positive would underflow their sum to 0.
    proxies = -x[4] + 0.01 * proxies
    proxies[2] = x[4] * 3
    labels = torch.tensor([0, 1, 2, 3, 2, 5, 0, 1, 4])

    def stable_reference(a, y, p):
        logits = -50.0 * torch.cdist(F.normalize(a, dim=1), F.normalize(p, dim=1)) ** 2
        positive = logits.gather(1, y[:, None]).squeeze(1)
        others = logits if include_positive else logits.scatter(1, y[:, None], float("-inf"))
        return (torch.logsumexp(others, dim=1) - positive).mean()

    ours = value_and_grads(
        lambda a, y, p: proxy_nca_loss(a, y, p, 50.0, include_positive_in_denominator=include_positive),
        x.float(),
        labels,
        proxies.float(),
    )
    ref = value_and_grads(stable_reference, x, labels, proxies)
    assert all(torch.isfinite(t).all() for t in ours)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
