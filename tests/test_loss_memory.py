"""Cross-batch memory: the first-in first-out memory itself; each pair loss with a memory as its batch
loss plus pytorch-metric-learning's CrossBatchMemory loss over the same memory, or a loop of the
paper's formula over it (value and gradient, float64, over steps that wrap the memory); one memory
on two real processes as on one process; saved and restored with the state_dict."""

import pytest
import torch
from dist_utils import run_in_processes
from loss_utils import rank_slice, value_and_grads

from sslkit.losses import build, check_loss_kwargs
from sslkit.losses.memory import CrossBatchMemory

LABELS = torch.tensor([0, 1, 2, 0, 1, 3, 2, 1, 0, 3, 2, 0])


def batches(steps=4, n=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, d, dtype=torch.float64, generator=g), LABELS[torch.randperm(12, generator=g)[:n]])
        for _ in range(steps)
    ]


def test_memory_is_first_in_first_out_and_returns_each_sample_row():
    memory = CrossBatchMemory(size=5)
    rows = memory.enqueue(torch.arange(6.0).reshape(3, 2), torch.tensor([0, 1, 2]))
    assert rows.tolist() == [0, 1, 2] and int(memory.filled) == 3
    rows = memory.enqueue(torch.arange(6.0, 12.0).reshape(3, 2), torch.tensor([3, 4, 5]))
    assert rows.tolist() == [3, 4, 0] and int(memory.filled) == 5 and int(memory.ptr) == 1
    assert memory.labels.tolist() == [5, 1, 2, 3, 4]
    references = memory.references(rows, torch.float64)
    assert references.embeddings.dtype == torch.float64 and references.embeddings[0].tolist() == [10.0, 11.0]
    # More rows than room: only the newest survive, the others have no row.
    rows = memory.enqueue(torch.zeros(7, 2), torch.arange(7))
    assert rows.tolist() == [-1, -1, 1, 2, 3, 4, 0] and int(memory.ptr) == 1


