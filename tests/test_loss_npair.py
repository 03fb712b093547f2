"""Multi-class N-pair loss: value and gradient against a loop written from Sohn 2016, against
pytorch-metric-learning's NPairsLoss, across two real processes, and under fp16/bf16 autocast."""

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import (
    assert_processes_match_one_process,
    labelled_under_autocast,
    labelled_worker,
    seeded_torch_rng,  # noqa: F401  (autouse: every test starts from torch.manual_seed(0))
    value_and_grads,
)

from sslkit.losses.npair import NPairLoss, first_pair_per_class, npair_loss

LABELS = {
    "pairs": [0, 0, 1, 1, 2, 2],
    "singleton": [0, 0, 0, 1, 1, 2],
    "one_class": [4, 4, 4, 4],
    "all_distinct": [0, 1, 2, 3, 5],
    "mixed8": [1, 0, 1, 2, 0, 1, 3, 2],
}


def npair_reference(embeddings, labels, l2_reg):
    """Sohn's multi-class N-pair loss as loops; pairs = first two samples of each label."""
    x = embeddings.double()
    pairs = []
    for c in sorted(set(labels.tolist())):
        members = [i for i in range(len(x)) if labels[i] == c]
        if len(members) >= 2:
            pairs.append((members[0], members[1]))
    if not pairs:
        return x.sum() * 0
    terms = []
    for i, (a, p) in enumerate(pairs):
        s = x.new_zeros(())
        for j, (_, p_j) in enumerate(pairs):
            if j != i:
                s = s + torch.exp(x[a] @ x[p_j] - x[a] @ x[p])
        terms.append(torch.log(1 + s) + l2_reg * (x[a] @ x[a] + x[p] @ x[p]) / 2)
    return torch.stack(terms).mean()


def test_first_pair_per_class_takes_first_two_in_batch_order():
    anchors, positives = first_pair_per_class(torch.tensor([3, 1, 3, 1, 1, 2, 3, 0]))
    assert anchors.tolist() == [1, 0] and positives.tolist() == [3, 2]


@pytest.mark.parametrize("layout", sorted(LABELS))
@pytest.mark.parametrize("d", [3, 16])
@pytest.mark.parametrize("l2_reg", [0.0, 0.01, 1.0])
@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_matches_reference_value_and_gradient(layout, d, l2_reg, scale):
    labels = torch.tensor(LABELS[layout])
    g = torch.Generator().manual_seed(len(labels) * 100 + d)
    x = torch.randn(len(labels), d, generator=g, dtype=torch.float64) * scale
    ours = value_and_grads(npair_loss, x, labels, l2_reg=l2_reg)
    ref = value_and_grads(npair_reference, x, labels, l2_reg=l2_reg)
    assert torch.isfinite(ours[0]) and torch.isfinite(ours[1]).all()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_matches_pytorch_metric_learning():
    pml_losses = pytest.importorskip("pytorch_metric_learning.losses")
    from pytorch_metric_learning.distances import DotProductSimilarity

    labels = torch.tensor([0, 3, 0, 1, 1, 2, 2, 2, 3, 4, 0, 5])
    x = torch.randn(12, 16, dtype=torch.float64)
    # Unnormalised dot products, as in the paper (theirs normalises by default).
    theirs_fn = pml_losses.NPairsLoss(distance=DotProductSimilarity(normalize_embeddings=False))
    ours = value_and_grads(npair_loss, x, labels)
    theirs = value_and_grads(theirs_fn, x, labels)
    assert ours[0] > 0
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    # Their default equals ours on L2-normalised input.
    normalized = value_and_grads(lambda e, y: npair_loss(F.normalize(e, dim=1), y), x, labels)
    theirs_default = value_and_grads(pml_losses.NPairsLoss(), x, labels)
    for a, b in zip(normalized, theirs_default):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_l2_reg_matches_tensorflow_convention():
    # TF's npairs_loss adds reg_lambda / 4 * (mean |a|^2 + mean |p|^2): l2_reg = reg_lambda / 2.
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    x = torch.randn(6, 8, dtype=torch.float64)
    anchors, positives = x[[0, 2, 4]], x[[1, 3, 5]]
    reg_lambda = 0.002
    tf_reg = 0.25 * reg_lambda * (anchors.square().sum(1).mean() + positives.square().sum(1).mean())
    diff = npair_loss(x, labels, l2_reg=reg_lambda / 2) - npair_loss(x, labels)
    torch.testing.assert_close(diff, tf_reg)


def test_pairs_are_order_invariant_within_what_is_used():
    # Permuting the pairs (not their inner order) leaves the loss unchanged.
    x = torch.randn(8, 8, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    perm = torch.tensor([6, 7, 2, 3, 0, 1, 4, 5])
    torch.testing.assert_close(npair_loss(x, labels), npair_loss(x[perm], labels[perm]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g)
    labels = torch.arange(32).repeat(2)
    got, _, rounded, expected = labelled_under_autocast(npair_loss, x, labels, dtype)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_fp16_dot_products_beyond_fp16_range_stay_finite():
    # |f|^2 ~ 80000 > 65504: an fp16 matmul would return inf; the loss computes in fp32.
    g = torch.Generator().manual_seed(0)
    anchors = torch.randn(8, 32, generator=g) * 50
    x = torch.cat([anchors, anchors + torch.randn(8, 32, generator=g)]).half()
    labels = torch.arange(8).repeat(2)
    with torch.autocast("cpu", dtype=torch.float16):
        got = npair_loss(x, labels)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, npair_loss(x.float(), labels), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_rejects_bad_l2_reg(bad):
    with pytest.raises(ValueError, match="l2_reg"):
        NPairLoss(l2_reg=bad)


def test_rejects_missing_or_mismatched_labels():
    loss_fn = NPairLoss()
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8))
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 8), torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="embeddings"):
        loss_fn(torch.randn(4), torch.tensor([0, 1, 0, 1]))


@pytest.mark.slow
def test_two_processes_match_one_process_on_whole_batch():
    # Pairs within rank 0 (class 0), within rank 1 (class 4), across ranks (classes 1, 3);
    # class 2 has one sample; class 0's third sample (on rank 1) is unused.
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 4, 4, 0, 3])
    x = torch.randn(10, 6, dtype=torch.float64)
    expected = value_and_grads(npair_loss, x, labels, l2_reg=0.05)
    results = run_in_processes(labelled_worker, NPairLoss, [dict(l2_reg=0.05)], x, labels)
    assert_processes_match_one_process([r[0] for r in results], expected)
