"""SphereFaceHead (A-Softmax): value and gradient against a loop over the A-Softmax formula
(acos, psi on its interval, ||W|| = 1), with and without the lambda annealing, and against
pytorch-metric-learning's SphereFaceLoss."""

import math

import pytest
import torch
from loss_utils import head_and_pml, head_and_reference, random_class_batch

from sslkit.losses.lsoftmax import margin_lambda
from sslkit.losses.sphereface import SphereFaceHead


def sphereface_reference(x, weight, labels, m, lam):
    """Target ||x|| (lam cos + psi(theta))/(1 + lam), others ||x|| cos theta_j (unit W); mean CE."""
    losses = []
    for i in range(len(x)):
        x_norm = torch.sqrt(x[i] @ x[i])
        logits = []
        for j in range(len(weight)):
            cos = (x[i] @ weight[j]) / (x_norm * torch.sqrt(weight[j] @ weight[j]))
            if j == labels[i]:
                theta = torch.acos(cos)
                k = min(int(math.floor(float(theta.detach()) * m / math.pi)), m - 1)
                psi = (-1) ** k * torch.cos(m * theta) - 2 * k
                logits.append(x_norm * (lam * cos + psi) / (1 + lam))
            else:
                logits.append(x_norm * cos)
        losses.append(-logits[labels[i]] + torch.log(sum(torch.exp(z) for z in logits)))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d,c", [(1, 3, 2), (7, 5, 4), (8, 8, 9)])
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("step", [0, 300, 10**5])
def test_matches_reference_value_and_gradient(n, d, c, m, step):
    head = SphereFaceHead(d, c, margin=m).double()
    head.set_step(step)
    x, labels = random_class_batch(n, d, c, seed=n * 13 + c + m)
    lam = margin_lambda(step, 1000.0, 0.12, 1.0, 5.0)
    ours, ref = head_and_reference(head, x * 2, labels, sphereface_reference, m=m, lam=lam)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_default_schedule_is_the_released_one_and_follows_the_step():
    head = SphereFaceHead(4, 3)
    assert head.lambda_ == 1000.0
    head.set_step(1000)
    assert head.lambda_ == pytest.approx(1000.0 / (1 + 0.12 * 1000))
    head.set_step(10**6)
    assert head.lambda_ == 5.0
    x, labels = torch.randn(6, 4), torch.randint(0, 3, (6,))
    annealed = head(x, labels)
    head.set_step(0)
    assert head(x, labels) < annealed  # a larger lambda means less margin, so a lower loss


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy 2 vs scipy.special inside PML
@pytest.mark.parametrize("m", [1, 2, 4])
def test_matches_pytorch_metric_learning_without_annealing(m):
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    head = SphereFaceHead(8, 5, margin=m, lambda_base=0.0, lambda_min=0.0).double()
    theirs = pml.SphereFaceLoss(num_classes=5, embedding_size=8, margin=m, scale=1).double()
    with torch.no_grad():
        theirs.W.copy_(head.weight.T * 3)  # PML stores W as (D, C); its norm must not matter
    x, labels = torch.randn(10, 8, dtype=torch.float64) * 2, torch.randint(0, 5, (10,))
    ours, ref = head_and_pml(head, theirs, x, labels)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(ours[2], ref[2] * 3, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("bad", [0, 2.5, -4])
def test_rejects_bad_margin(bad):
    with pytest.raises(ValueError, match="margin"):
        SphereFaceHead(4, 3, margin=bad)
