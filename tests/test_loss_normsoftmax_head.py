"""NormSoftmaxHead (NormFace / Zhai 2018): value and gradient against a loop over cos / T, and
against pytorch-metric-learning's NormalizedSoftmaxLoss with the same weights."""

import math

import pytest
import torch
from loss_utils import head_and_pml, head_and_reference, random_class_batch

from sslkit.losses.normsoftmax import NormSoftmaxHead


def cosine(a, b):
    return (a @ b) / (torch.sqrt(a @ a) * torch.sqrt(b @ b))


def normsoftmax_reference(x, weight, labels, temperature):
    """mean_i -log( exp(cos(x_i, W_y)/T) / sum_j exp(cos(x_i, W_j)/T) ), loops, float64."""
    losses = []
    for i in range(len(x)):
        logits = [cosine(x[i], weight[j]) / temperature for j in range(len(weight))]
        losses.append(-logits[labels[i]] + torch.log(sum(torch.exp(z) for z in logits)))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("n,d,c", [(1, 3, 2), (6, 5, 4), (9, 8, 7)])
@pytest.mark.parametrize("temperature", [0.05, 0.3, 1.0])
def test_matches_reference_value_and_gradient(n, d, c, temperature):
    head = NormSoftmaxHead(d, c, temperature=temperature).double()
    x, labels = random_class_batch(n, d, c, seed=n + 100 * c)
    ours, ref = head_and_reference(head, x * 3, labels, normsoftmax_reference, temperature=temperature)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("temperature", [0.05, 0.5])
def test_matches_pytorch_metric_learning(temperature):
    pml = pytest.importorskip("pytorch_metric_learning.losses")
    head = NormSoftmaxHead(8, 5, temperature=temperature).double()
    theirs = pml.NormalizedSoftmaxLoss(num_classes=5, embedding_size=8, temperature=temperature).double()
    with torch.no_grad():
        theirs.W.copy_(head.weight.T)  # PML stores W as (D, C)
    x, labels = torch.randn(10, 8, dtype=torch.float64), torch.randint(0, 5, (10,))
    ours, ref = head_and_pml(head, theirs, x, labels)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours[2], ref[2], rtol=1e-9, atol=1e-12)


def test_embeddings_on_their_class_weight_give_the_closed_form():
    # cos = 1 for the target and the same c for every other class: loss = log(1 + (C-1) e^{(c-1)/T}).
    head = NormSoftmaxHead(3, 3, temperature=0.25).double()
    with torch.no_grad():
        head.weight.copy_(torch.eye(3, dtype=torch.float64))
    x = torch.eye(3, dtype=torch.float64) * 5
    expected = math.log(1 + 2 * math.exp(-1 / 0.25))
    assert head(x, torch.arange(3)).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", [0.0, -0.05, float("nan"), float("inf")])
def test_rejects_bad_temperature(bad):
    with pytest.raises(ValueError, match="temperature"):
        NormSoftmaxHead(4, 3, temperature=bad)
