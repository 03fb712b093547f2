"""Proxy-Anchor: value and gradient (embeddings and proxies) against a loop written from eq. 4
of Kim et al. 2020, against pytorch-metric-learning, a closed form, fp16/bf16 autocast, the
optimizer groups and the argument checks."""

import math

import pytest
import torch
import torch.nn.functional as F
from loss_utils import labelled_under_autocast, pml_proxy_value_and_grads, value_and_grads

from sslkit.losses.proxy_anchor import ProxyAnchorHead, proxy_anchor_loss

# name -> (num_classes, labels): a class present once, classes absent from the batch,
# a batch of one class (no proxy has a negative... except the absent ones), one sample per class.
LABELS = {
    "mixed_with_absent_and_singleton": (7, [0, 0, 2, 2, 2, 3, 5, 5]),
    "single_class": (4, [1, 1, 1, 1, 1]),
    "one_per_class": (6, [0, 1, 2, 3, 4, 5]),
    "single_sample": (3, [2]),
    "more_classes_than_samples": (20, [4, 9, 9, 17, 0, 4, 13]),
}


def proxy_anchor_reference(x, labels, proxies, alpha, delta):
    """Eq. 4 of Kim et al. 2020 as plain Python loops, float64."""
    x = F.normalize(x.double(), dim=1)
    p = F.normalize(proxies.double(), dim=1)
    labels = labels.tolist()
    pos_terms, neg_terms = [], []
    for c in range(len(p)):
        pos_sum = torch.zeros((), dtype=torch.float64)
        neg_sum = torch.zeros((), dtype=torch.float64)
        for i in range(len(x)):
            s = x[i] @ p[c]
            if labels[i] == c:
                pos_sum = pos_sum + torch.exp(-alpha * (s - delta))
            else:
                neg_sum = neg_sum + torch.exp(alpha * (s + delta))
        if c in labels:  # P+: proxies with at least one positive in the batch
            pos_terms.append(torch.log(1 + pos_sum))
        neg_terms.append(torch.log(1 + neg_sum))
    return torch.stack(pos_terms).sum() / len(pos_terms) + torch.stack(neg_terms).sum() / len(p)


@pytest.mark.parametrize("case", sorted(LABELS))
@pytest.mark.parametrize("d", [3, 16])
@pytest.mark.parametrize("alpha,delta", [(32.0, 0.1), (4.0, 0.0), (16.0, 0.5)])
def test_matches_reference_value_and_gradient(case, d, alpha, delta):
    num_classes, labels = LABELS[case]
    labels = torch.tensor(labels)
    g = torch.Generator().manual_seed(len(case) * 10 + d)
    x = torch.randn(len(labels), d, generator=g, dtype=torch.float64)
    proxies = torch.randn(num_classes, d, generator=g, dtype=torch.float64)
    ours = value_and_grads(lambda a, y, p: proxy_anchor_loss(a, y, p, alpha, delta), x, labels, proxies)
    ref = value_and_grads(lambda a, y, p: proxy_anchor_reference(a, y, p, alpha, delta), x, labels, proxies)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_head_matches_reference_and_trains_absent_proxies_through_the_negative_term():
    torch.manual_seed(0)
    head = ProxyAnchorHead(embedding_dim=8, num_classes=5).double()
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1, 1, 3])
    loss = head(x, labels)
    loss.backward()
    expected = proxy_anchor_reference(x.detach(), labels, head.proxies.detach(), 32.0, 0.1)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-10, atol=1e-12)
    # Proxies 2 and 4 have no positive in the batch: they still get a (finite, nonzero)
    # gradient from the negative term, and a small step along it alone lowers the loss.
    grad = head.proxies.grad
    assert torch.isfinite(grad).all() and (grad[[2, 4]].abs().sum(dim=1) > 0).all()
    moved = head.proxies.detach().clone()
    moved[[2, 4]] -= 1e-3 * grad[[2, 4]]
    assert proxy_anchor_loss(x.detach(), labels, moved) < loss.detach()


