"""CoCoHead (congenerous cosine): value and gradient against a loop over the COCO formula
(features rescaled to radius alpha, normalised centroids)."""

import pytest
import torch
from loss_utils import head_and_reference

from sslkit.losses.coco import CoCoHead


def coco_reference(x, centroids, labels, alpha):
    """x_hat = alpha x/||x||, c_hat = c/||c||; mean_i -log( exp(c_hat_y.x_hat_i) / sum_k exp(c_hat_k.x_hat_i) )."""
    losses = []
    for i in range(len(x)):
        x_hat = alpha * x[i] / torch.sqrt(x[i] @ x[i])
        logits = [(centroids[k] / torch.sqrt(centroids[k] @ centroids[k])) @ x_hat for k in range(len(centroids))]
        losses.append(-torch.log(torch.exp(logits[labels[i]]) / sum(torch.exp(z) for z in logits)))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d,c", [(1, 2, 2), (5, 6, 4), (8, 4, 9)])
@pytest.mark.parametrize("alpha", [1.0, 6.25, 20.0])
def test_matches_reference_value_and_gradient(n, d, c, alpha):
    g = torch.Generator().manual_seed(7 * n + c)
    head = CoCoHead(d, c, alpha=alpha).double()
    x = torch.randn(n, d, dtype=torch.float64, generator=g) * 0.3
    labels = torch.randint(0, c, (n,), generator=g)
    labels[-1] = 0
    ours, ref = head_and_reference(head, x, labels, coco_reference, alpha=alpha)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours[2], ref[2], rtol=1e-9, atol=1e-12)


def test_loss_does_not_depend_on_embedding_or_centroid_length():
    head = CoCoHead(5, 3).double()
    x, labels = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 2])
    base = head(x, labels)
    torch.testing.assert_close(head(x * 7.5, labels), base)
    with torch.no_grad():
        head.weight.mul_(torch.tensor([[0.1], [3.0], [40.0]], dtype=torch.float64))
    torch.testing.assert_close(head(x, labels), base)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_rejects_bad_alpha(bad):
    with pytest.raises(ValueError, match="alpha"):
        CoCoHead(4, 3, alpha=bad)
