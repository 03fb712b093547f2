"""LSoftmaxHead (Liu 2016): psi(theta) against its angle definition (acos, k from the interval),
value and gradient against a loop over the L-Softmax formula, pytorch-metric-learning's
LargeMarginSoftmaxLoss, and the lambda annealing."""

import math

import pytest
import torch
from loss_utils import head_and_pml, head_and_reference, random_class_batch

from sslkit.losses.lsoftmax import LSoftmaxHead, large_margin_psi, margin_lambda
from sslkit.losses.softmax import SoftmaxHead


def psi_reference(theta, m):
    """psi(theta) = (-1)^k cos(m theta) - 2k on [k pi/m, (k+1) pi/m], k in {0..m-1} (eq. 6)."""
    k = min(int(math.floor(float(theta.detach()) * m / math.pi)), m - 1)
    return (-1) ** k * torch.cos(m * theta) - 2 * k


def lsoftmax_reference(x, weight, labels, m, lam=0.0):
    """Target logit ||W_y|| ||x|| (lam cos + psi)/(1 + lam), others W_j.x; mean CE. Loops, float64."""
    losses = []
    for i in range(len(x)):
        logits = []
        for j in range(len(weight)):
            norms = torch.sqrt(x[i] @ x[i]) * torch.sqrt(weight[j] @ weight[j])
            cos = (x[i] @ weight[j]) / norms
            if j == labels[i]:
                theta = torch.acos(cos)
                logits.append(norms * (lam * cos + psi_reference(theta, m)) / (1 + lam))
            else:
                logits.append(norms * cos)
        losses.append(-logits[labels[i]] + torch.log(sum(torch.exp(z) for z in logits)))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_psi_from_cos_matches_the_angle_definition(m):
    theta = torch.linspace(0, math.pi, 721, dtype=torch.float64)
    expected = torch.stack([psi_reference(t, m) for t in theta])
    torch.testing.assert_close(large_margin_psi(torch.cos(theta), m), expected, rtol=0, atol=1e-9)
    # psi is continuous and decreasing on [0, pi]: the margin never rewards a larger angle.
    assert (expected[1:] <= expected[:-1] + 1e-12).all()


def test_psi_gradient_is_finite_at_cos_plus_minus_one():
    cos = torch.tensor([1.0, -1.0, 0.3], dtype=torch.float64, requires_grad=True)
    large_margin_psi(cos, 4).sum().backward()
    assert torch.isfinite(cos.grad).all()
    # d psi / d cos at theta = 0 is m^2 (T_m'(1)), from the Chebyshev polynomial, not from acos.
    assert cos.grad[0].item() == pytest.approx(16.0)


def _check_against_reference(head, x, labels, **kwargs):
    ours, ref = head_and_reference(head, x, labels, lsoftmax_reference, **kwargs)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(ours[2], ref[2], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("n,d,c", [(1, 3, 2), (6, 4, 5), (9, 8, 3)])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_matches_reference_value_and_gradient(n, d, c, m):
    head = LSoftmaxHead(d, c, margin=m).double()
    x, labels = random_class_batch(n, d, c, seed=n * 31 + m)
    _check_against_reference(head, x, labels, m=m)


@pytest.mark.parametrize("step", [0, 50, 10**6])
def test_annealed_target_matches_reference(step):
    head = LSoftmaxHead(6, 4, margin=3, lambda_base=100.0, lambda_gamma=0.5, lambda_power=1.0, lambda_min=2.0).double()
    head.set_step(step)
    lam = margin_lambda(step, 100.0, 0.5, 1.0, 2.0)
    assert head.lambda_ == lam
    x, labels = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 3])
    _check_against_reference(head, x, labels, m=3, lam=lam)


def test_margin_lambda_is_a_pure_decreasing_function_of_the_step():
    values = [margin_lambda(s, 1000.0, 0.12, 1.0, 5.0) for s in (0, 10, 100, 1000, 10**6)]
    assert values[0] == 1000.0 and values[-1] == 5.0
    assert values == sorted(values, reverse=True)
    assert margin_lambda(100, 1000.0, 0.12, 1.0, 5.0) == values[2]  # no hidden state
    assert margin_lambda(7, 0.0, 0.12, 1.0, 0.0) == 0.0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy 2 vs scipy.special inside PML
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_matches_pytorch_metric_learning(m):
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    head = LSoftmaxHead(8, 5, margin=m).double()
    with torch.no_grad():
        head.weight.mul_(torch.rand(5, 1, dtype=torch.float64) * 2 + 0.5)  # unequal ||W_j||: they matter here
    theirs = pml.LargeMarginSoftmaxLoss(num_classes=5, embedding_size=8, margin=m, scale=1).double()
    with torch.no_grad():
        theirs.W.copy_(head.weight.T)  # PML stores W as (D, C)
    x, labels = torch.randn(10, 8, dtype=torch.float64), torch.randint(0, 5, (10,))
    ours, ref = head_and_pml(head, theirs, x, labels)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(ours[2], ref[2], rtol=1e-8, atol=1e-10)


def test_margin_one_is_softmax_without_bias():
    head = LSoftmaxHead(6, 4, margin=1).double()
    plain = SoftmaxHead(6, 4, bias=False).double()
    with torch.no_grad():
        plain.weight.copy_(head.weight)
    x, labels = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 3, 1, 1, 2])
    torch.testing.assert_close(head(x, labels), plain(x, labels))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_rejects_bad_margin(bad):
    with pytest.raises(ValueError, match="margin"):
        LSoftmaxHead(4, 3, margin=bad)


@pytest.mark.parametrize("name", ["lambda_base", "lambda_gamma", "lambda_power", "lambda_min"])
def test_rejects_bad_schedule(name):
    with pytest.raises(ValueError, match=name):
        LSoftmaxHead(4, 3, **{name: -1.0})
    with pytest.raises(ValueError, match="step"):
        LSoftmaxHead(4, 3).set_step(-1)
