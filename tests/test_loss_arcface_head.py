"""ArcFaceHead (eq. 3 of Deng 2019): value and gradient against a loop that takes the angle with
acos and adds m (the paper's way), including the theta + m > pi fallback and easy margin;
pytorch-metric-learning's ArcFaceLoss; finite loss and gradients at cos = +-1."""

import math

import numpy as np
import pytest
import torch
from loss_utils import head_and_pml, head_and_reference

from sslkit.losses.arcface import ArcFaceHead, arcface_target_logit


def arcface_reference(x, weight, labels, s, m, easy_margin=False):
    """theta = acos(cos); target s cos(theta + m) (or s (cos - m sin m) past pi - m); mean CE."""
    losses = []
    for i in range(len(x)):
        cos = [
            (x[i] @ weight[j]) / (torch.sqrt(x[i] @ x[i]) * torch.sqrt(weight[j] @ weight[j]))
            for j in range(len(weight))
        ]
        theta = torch.acos(cos[labels[i]])
        if easy_margin:
            target = torch.cos(theta + m) if cos[labels[i]] > 0 else cos[labels[i]]
        else:
            target = torch.cos(theta + m) if theta + m <= math.pi else cos[labels[i]] - m * math.sin(m)
        logits = [s * target if j == labels[i] else s * cos[j] for j in range(len(weight))]
        losses.append(-logits[labels[i]] + torch.log(sum(torch.exp(z) for z in logits)))
    return torch.stack(losses).mean()


def _batch(n, d, c, seed, opposite):
    """Random embeddings; with ``opposite``, half of them near -W_y so theta + m > pi is exercised."""
    g = torch.Generator().manual_seed(seed)
    head = ArcFaceHead(d, c).double()
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    labels = torch.randint(0, c, (n,), generator=g)
    labels[0] = c - 1
    if opposite:
        w = head.weight.detach()
        x[::2] = -w[labels[::2]] * 4 + 0.05 * torch.randn(len(x[::2]), d, dtype=torch.float64, generator=g)
    return head.weight.detach(), x, labels


@pytest.mark.parametrize("n,d,c", [(1, 3, 2), (6, 5, 4), (9, 8, 7)])
@pytest.mark.parametrize("s,m", [(64.0, 0.5), (30.0, 0.2), (10.0, 1.3)])
@pytest.mark.parametrize("easy_margin", [False, True])
@pytest.mark.parametrize("opposite", [False, True])
def test_matches_reference_value_and_gradient(n, d, c, s, m, easy_margin, opposite):
    weight, x, labels = _batch(n, d, c, seed=n + 10 * c, opposite=opposite)
    head = ArcFaceHead(d, c, scale=s, margin=m, easy_margin=easy_margin).double()
    with torch.no_grad():
        head.weight.copy_(weight)
    ours, ref = head_and_reference(head, x, labels, arcface_reference, s=s, m=m, easy_margin=easy_margin)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_fallback_is_taken_exactly_past_pi_minus_m():
    m = 0.5
    theta = torch.tensor([0.1, math.pi - m - 1e-3, math.pi - m + 1e-3, math.pi - 1e-3], dtype=torch.float64)
    got = arcface_target_logit(torch.cos(theta), m)
    expected = torch.where(theta + m <= math.pi, torch.cos(theta + m), torch.cos(theta) - m * math.sin(m))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)  # sqrt(eps) in the sine moves it by <= 1e-6


@pytest.mark.parametrize("s,m", [(64.0, 0.5), (30.0, 1.0)])
def test_matches_pytorch_metric_learning(s, m):
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    weight, x, labels = _batch(12, 8, 6, seed=3, opposite=True)
    head = ArcFaceHead(8, 6, scale=s, margin=m).double()
    # PML takes the margin in degrees (default 28.6, i.e. 0.4992 rad) and stores W as (D, C).
    theirs = pml.ArcFaceLoss(num_classes=6, embedding_size=8, margin=float(np.degrees(m)), scale=s).double()
    with torch.no_grad():
        head.weight.copy_(weight)
        theirs.W.copy_(weight.T)
    ours, ref = head_and_pml(head, theirs, x, labels)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(ours[2], ref[2], rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("easy_margin", [False, True])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_embedding_on_or_opposite_its_class_weight_has_finite_loss_and_gradient(dtype, easy_margin, sign):
    head = ArcFaceHead(6, 4, easy_margin=easy_margin).to(dtype)
    labels = torch.tensor([0, 1, 2, 3])
    x = (sign * head.weight.detach()[labels]).clone().requires_grad_(True)  # cos = +1 or -1 exactly
    loss = head(x, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all() and torch.isfinite(head.weight.grad).all()
    # The trap this avoids: the angle via acos has an infinite derivative there.
    cos = torch.tensor(sign, dtype=dtype, requires_grad=True)
    torch.cos(torch.acos(cos) + 0.5).backward()
    assert not torch.isfinite(cos.grad)


def test_target_logit_gradient_at_cos_one_is_cos_m():
    cos = torch.tensor([1.0, -1.0], dtype=torch.float64, requires_grad=True)
    arcface_target_logit(cos, 0.5).sum().backward()
    # sin is held at sqrt(eps) there, so only the cos(t) cos(m) term (or the fallback's 1) remains.
    torch.testing.assert_close(cos.grad, torch.tensor([math.cos(0.5), 1.0], dtype=torch.float64))


BAD_ARGUMENTS = [("margin", -0.1), ("margin", math.pi / 2), ("scale", 0.0), ("scale", float("nan"))]


@pytest.mark.parametrize("name,value", BAD_ARGUMENTS)
def test_rejects_bad_arguments(name, value):
    with pytest.raises(ValueError, match=name):
        ArcFaceHead(4, 3, **{name: value})
