"""Miners: the pairs each keeps against loops written from the papers and against pytorch-metric-learning's
miners; every pair loss on mined pairs against a loop of its formula over those pairs (value and
gradient, float64); and the mining of two real processes against one process on the whole batch."""

import math

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_in_processes
from loss_utils import rank_slice, value_and_grads

from sslkit.losses import build
from sslkit.losses._common import batch_references, pair_masks
from sslkit.losses.miners import distance_weighted_probabilities, mine, mined_triplets

MINERS = [None, "multi_similarity", "batch_hard", "semi_hard"]
LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 3, 2, 0, 1])


def batch(seed=3, n=12, d=6):
    x = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return x, LABELS[:n]


def mined_reference(x, labels, miner, epsilon):
    """Per anchor i: its kept positives, its kept negatives and its triplets (p, n), as loops from the papers."""
    z = F.normalize(x.detach().double(), dim=1)
    n = len(z)

    def s(i, j):
        return float(z[i] @ z[j])

    def d(i, j):
        return float((z[i] - z[j]).norm())

    out = []
    for i in range(n):
        pos = [j for j in range(n) if j != i and labels[j] == labels[i]]
        neg = [k for k in range(n) if labels[k] != labels[i]]
        if miner == "multi_similarity":  # Wang et al.'s pair mining
            kept_pos = [j for j in pos if neg and s(i, j) - epsilon < max(s(i, k) for k in neg)]
            kept_neg = [k for k in neg if pos and s(i, k) + epsilon > min(s(i, j) for j in pos)]
            pos, neg = kept_pos, kept_neg
        elif miner == "batch_hard":  # Hermans et al.: farthest positive, closest negative
            if pos and neg:
                pos, neg = [max(pos, key=lambda j: d(i, j))], [min(neg, key=lambda k: d(i, k))]
            else:
                pos, neg = [], []
        if miner == "semi_hard":  # FaceNet Sec. 3.2, window epsilon
            triplets = [(j, k) for j in pos for k in neg if d(i, j) < d(i, k) < d(i, j) + epsilon]
            pos, neg = sorted({j for j, _ in triplets}), sorted({k for _, k in triplets})
        else:
            triplets = [(j, k) for j in pos for k in neg]
        out.append((pos, neg, triplets))
    return out


def contrastive_on_pairs(x, labels, mined, neg_margin=1.0):
    z = F.normalize(x, dim=1)
    terms = [(z[i] - z[j]).norm() ** 2 for i, (pos, _, _) in enumerate(mined) for j in pos]
    terms += [torch.relu(neg_margin - (z[i] - z[k]).norm()) ** 2 for i, (_, neg, _) in enumerate(mined) for k in neg]
    return torch.stack(terms).mean() if terms else x.sum() * 0


def triplet_on_pairs(x, labels, mined, margin=0.2):
    z = F.normalize(x, dim=1)
    terms = [
        torch.relu(((z[i] - z[j]) ** 2).sum() - ((z[i] - z[k]) ** 2).sum() + margin)
        for i, (_, _, triplets) in enumerate(mined)
        for j, k in triplets
    ]
    return torch.stack(terms).mean() if terms else x.sum() * 0


def lifted_on_pairs(x, labels, mined, margin=1.0):
    z = F.normalize(x, dim=1)
    terms = []
    for i, (pos, neg_i, _) in enumerate(mined):
        for j in pos:
            exps = [torch.exp(margin - (z[i] - z[k]).norm()) for k in neg_i]
            exps += [torch.exp(margin - (z[j] - z[k]).norm()) for k in mined[j][1]]
            if not exps:  # log(0): the hinge is 0
                terms.append(0 * z[i, 0])
                continue
            terms.append(torch.relu(torch.log(torch.stack(exps).sum()) + (z[i] - z[j]).norm()) ** 2)
    return torch.stack(terms).sum() / (2 * len(terms)) if terms else x.sum() * 0


def circle_on_pairs(x, labels, mined, margin=0.25, gamma=256.0):
    z = F.normalize(x, dim=1)
    losses = []
    for i, (pos, neg, _) in enumerate(mined):
        if not pos or not neg:
            continue
        terms = [torch.zeros((), dtype=z.dtype)]
        for k in neg:
            s_n = z[i] @ z[k]
            a_n = torch.clamp(s_n + margin, min=0).detach()
            for j in pos:
                s_p = z[i] @ z[j]
                a_p = torch.clamp(1 + margin - s_p, min=0).detach()
                terms.append(gamma * (a_n * (s_n - margin) - a_p * (s_p - (1 - margin))))
        losses.append(torch.logsumexp(torch.stack(terms), dim=0))
    return torch.stack(losses).mean() if losses else x.sum() * 0