def test_closed_form_when_embeddings_sit_on_orthogonal_proxies():
    # One sample per class, each equal to its own proxy, proxies orthonormal: s = 1 with its
    # proxy and 0 with the C - 1 others.
    alpha, delta, c = 32.0, 0.1, 5
    proxies = torch.eye(c, 12, dtype=torch.float64)
    loss = proxy_anchor_loss(proxies * 3.0, torch.arange(c), proxies, alpha, delta)
    expected = math.log1p(math.exp(-alpha * (1 - delta))) + math.log1p((c - 1) * math.exp(alpha * delta))
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_invariant_to_batch_order_and_embedding_norm():
    x = torch.randn(10, 16, dtype=torch.float64)
    labels = torch.randint(0, 4, (10,))
    proxies = torch.randn(6, 16, dtype=torch.float64)
    perm = torch.randperm(10)
    base = proxy_anchor_loss(x, labels, proxies)
    torch.testing.assert_close(proxy_anchor_loss(x[perm], labels[perm], proxies), base)
    torch.testing.assert_close(proxy_anchor_loss(x * 7.0, labels, proxies * 0.1), base)


def test_extreme_similarities_stay_finite_in_fp32():
    # alpha = 32 and s = +-1 give exponents of +-35: exp alone is fine in fp32, but with a
    # large alpha a naive log(1 + sum exp) overflows; the shifted form does not.
    proxies = torch.eye(3, 8)
    x = torch.cat([proxies, -proxies]).requires_grad_(True)
    labels = torch.tensor([0, 1, 2, 1, 2, 0])
    loss = proxy_anchor_loss(x, labels, proxies, alpha=200.0, delta=0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    expected = proxy_anchor_reference(x.detach(), labels, proxies, 200.0, 0.1)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", ["mixed_with_absent_and_singleton", "single_class", "more_classes_than_samples"])
@pytest.mark.parametrize("alpha,delta", [(32.0, 0.1), (8.0, 0.3)])
def test_matches_pytorch_metric_learning(case, alpha, delta):
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    num_classes, labels = LABELS[case]
    labels = torch.tensor(labels)
    x = torch.randn(len(labels), 16, dtype=torch.float64)
    proxies = torch.randn(num_classes, 16, dtype=torch.float64)
    # pml keeps its proxies (C, D) like sslkit; copy ours in and read its gradient back.
    theirs_fn = pml.ProxyAnchorLoss(num_classes, 16, margin=delta, alpha=alpha)
    theirs = pml_proxy_value_and_grads(theirs_fn, x, labels, proxies)
    ours = value_and_grads(lambda a, y, p: proxy_anchor_loss(a, y, p, alpha, delta), x, labels, proxies)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours[2], theirs[2], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    torch.manual_seed(0)
    head = ProxyAnchorHead(embedding_dim=32, num_classes=10)
    x = torch.randn(64, 32)
    labels = torch.randint(0, 10, (64,))
    got, _, _, expected = labelled_under_autocast(head, x, labels, dtype, backward=True)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    assert torch.isfinite(head.proxies.grad).all()
    # What is left is the embeddings' own rounding, amplified by alpha = 32 in the exponent.
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=5e-2)


def test_logits_are_cosine_similarities():
    head = ProxyAnchorHead(embedding_dim=8, num_classes=4)
    x = torch.randn(5, 8)
    expected = F.normalize(x, dim=1) @ F.normalize(head.proxies.detach(), dim=1).T
    torch.testing.assert_close(head.logits(x).detach(), expected)


def test_param_groups_hold_the_proxies_once_at_100x():
    head = ProxyAnchorHead(embedding_dim=8, num_classes=4)
    groups = head.param_groups()
    grouped = [p for g in groups for p in g["params"]]
    assert sorted(map(id, grouped)) == sorted(map(id, head.parameters()))
    assert len(grouped) == len(set(map(id, grouped))) == 1
    assert groups[0]["lr_scale"] == 100.0 and isinstance(groups[0]["name"], str)
    assert ProxyAnchorHead(8, 4, proxy_lr_scale=3.0).param_groups()[0]["lr_scale"] == 3.0
    assert head.num_classes == 4


