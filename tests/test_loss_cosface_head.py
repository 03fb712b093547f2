"""CosFaceHead (LMCL, eq. 4 of Wang 2018): value and gradient against a loop over the formula,
and against pytorch-metric-learning's CosFaceLoss with the same weights and hyperparameters."""

import pytest
import torch
from loss_utils import head_and_pml, head_and_reference, random_class_batch

from sslkit.losses.cosface import CosFaceHead


def cosface_reference(x, weight, labels, s, m):
    """mean_i -log( e^{s(cos_y - m)} / (e^{s(cos_y - m)} + sum_{j != y} e^{s cos_j}) ), loops, float64."""
    losses = []
    for i in range(len(x)):
        cos = [
            (x[i] @ weight[j]) / (torch.sqrt(x[i] @ x[i]) * torch.sqrt(weight[j] @ weight[j]))
            for j in range(len(weight))
        ]
        target = torch.exp(s * (cos[labels[i]] - m))
        others = sum(torch.exp(s * cos[j]) for j in range(len(weight)) if j != labels[i])
        losses.append(-torch.log(target / (target + others)))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d,c", [(1, 3, 2), (6, 5, 4), (9, 8, 7)])
@pytest.mark.parametrize("s,m", [(64.0, 0.35), (30.0, 0.0), (10.0, 0.9)])
def test_matches_reference_value_and_gradient(n, d, c, s, m):
    head = CosFaceHead(d, c, scale=s, margin=m).double()
    x, labels = random_class_batch(n, d, c, seed=n + 17 * c)
    ours, ref = head_and_reference(head, x, labels, cosface_reference, s=s, m=m)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours[2], ref[2], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("s,m", [(64.0, 0.35), (30.0, 0.2)])
def test_matches_pytorch_metric_learning(s, m):
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    head = CosFaceHead(8, 6, scale=s, margin=m).double()
    theirs = pml.CosFaceLoss(num_classes=6, embedding_size=8, margin=m, scale=s).double()
    with torch.no_grad():
        theirs.W.copy_(head.weight.T)  # PML stores W as (D, C)
    x, labels = torch.randn(12, 8, dtype=torch.float64), torch.randint(0, 6, (12,))
    ours, ref = head_and_pml(head, theirs, x, labels)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours[2], ref[2], rtol=1e-9, atol=1e-10)


def test_margin_raises_the_loss_and_zero_margin_is_normalised_softmax():
    head = CosFaceHead(6, 4, scale=20.0, margin=0.0).double()
    x, labels = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0])
    plain = torch.nn.functional.cross_entropy(head.logits(x), labels)
    torch.testing.assert_close(head(x, labels), plain)
    head.margin = 0.3
    assert head(x, labels) > plain


@pytest.mark.parametrize("name,value", [("margin", -0.1), ("margin", 1.0), ("scale", 0.0), ("scale", -64.0)])
def test_rejects_bad_arguments(name, value):
    with pytest.raises(ValueError, match=name):
        CosFaceHead(4, 3, **{name: value})