def supcon_on_pairs(x, labels, mined, temperature=0.1):
    z = F.normalize(x, dim=1)
    losses = []
    for i, (pos, neg, _) in enumerate(mined):
        if not pos:
            continue
        denominator = sum(torch.exp(z[i] @ z[a] / temperature) for a in pos + neg)
        losses.append(-sum(torch.log(torch.exp(z[i] @ z[p] / temperature) / denominator) for p in pos) / len(pos))
    return torch.stack(losses).mean() if losses else x.sum() * 0


def multi_similarity_on_pairs(x, labels, mined, alpha=2.0, beta=50.0, base=0.5):
    z = F.normalize(x, dim=1)
    one = torch.ones((), dtype=z.dtype)
    terms = [
        torch.log(one + sum(torch.exp(-alpha * (z[i] @ z[j] - base)) for j in pos)) / alpha
        + torch.log(one + sum(torch.exp(beta * (z[i] @ z[k] - base)) for k in neg)) / beta
        for i, (pos, neg, _) in enumerate(mined)
    ]
    return torch.stack(terms).mean()


ON_PAIRS = {
    "contrastive": contrastive_on_pairs,
    "triplet": triplet_on_pairs,
    "lifted": lifted_on_pairs,
    "circle": circle_on_pairs,
    "supcon": supcon_on_pairs,
    "multi_similarity": multi_similarity_on_pairs,
}


@pytest.mark.parametrize("epsilon", [0.1, 0.4])
@pytest.mark.parametrize("miner", MINERS)
def test_mined_pairs_match_loops(miner, epsilon):
    x, labels = batch()
    references = batch_references(x, labels, gather_distributed=False)
    mined = mine(miner, epsilon, x, references, *pair_masks(labels, references))
    anchor, positive, valid = mined_triplets(mined)
    expected = mined_reference(x, labels, miner, epsilon)
    for i, (pos, neg, triplets) in enumerate(expected):
        assert mined.positive[i].nonzero().flatten().tolist() == pos
        assert mined.negative[i].nonzero().flatten().tolist() == neg
        rows = (anchor == i).nonzero().flatten()
        got = sorted((int(positive[r]), int(k)) for r in rows for k in valid[r].nonzero().flatten())
        assert got == sorted(triplets)
    all_negatives = pair_masks(labels, references)[1].sum()
    assert 0 < mined.positive.sum() and (miner is None or mined.negative.sum() < all_negatives)


@pytest.mark.parametrize("miner", MINERS)
@pytest.mark.parametrize("name", sorted(ON_PAIRS))
def test_every_pair_loss_on_mined_pairs_matches_its_loop(name, miner):
    x, labels = batch()
    epsilon = 0.4  # a wide semi-hard window: enough triplets on 12 samples
    ours = value_and_grads(build(name, miner=miner, epsilon=epsilon), x, labels)
    mined = mined_reference(x, labels, miner, epsilon)
    ref = value_and_grads(lambda x, labels: ON_PAIRS[name](x, labels, mined), x, labels)
    assert ours[0] > 0
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def _pml_pairs(mined_tuple, n):
    """pytorch-metric-learning's miner output as (n, n) positive and negative masks."""
    positive, negative = torch.zeros(n, n, dtype=torch.bool), torch.zeros(n, n, dtype=torch.bool)
    if len(mined_tuple) == 3:
        a, p, k = mined_tuple
        mined_tuple = (a, p, a, k)
    a1, p, a2, k = mined_tuple
    positive[a1, p] = True
    negative[a2, k] = True
    return positive, negative


@pytest.mark.parametrize("epsilon", [0.1, 0.3])
def test_multi_similarity_miner_matches_pytorch_metric_learning(epsilon):
    miners = pytest.importorskip("pytorch_metric_learning.miners")
    x, labels = batch(seed=7)
    references = batch_references(x, labels, gather_distributed=False)
    mined = mine("multi_similarity", epsilon, x, references, *pair_masks(labels, references))
    theirs = _pml_pairs(miners.MultiSimilarityMiner(epsilon=epsilon)(x, labels), len(x))
    assert torch.equal(mined.positive, theirs[0]) and torch.equal(mined.negative, theirs[1])
    assert mined.negative.sum() < pair_masks(labels, references)[1].sum()


def test_batch_hard_miner_matches_pytorch_metric_learning():
    miners = pytest.importorskip("pytorch_metric_learning.miners")
    x, labels = batch(seed=8)
    references = batch_references(x, labels, gather_distributed=False)
    mined = mine("batch_hard", 0.1, x, references, *pair_masks(labels, references))
    theirs = _pml_pairs(miners.BatchHardMiner()(x, labels), len(x))
    assert torch.equal(mined.positive, theirs[0]) and torch.equal(mined.negative, theirs[1])