def test_proxies_use_kaiming_normal_fan_out():
    torch.manual_seed(0)
    proxies = ProxyAnchorHead(embedding_dim=512, num_classes=400).proxies.detach()
    assert proxies.shape == (400, 512)
    # fan_out of a (C, D) tensor is C: std sqrt(2 / 400) = 0.0707 (fan_in would give 0.0625).
    assert proxies.std().item() == pytest.approx(math.sqrt(2 / 400), rel=0.02)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_rejects_bad_alpha(bad):
    with pytest.raises(ValueError, match="alpha"):
        ProxyAnchorHead(8, 4, alpha=bad)


@pytest.mark.parametrize("bad", [-0.1, float("nan")])
def test_rejects_bad_delta(bad):
    with pytest.raises(ValueError, match="delta"):
        ProxyAnchorHead(8, 4, delta=bad)


def test_rejects_bad_sizes_and_lr_scale():
    with pytest.raises(ValueError, match="proxy_lr_scale"):
        ProxyAnchorHead(8, 4, proxy_lr_scale=0.0)
    with pytest.raises(ValueError, match="num_classes"):
        ProxyAnchorHead(8, 0)
    with pytest.raises(ValueError, match="embedding_dim"):
        ProxyAnchorHead(0, 4)


@pytest.mark.parametrize("bad", [[0, 4], [-1, 2]])
def test_rejects_labels_out_of_range(bad):
    head = ProxyAnchorHead(8, 4)
    with pytest.raises(ValueError, match="labels"):
        head(torch.randn(2, 8), torch.tensor(bad))


def test_rejects_wrong_embedding_dim():
    head = ProxyAnchorHead(8, 4)
    with pytest.raises(ValueError, match="embedding_dim"):
        head(torch.randn(2, 7), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="embedding_dim"):
        head.logits(torch.randn(2, 7))


def test_float32_with_the_column_shift_matches_the_reference_gradients():
    """alpha (1 + delta) = 110 is past what fp32 sums without the shift: value and gradients of
    the shifted path against the float64 loop."""
    num_classes, labels = LABELS["mixed_with_absent_and_singleton"]
    labels = torch.tensor(labels)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(len(labels), 16, generator=g, dtype=torch.float64)
    proxies = torch.randn(num_classes, 16, generator=g, dtype=torch.float64)
    proxies[3] = x[0] * 2  # a negative pair at cosine 1: the largest exponent, 110
    ours = value_and_grads(lambda a, y, p: proxy_anchor_loss(a, y, p, 100.0, 0.1), x.float(), labels, proxies.float())
    ref = value_and_grads(lambda a, y, p: proxy_anchor_reference(a, y, p, 100.0, 0.1), x, labels, proxies)
    for a, b in zip(ours, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_head_stays_exact_when_calls_overlap_and_refuses_a_second_backward():
    """The head's reused buffers: two losses alive at once (one backward for both), a dropped
    graph and a no_grad call leave the gradients equal to the loop's; retain_graph then a
    second backward is refused (the buffer became the gradient)."""
    g = torch.Generator().manual_seed(9)
    head = ProxyAnchorHead(embedding_dim=8, num_classes=6).double()
    x1, x2 = (torch.randn(7, 8, dtype=torch.float64, generator=g) for _ in range(2))
    y1, y2 = torch.tensor([0, 0, 1, 2, 2, 2, 5]), torch.tensor([3, 3, 1, 4, 0, 0, 1])

    def grads(loss_of):
        a, b = x1.clone().requires_grad_(True), x2.clone().requires_grad_(True)
        head.zero_grad(set_to_none=True)
        loss_of(a, b).backward()
        return a.grad, b.grad, head.proxies.grad

    ref = grads(
        lambda a, b: (
            proxy_anchor_reference(a, y1, head.proxies, 32.0, 0.1)
            + proxy_anchor_reference(b, y2, head.proxies, 32.0, 0.1)
        )
    )
    head(x1.clone().requires_grad_(True), y1)  # graph dropped, never differentiated
    with torch.no_grad():
        head(x2, y2)
    for _ in range(2):  # the second time with the buffers the first gave back
        torch.testing.assert_close(grads(lambda a, b: head(a, y1) + head(b, y2)), ref, rtol=1e-9, atol=1e-12)
    loss = head(x1.clone().requires_grad_(True), y1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward"):
        loss.backward()