def test_memory_refuses_another_embedding_size_once_filled():
    memory = CrossBatchMemory(size=4)
    memory.enqueue(torch.zeros(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"embeddings must be \(n, 3\)"):
        memory.enqueue(torch.zeros(2, 5), torch.tensor([0, 1]))


def _pml(name):
    """pytorch-metric-learning's loss matching sslkit's ``name`` with its defaults, for CrossBatchMemory."""
    losses = pytest.importorskip("pytorch_metric_learning.losses")
    from pytorch_metric_learning import distances, reducers

    if name == "multi_similarity":
        return losses.MultiSimilarityLoss(alpha=2.0, beta=50.0, base=0.5)
    if name == "supcon":
        return losses.SupConLoss(temperature=0.1)
    if name == "circle":
        return losses.CircleLoss(m=0.25, gamma=256.0)
    # triplet: sslkit's defaults are FaceNet's squared distance and the mean over every triplet
    distance = distances.LpDistance(normalize_embeddings=True, p=2, power=2)
    return losses.TripletMarginLoss(margin=0.2, distance=distance, reducer=reducers.MeanReducer())


@pytest.mark.parametrize("name", ["multi_similarity", "supcon", "circle", "triplet"])
def test_memory_term_is_pytorch_metric_learning_cross_batch_memory(name):
    losses = pytest.importorskip("pytorch_metric_learning.losses")
    ours_fn = build(name, memory_size=16)
    theirs_fn = losses.CrossBatchMemory(_pml(name), embedding_size=5, memory_size=16)
    for x, labels in batches():  # 4 x 6 rows through 16: the last steps overwrite the oldest
        with_memory = value_and_grads(ours_fn, x, labels)
        batch_only = value_and_grads(build(name), x, labels)
        theirs = value_and_grads(theirs_fn, x, labels)
        assert theirs[0] > 0
        for ours, plain, ref in zip(with_memory, batch_only, theirs):
            torch.testing.assert_close(ours - plain, ref, rtol=1e-9, atol=1e-11)
    assert torch.equal(ours_fn.memory.labels.sort().values, theirs_fn.label_memory.sort().values)


def contrastive_memory_term(x, labels, memory_x, memory_labels, own_rows):
    """Hadsell et al. eq. 4 over (anchor, memory entry) pairs as loops, the anchor's own entry left out."""
    z = x / x.norm(dim=1, keepdim=True)
    m = memory_x / memory_x.norm(dim=1, keepdim=True)
    terms = []
    for i in range(len(z)):
        for j in range(len(m)):
            if j == own_rows[i]:
                continue
            d = (z[i] - m[j]).norm()
            terms.append(d**2 if labels[i] == memory_labels[j] else torch.relu(1.0 - d) ** 2)
    return torch.stack(terms).mean()


def lifted_memory_term(x, labels, memory_x, memory_labels, own_rows, margin=1.0):
    """Song et al. eq. 4 with j and neg(i) from the memory, neg(j) over the memory, as loops."""
    z = x / x.norm(dim=1, keepdim=True)
    m = memory_x / memory_x.norm(dim=1, keepdim=True)
    terms = []
    for i in range(len(z)):
        for j in range(len(m)):
            if j == own_rows[i] or labels[i] != memory_labels[j]:
                continue
            exps = [torch.exp(margin - (z[i] - m[k]).norm()) for k in range(len(m)) if memory_labels[k] != labels[i]]
            exps += [torch.exp(margin - (m[j] - m[k]).norm()) for k in range(len(m)) if memory_labels[k] != labels[i]]
            terms.append(torch.relu(torch.log(torch.stack(exps).sum()) + (z[i] - m[j]).norm()) ** 2)
    return torch.stack(terms).sum() / (2 * len(terms))


MEMORY_TERMS = {"contrastive": contrastive_memory_term, "lifted": lifted_memory_term}


@pytest.mark.parametrize("name", sorted(MEMORY_TERMS))
def test_memory_term_matches_loops(name):
    loss_fn = build(name, memory_size=10)
    seen_x, seen_labels = [], []
    for x, labels in batches(steps=3):
        seen_x.append(x)
        seen_labels.append(labels)
        memory_x, memory_labels = torch.cat(seen_x)[-10:], torch.cat(seen_labels)[-10:]
        own_rows = range(len(memory_x) - len(x), len(memory_x))  # the batch was enqueued first
        ours = value_and_grads(loss_fn, x, labels)
        plain = value_and_grads(build(name), x, labels)
        ref = value_and_grads(
            lambda x, labels: MEMORY_TERMS[name](x, labels, memory_x, memory_labels, own_rows), x, labels
        )
        assert ref[0] > 0
        for a, b, c in zip(ours, plain, ref):
            torch.testing.assert_close(a - b, c, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", ["contrastive", "triplet", "lifted", "circle", "supcon", "multi_similarity"])
def test_memory_is_saved_and_restored_with_the_state_dict(name):
    steps = batches(steps=3)
    loss_fn = build(name, memory_size=8, miner="multi_similarity")
    for x, labels in steps[:2]:
        loss_fn(x, labels)
    state = {k: v.clone() for k, v in loss_fn.state_dict().items()}
    restored = build(name, memory_size=8, miner="multi_similarity")  # a fresh memory: D not known yet
    restored.load_state_dict(state)
    assert restored.memory.embeddings.shape == (8, 5) and restored.memory.embeddings.dtype == torch.float64
    x, labels = steps[2]
    torch.testing.assert_close(restored(x, labels), loss_fn(x, labels), rtol=0, atol=0)
    fresh = build(name, memory_size=8, miner="multi_similarity")
    assert not torch.isclose(fresh(x, labels), restored(x, labels))  # the memory is what differs


def test_memory_size_is_a_recipe_key():
    kwargs = check_loss_kwargs("supcon", {"memory_size": 4096, "miner": "batch_hard"})
    assert build("supcon", **kwargs).memory.size == 4096
    for bad in (-1, 2.5, "big"):
        with pytest.raises(Exception, match="memory_size"):
            check_loss_kwargs("supcon", {"memory_size": bad})
    with pytest.raises(Exception, match="loss 'npair' takes no cross-batch memory"):
        check_loss_kwargs("npair", {"memory_size": 16})


def _memory_worker(rank, world, cases, steps):
    """Each case over the steps on this rank's slices; the losses and gradients of every step and the final state."""
    results = []
    for name, kwargs in cases:
        torch.manual_seed(0)
        loss_fn = build(name, **kwargs)
        per_step = []
        for x, labels in steps:
            local = rank_slice(x, rank, world).clone().requires_grad_(True)
            loss = loss_fn(local, rank_slice(labels, rank, world))
            loss.backward()
            per_step.append((loss.detach(), local.grad))
        results.append((per_step, loss_fn.state_dict()))
    return results


@pytest.mark.slow
def test_two_processes_hold_one_memory_and_train_as_one_process():
    steps = batches(steps=3, n=8)
    cases = [
        ("multi_similarity", dict(memory_size=12)),
        ("supcon", dict(memory_size=20, miner="multi_similarity")),
        ("triplet", dict(memory_size=12)),
        ("contrastive", dict(memory_size=12, miner="distance_weighted")),
        ("circle", dict(memory_size=12, miner="batch_hard")),
        ("lifted", dict(memory_size=12, miner="semi_hard", epsilon=0.4)),
    ]
    results = run_in_processes(_memory_worker, cases, steps)
    for k, (name, kwargs) in enumerate(cases):
        torch.manual_seed(0)
        one = build(name, **kwargs)
        for s, (x, labels) in enumerate(steps):
            loss, grad = value_and_grads(one, x, labels)
            per_rank = [r[k][0][s] for r in results]
            torch.testing.assert_close(torch.stack([p[0] for p in per_rank]).mean(), loss, msg=f"{name} step {s}")
            torch.testing.assert_close(torch.cat([p[1] for p in per_rank]) / 2, grad, msg=f"{name} step {s}")
        for key, value in one.state_dict().items():  # the same memory, in the same rows, everywhere
            assert all(torch.equal(r[k][1][key], value) for r in results), (name, key)