@pytest.mark.parametrize("epsilon", [0.2, 0.5])
def test_semi_hard_miner_matches_pytorch_metric_learning(epsilon):
    miners = pytest.importorskip("pytorch_metric_learning.miners")
    x, labels = batch(seed=9)
    references = batch_references(x, labels, gather_distributed=False)
    mined = mine("semi_hard", epsilon, x, references, *pair_masks(labels, references))
    anchor, positive, valid = mined_triplets(mined)
    ours = sorted((int(anchor[r]), int(positive[r]), int(k)) for r in range(len(anchor)) for k in valid[r].nonzero())
    a, p, k = miners.TripletMarginMiner(margin=epsilon, type_of_triplets="semihard")(x, labels)
    assert ours == sorted(zip(a.tolist(), p.tolist(), k.tolist())) and ours


def test_distance_weighted_probabilities_match_pytorch_metric_learning(monkeypatch):
    miners = pytest.importorskip("pytorch_metric_learning.miners")
    from pytorch_metric_learning.miners import distance_weighted_miner

    captured = {}
    original = distance_weighted_miner.lmu.get_random_triplet_indices

    def capture(labels, ref_labels=None, t_per_anchor=None, weights=None):
        captured["weights"] = weights
        return original(labels, ref_labels=ref_labels, t_per_anchor=t_per_anchor, weights=weights)

    monkeypatch.setattr(distance_weighted_miner.lmu, "get_random_triplet_indices", capture)
    x, labels = batch(seed=4, n=12, d=8)
    miners.DistanceWeightedMiner()(x, labels)
    theirs = captured["weights"]
    z = F.normalize(x, dim=1)
    dist = torch.cdist(z, z)
    ours = distance_weighted_probabilities(dist, labels[:, None] != labels[None, :], x.shape[1])
    rows = theirs.sum(dim=1) > 0  # theirs: NaN rows (no eligible negative) are skipped when drawing
    torch.testing.assert_close(ours[rows], theirs[rows], rtol=1e-9, atol=1e-12)
    assert rows.sum() >= 10 and (ours[~rows] == 0).all()


def test_distance_weighted_probabilities_match_the_formula():
    x, labels = batch(seed=5, n=10, d=5)
    z = F.normalize(x, dim=1)
    dist = torch.cdist(z, z)
    ours = distance_weighted_probabilities(dist, labels[:, None] != labels[None, :], 5)
    for i in range(10):
        weights = []
        for k in range(10):
            d = max(float(dist[i, k]), 0.5)  # Wu et al. Sec. 4: q(d)^-1, d clipped at 0.5, none past 1.4
            eligible = labels[k] != labels[i] and dist[i, k] < 1.4
            weights.append(d ** (2 - 5) * (1 - d * d / 4) ** (-(5 - 3) / 2) if eligible else 0.0)
        total = sum(weights)
        expected = torch.tensor([w / total if total else 0.0 for w in weights], dtype=torch.float64)
        torch.testing.assert_close(ours[i], expected, rtol=1e-10, atol=1e-14)


def test_distance_weighted_draws_one_eligible_negative_per_positive_pair():
    x, labels = batch(seed=6, n=12, d=8)
    references = batch_references(x, labels, gather_distributed=False)
    positive, negative = pair_masks(labels, references)
    mined = mine("distance_weighted", 0.1, x, references, positive, negative)
    anchor, positive_idx, valid = mined.triplets
    z = F.normalize(x, dim=1)
    probabilities = distance_weighted_probabilities(torch.cdist(z, z), negative, 8)
    assert torch.equal(valid.sum(dim=1), (probabilities[anchor].sum(dim=1) > 0).long())  # one draw per pair
    assert (probabilities[anchor][valid] > 0).all()  # never a negative of probability 0
    assert math.isclose(float(valid.sum()), float(positive.sum()), rel_tol=0.2)


def _seeded_worker(rank, world, cases, x, labels):
    """Each case from the same generator state on every process (the distance-weighted draws)."""
    results = []
    for name, kwargs in cases:
        torch.manual_seed(0)
        local = rank_slice(x, rank, world).clone().requires_grad_(True)
        loss = build(name, **kwargs)(local, rank_slice(labels, rank, world))
        loss.backward()
        results.append((loss.detach(), local.grad))
    return results


@pytest.mark.slow
def test_two_processes_mine_as_one_process_on_the_whole_batch():
    x, labels = batch(seed=1)
    cases = [
        (name, dict(miner=miner, epsilon=0.4))
        for name in sorted(ON_PAIRS)
        for miner in ("multi_similarity", "batch_hard", "semi_hard", "distance_weighted")
    ]
    results = run_in_processes(_seeded_worker, cases, x, labels)
    for k, (name, kwargs) in enumerate(cases):
        torch.manual_seed(0)
        loss, grad = value_and_grads(build(name, **kwargs), x, labels)
        assert loss > 0, (name, kwargs)
        torch.testing.assert_close(torch.stack([r[k][0] for r in results]).mean(), loss, msg=f"{name} {kwargs}")
        torch.testing.assert_close(torch.cat([r[k][1] for r in results]) / 2, grad, msg=f"{name} {kwargs}")
