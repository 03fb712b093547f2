"""SoftmaxHead: value and gradient (embeddings, weight, bias) against a loop over the softmax
formula, and against torch's own linear + cross-entropy."""

import pytest
import torch
import torch.nn.functional as F
from loss_utils import random_class_batch

from sslkit.losses.softmax import SoftmaxHead


def softmax_reference(x, weight, bias, labels):
    """mean_i -log( exp(W_y.x_i + b_y) / sum_j exp(W_j.x_i + b_j) ), as loops, float64."""
    losses = []
    for i in range(len(x)):
        logits = [x[i] @ weight[j] + (bias[j] if bias is not None else 0) for j in range(len(weight))]
        denominator = sum(torch.exp(z) for z in logits)
        losses.append(-torch.log(torch.exp(logits[labels[i]]) / denominator))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d,c", [(1, 3, 2), (5, 4, 3), (8, 6, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_reference_value_and_gradient(n, d, c, bias):
    head = SoftmaxHead(d, c, bias=bias).double()
    x, labels = random_class_batch(n, d, c, seed=n * 10 + c)
    x1 = x.clone().requires_grad_(True)
    loss = head(x1, labels)
    loss.backward()
    x2 = x.clone().requires_grad_(True)
    w2 = head.weight.detach().clone().requires_grad_(True)
    b2 = head.bias.detach().clone().requires_grad_(True) if bias else None
    ref = softmax_reference(x2, w2, b2, labels)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, w2.grad, rtol=1e-10, atol=1e-12)
    if bias:
        torch.testing.assert_close(head.bias.grad, b2.grad, rtol=1e-10, atol=1e-12)


def test_logits_are_the_linear_layer():
    head = SoftmaxHead(6, 4)
    x = torch.randn(3, 6)
    torch.testing.assert_close(head.logits(x), F.linear(x, head.weight, head.bias))
    assert SoftmaxHead(6, 4, bias=False).bias is None
