"""Multi-Similarity loss: value and gradient against a loop written from Wang et al.'s formula (with and
without the paper's pair mining), against pytorch-metric-learning's MultiSimilarityLoss and
MultiSimilarityMiner, across two real processes, and under fp16/bf16 autocast."""

import math

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import (
    LABEL_LAYOUTS,
    assert_processes_match_one_process,
    labelled_under_autocast,
    labelled_worker,
    random_labelled_batch,
    seeded_torch_rng,  # noqa: F401  (autouse: every test starts from torch.manual_seed(0))
    value_and_grads,
)

from sslkit.losses import build
from sslkit.losses.multi_similarity import MultiSimilarityLoss, multi_similarity_loss


def multi_similarity_reference(embeddings, labels, alpha, beta, base, epsilon=None):
    """The MS loss as loops over anchors and pairs, float64; with ``epsilon``, the paper's pair mining first."""
    z = F.normalize(embeddings.double(), dim=1)
    n = len(z)
    terms = []
    for i in range(n):
        pos = [z[i] @ z[k] for k in range(n) if k != i and labels[k] == labels[i]]
        neg = [z[i] @ z[k] for k in range(n) if labels[k] != labels[i]]
        if epsilon is not None:
            pos_mined = [s for s in pos if neg and s - epsilon < max(neg)]  # below the hardest negative + eps
            neg_mined = [s for s in neg if pos and s + epsilon > min(pos)]  # above the easiest positive - eps
            pos, neg = pos_mined, neg_mined
        one = torch.ones((), dtype=torch.float64)
        pull = torch.log(one + sum(torch.exp(-alpha * (s - base)) for s in pos)) / alpha
        push = torch.log(one + sum(torch.exp(beta * (s - base)) for s in neg)) / beta
        terms.append(pull + push)
    return torch.stack(terms).mean() + 0 * embeddings.sum()


@pytest.mark.parametrize("layout", sorted(LABEL_LAYOUTS))
@pytest.mark.parametrize("alpha,beta,base", [(2.0, 50.0, 0.5), (2.0, 10.0, 0.0), (0.5, 4.0, 1.0)])
@pytest.mark.parametrize("epsilon", [None, 0.1, 0.5])
def test_matches_reference_value_and_gradient(layout, alpha, beta, base, epsilon):
    labels = torch.tensor(LABEL_LAYOUTS[layout])
    g = torch.Generator().manual_seed(len(labels) * 11)
    x = torch.randn(len(labels), 8, generator=g, dtype=torch.float64)
    miner = None if epsilon is None else "multi_similarity"
    kwargs = dict(alpha=alpha, beta=beta, base=base)
    ours = value_and_grads(multi_similarity_loss, x, labels, miner=miner, epsilon=epsilon or 0.1, **kwargs)
    ref = value_and_grads(multi_similarity_reference, x, labels, epsilon=epsilon, **kwargs)
    assert torch.isfinite(ours[0]) and torch.isfinite(ours[1]).all()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_mining_changes_the_loss_on_a_larger_batch():
    # Guards the test above: on this batch the paper's mining drops pairs, so the two differ.
    x, labels = random_labelled_batch(24, 8, num_classes=4, seed=2)
    x = x.double()
    mined = multi_similarity_loss(x, labels, miner="multi_similarity")
    assert not torch.isclose(mined, multi_similarity_loss(x, labels))
    torch.testing.assert_close(mined, multi_similarity_reference(x, labels, 2.0, 50.0, 0.5, epsilon=0.1))


def test_closed_form_for_identical_embeddings():
    # Every similarity is 1: l_i = log(1 + |P| e^{-a(1-l)}) / a + log(1 + |N| e^{b(1-l)}) / b.
    x = torch.ones(6, 4, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    expected = []
    for y in labels.tolist():
        p, n = (labels == y).sum().item() - 1, (labels != y).sum().item()
        expected.append(math.log(1 + p * math.exp(-2 * 0.5)) / 2 + math.log(1 + n * math.exp(50 * 0.5)) / 50)
    torch.testing.assert_close(multi_similarity_loss(x, labels).item(), sum(expected) / 6)


def test_order_invariant():
    x = torch.randn(12, 8, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 3, 3, 4, 0, 5, 1])
    perm = torch.randperm(12)
    for miner in (None, "multi_similarity"):
        torch.testing.assert_close(
            multi_similarity_loss(x, labels, miner=miner), multi_similarity_loss(x[perm], labels[perm], miner=miner)
        )


@pytest.mark.parametrize("mined", [False, True])
@pytest.mark.parametrize("alpha,beta,base", [(2.0, 50.0, 0.5), (1.0, 20.0, 0.3)])
def test_matches_pytorch_metric_learning(mined, alpha, beta, base):
    losses = pytest.importorskip("pytorch_metric_learning.losses")
    from pytorch_metric_learning import miners

    theirs_loss = losses.MultiSimilarityLoss(alpha=alpha, beta=beta, base=base)
    miner = miners.MultiSimilarityMiner(epsilon=0.1)

    def theirs(embeddings, labels):
        return theirs_loss(embeddings, labels, miner(embeddings, labels) if mined else None)

    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 4, 4, 1])
    x = torch.randn(12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    kwargs = dict(alpha=alpha, beta=beta, base=base, miner="multi_similarity" if mined else None)
    ours = value_and_grads(multi_similarity_loss, x, labels, **kwargs)
    ref = value_and_grads(theirs, x, labels)
    assert ours[0] > 0
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    x, labels = random_labelled_batch(64, 32, num_classes=8, seed=0)
    loss_fn = MultiSimilarityLoss(miner="multi_similarity")
    got, grad, rounded, expected = labelled_under_autocast(loss_fn, x, labels, dtype, backward=True)
    assert got.dtype == torch.float32 and torch.isfinite(got) and torch.isfinite(grad).all()
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, expected, rtol=5e-2, atol=2e-2)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"alpha": 0.0}, "alpha"),
        ({"beta": -1.0}, "beta"),
        ({"base": 1.5}, "base"),
        ({"miner": "hard"}, "miner"),
        ({"epsilon": -0.1}, "epsilon"),
        ({"memory_size": 2.5}, "memory_size"),
    ],
)
def test_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MultiSimilarityLoss(**kwargs)
    with pytest.raises(ValueError, match=name):
        build("multi_similarity", **kwargs)


def test_rejects_missing_labels():
    with pytest.raises(ValueError, match="labels"):
        MultiSimilarityLoss()(torch.randn(4, 8))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    # Classes straddle the halves, class 3 has one sample.
    labels = torch.tensor([0, 1, 2, 3, 0, 0, 1, 2, 1, 0])
    x = torch.randn(10, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cases = [dict(), dict(miner="multi_similarity", epsilon=0.2), dict(alpha=1.0, beta=10.0, base=0.2)]
    results = run_in_processes(labelled_worker, MultiSimilarityLoss, cases, x, labels)
    for k, kwargs in enumerate(cases):
        expected = value_and_grads(multi_similarity_loss, x, labels, **kwargs)
        assert expected[0] > 0
        assert_processes_match_one_process([r[k] for r in results], expected)
