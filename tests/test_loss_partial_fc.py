"""Partial FC (sslkit.losses.partial_fc) for ArcFace, CosFace and Proxy-NCA, float64.

At sample rate 1, in two real processes, the sharded head is the full head on the whole batch:
the same loss, each process's centres get the full gradient's rows, and the embeddings the
1-process gradient of their slice times the number of processes (the convention DDP's mean
divides out; checked through DDP too). Below rate 1 it is the full head restricted to the
sampled classes, written as loops. The head's and the optimizer's state are whole, in class
order, and move between 1 and 2 processes.
"""

import math

import pytest
import torch
from dist_utils import run_in_processes
from torch import nn

from sslkit import distributed
from sslkit.errors import UserError
from sslkit.losses import AdaCosHead, ArcFaceHead, CosFaceHead, NormSoftmaxHead, ProxyNCAHead, build, check_loss_kwargs
from sslkit.losses.partial_fc import keep_optimizer_state_in_class_order, sample_centres, shard_bounds

D, C, n = 6, 7, 5  # 7 classes over 2 processes: blocks of 4 and 3
CASES = [
    (ArcFaceHead, dict(scale=64.0, margin=0.5)),
    (ArcFaceHead, dict(scale=10.0, margin=1.3)),  # theta + m > pi for some samples: the fallback
    (CosFaceHead, dict(scale=30.0, margin=0.35)),
    (NormSoftmaxHead, dict(temperature=0.1)),
    (AdaCosHead, dict()),
    (ProxyNCAHead, dict(scale=9.0)),
    (ProxyNCAHead, dict(scale=3.0, include_positive_in_denominator=True)),
]


def _name(head) -> str:
    return "proxies" if isinstance(head, ProxyNCAHead) else "weight"


def _full_head(cls, kwargs, seed=0, num_classes=C):
    torch.manual_seed(seed)
    return cls(D, num_classes, **kwargs).double()


def _batch(seed=1, num_classes=C):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * n, D, dtype=torch.float64, generator=g)
    labels = torch.randint(0, num_classes, (2 * n,), generator=g)
    labels[:2] = torch.tensor([0, num_classes - 1])  # both blocks hold a positive
    return x, labels


def _loss_and_grads(head, x, labels):
    x = x.clone().requires_grad_(True)
    loss = head(x, labels)
    loss.backward()
    return loss.detach(), x.grad, getattr(head, _name(head)).grad


def _rate_one_worker(rank, world, cases, states, x, labels):
    out = []
    for (cls, kwargs), state in zip(cases, states):
        head = cls(D, C, partial_fc=True, **kwargs).double()
        head.load_state_dict(state)
        mine = slice(rank * n, (rank + 1) * n)
        loss, dx, dblock = _loss_and_grads(head, x[mine], labels[mine])
        torch.manual_seed(5)  # a freshly initialised head, saved whole
        initial = cls(D, C, partial_fc=True, **kwargs).double().state_dict()
        out.append((loss, dx, dblock, head.state_dict(), initial, shard_bounds(C, rank, world)))
    return out


@pytest.mark.slow
def test_rate_one_in_two_processes_is_the_full_head(two_processes):
    x, labels = _batch()
    fulls = [_full_head(cls, kwargs) for cls, kwargs in CASES]
    results = [r["rate_one"] for r in two_processes]
    for case, (cls, kwargs) in enumerate(CASES):
        loss, dx, dweight = _loss_and_grads(fulls[case], x, labels)
        name = _name(fulls[case])
        for rank, result in enumerate(results):
            ours_loss, ours_dx, ours_dblock, state, initial, (start, stop) = result[case]
            torch.testing.assert_close(ours_loss, loss, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(ours_dx, 2 * dx[rank * n : (rank + 1) * n], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(ours_dblock, dweight[start:stop], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(state[name], fulls[case].state_dict()[name])  # whole, in class order
        # The initial head does not depend on the number of processes.
        torch.manual_seed(5)
        one = cls(D, C, partial_fc=True, **kwargs).double().state_dict()[name]
        torch.testing.assert_close(results[0][case][4][name], one, rtol=0, atol=0)
        torch.testing.assert_close(results[1][case][4][name], one, rtol=0, atol=0)


@pytest.mark.parametrize("cls,kwargs", CASES)
def test_rate_one_in_one_process_is_the_full_head(cls, kwargs):
    x, labels = _batch()
    full = _full_head(cls, kwargs)
    head = cls(D, C, partial_fc=True, **kwargs).double()
    head.load_state_dict(full.state_dict())
    for ours, theirs in zip(_loss_and_grads(head, x, labels), _loss_and_grads(full, x, labels)):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_a_zero_class_row_gets_the_full_heads_gradient():
    x, labels = _batch()
    full = _full_head(ArcFaceHead, {})
    with torch.no_grad():
        full.weight[2] = 0.0  # no direction: no radial part to remove
    head = ArcFaceHead(D, C, partial_fc=True).double()
    head.load_state_dict(full.state_dict())
    for ours, theirs in zip(_loss_and_grads(head, x, labels), _loss_and_grads(full, x, labels)):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def restricted_reference(x, weight, labels, classes, cls, kwargs):
    """The head's loss with only ``classes`` in the softmax, as loops from the papers' formulas:
    ArcFace ``s cos(theta_y + m)`` (``cos - m sin m`` past pi - m), CosFace ``s (cos - m)``,
    Proxy-NCA ``-s ||x - p||^2`` on unit vectors, positive in the denominator or not; NormSoftmax
    ``cos / T`` and AdaCos ``sqrt(2) log(C - 1) cos``, no margin."""
    plain_scale = {
        NormSoftmaxHead: 1 / kwargs.get("temperature", 0.05),
        AdaCosHead: math.sqrt(2) * math.log(len(weight) - 1),
    }
    losses = []
    for i in range(len(x)):
        unit = x[i] / torch.sqrt(x[i] @ x[i])
        logits = {}
        for j in classes:
            cos = unit @ weight[j] / torch.sqrt(weight[j] @ weight[j])
            if cls is ProxyNCAHead:
                logits[j] = -kwargs["scale"] * (2 - 2 * cos)
            elif cls in plain_scale:
                logits[j] = plain_scale[cls] * cos
            elif j != labels[i]:
                logits[j] = kwargs["scale"] * cos
            elif cls is CosFaceHead:
                logits[j] = kwargs["scale"] * (cos - kwargs["margin"])
            else:
                m, theta = kwargs["margin"], torch.acos(cos)
                target = torch.cos(theta + m) if theta + m <= math.pi else cos - m * math.sin(m)
                logits[j] = kwargs["scale"] * target
        y = int(labels[i])
        with_target = kwargs.get("include_positive_in_denominator", cls is not ProxyNCAHead)
        others = [j for j in classes if j != y or with_target]
        losses.append(-logits[y] + torch.log(sum(torch.exp(logits[j]) for j in others)))
    return torch.stack(losses).mean()


RATE, C_SAMPLED = 0.5, 12  # blocks of 6: 3 centres a step, more where the batch has more classes


def _sampled_worker(rank, world, cases, states, x, labels):
    out = []
    for (cls, kwargs), state in zip(cases, states):
        head = cls(D, C_SAMPLED, partial_fc=True, sample_rate=RATE, **kwargs).double()
        head.load_state_dict(state)
        start, _ = shard_bounds(C_SAMPLED, rank, world)
        kept = (start + head.partial_fc.sample(labels, step=0)).tolist()  # what the first call samples
        mine = slice(rank * n, (rank + 1) * n)
        out.append((*_loss_and_grads(head, x[mine], labels[mine]), kept))
    return out


def _sampled_batch():
    x, labels = _batch(seed=3, num_classes=C_SAMPLED)
    labels[:] = torch.tensor([0, 1, 2, 3, 0, 7, 7, 11, 7, 1])  # block 0 holds 4 positives (> 3), block 1 two
    return x, labels


@pytest.mark.slow
def test_sampled_classes_in_two_processes_match_the_restricted_loop(two_processes):
    x, labels = _sampled_batch()
    fulls = [_full_head(cls, kwargs, num_classes=C_SAMPLED) for cls, kwargs in CASES]
    results = [r["sampled"] for r in two_processes]
    for case, (cls, kwargs) in enumerate(CASES):
        kept = sorted(results[0][case][3] + results[1][case][3])
        assert len(results[0][case][3]) == 4 and len(results[1][case][3]) == 3  # positives, then up to 3
        assert set(labels.tolist()) <= set(kept)
        xr = x.clone().requires_grad_(True)
        weight = getattr(fulls[case], _name(fulls[case])).detach().clone().requires_grad_(True)
        loss = restricted_reference(xr, weight, labels, kept, cls, kwargs)
        loss.backward()
        for rank, result in enumerate(results):
            ours_loss, ours_dx, ours_dblock, _ = result[case]
            start, stop = shard_bounds(C_SAMPLED, rank, 2)
            torch.testing.assert_close(ours_loss, loss.detach())
            torch.testing.assert_close(ours_dx, 2 * xr.grad[rank * n : (rank + 1) * n])
            torch.testing.assert_close(ours_dblock, weight.grad[start:stop])  # 0 where not sampled


@pytest.mark.parametrize("cls,kwargs", CASES)
def test_sampled_classes_in_one_process_match_the_restricted_loop(cls, kwargs):
    x, labels = _sampled_batch()
    head = cls(D, C_SAMPLED, partial_fc=True, sample_rate=RATE, **kwargs).double()
    kept = head.partial_fc.sample(labels, step=0).tolist()
    assert len(kept) == 6 and set(labels.tolist()) <= set(kept)  # 6 classes in the batch, int(0.5 * 12) = 6
    ours = _loss_and_grads(head, x, labels)
    xr = x.clone().requires_grad_(True)
    weight = getattr(head, _name(head)).detach().clone().requires_grad_(True)
    loss = restricted_reference(xr, weight, labels, kept, cls, kwargs)
    loss.backward()
    for a, b in zip(ours, (loss.detach(), xr.grad, weight.grad)):
        torch.testing.assert_close(a, b)


def test_sampling_keeps_every_positive_is_seeded_and_changes_by_step():
    labels = torch.tensor([3, 3, 150, 999, 1000, 1500])
    generator = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    kept = sample_centres(labels, 0, 1000, 0.1, generator(0))
    assert len(kept) == 100 and {3, 150, 999} <= set(kept.tolist()) and (kept.diff() > 0).all()
    torch.testing.assert_close(kept, sample_centres(labels, 0, 1000, 0.1, generator(0)))
    assert not torch.equal(kept, sample_centres(labels, 0, 1000, 0.1, generator(1)))
    # More positives than the rate allows: all of them, nothing else.
    assert sample_centres(labels, 0, 4, 0.25, generator(0)).tolist() == [3]
    assert sample_centres(torch.tensor([0, 1, 2]), 0, 4, 0.25, generator(0)).tolist() == [0, 1, 2]
    assert len(sample_centres(torch.tensor([9]), 0, 4, 0.1, generator(0))) == 1  # none here: one at least
    head = ArcFaceHead(4, 1000, partial_fc=True, sample_rate=0.1)
    assert not torch.equal(head.partial_fc.sample(labels, 0), head.partial_fc.sample(labels, 1))
    torch.testing.assert_close(head.partial_fc.sample(labels, 7), head.partial_fc.sample(labels, 7))


def test_a_resumed_head_samples_what_the_head_never_stopped_would():
    """The sampling's seed and step travel in the state_dict; a full head drops them, a fresh Partial FC head
    (another seed) takes them."""
    labels = torch.tensor([3, 150, 999])
    running = ArcFaceHead(4, 1000, partial_fc=True, sample_rate=0.1)
    for _ in range(3):
        running(torch.randn(3, 4), labels)
    saved = running.state_dict()
    torch.manual_seed(123)
    resumed = ArcFaceHead(4, 1000, partial_fc=True, sample_rate=0.1)
    assert resumed.partial_fc.seed != running.partial_fc.seed
    resumed.load_state_dict(saved)
    assert (resumed.partial_fc.seed, resumed.partial_fc.steps) == (running.partial_fc.seed, 3)
    torch.testing.assert_close(resumed.partial_fc.sample(labels, 3), running.partial_fc.sample(labels, 3))
    ArcFaceHead(4, 1000).load_state_dict(saved)  # strict: the key is no surprise to a full head


def _optimizer_worker(rank, world, state, x, labels):
    head = ArcFaceHead(D, C, partial_fc=True).double()
    head.load_state_dict(state)
    optimizer = torch.optim.AdamW(head.parameters(), lr=0.1)
    assert keep_optimizer_state_in_class_order(nn.Sequential(head), optimizer) == ["0.weight"]
    mine = slice(rank * n, (rank + 1) * n)
    head(x[mine], labels[mine]).backward()
    optimizer.step()
    saved = optimizer.state_dict()
    # ... loaded back into a fresh optimizer on another head: this process's rows of it
    other = ArcFaceHead(D, C, partial_fc=True).double()
    reloaded = torch.optim.AdamW(other.parameters(), lr=0.1)
    other.partial_fc.keep_optimizer_state_in_class_order(reloaded, other.weight)
    reloaded.load_state_dict(saved)
    return saved, head.state_dict(), reloaded.state.get(other.weight)["exp_avg"], optimizer.state[head.weight]


@pytest.mark.slow
def test_head_and_optimizer_state_move_between_one_and_two_processes(two_processes):
    x, labels = _batch()
    full = _full_head(ArcFaceHead, {})
    results = [r["optimizer"] for r in two_processes]
    optimizer = torch.optim.AdamW(full.parameters(), lr=0.1)
    full(x, labels).backward()
    optimizer.step()
    expected = optimizer.state[full.weight]
    for rank, (saved, head_state, reloaded_rows, live) in enumerate(results):
        start, stop = shard_bounds(C, rank, 2)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(saved["state"][0][key], expected[key])  # whole, in class order
            torch.testing.assert_close(live[key], expected[key][start:stop])  # the live state untouched
        torch.testing.assert_close(reloaded_rows, expected["exp_avg"][start:stop])
        torch.testing.assert_close(head_state["weight"], full.weight.detach())
    # The two-process checkpoint resumes in one process, and exports as a plain head.
    one = ArcFaceHead(D, C, partial_fc=True).double()
    one.load_state_dict(results[0][1])
    resumed = torch.optim.AdamW(one.parameters(), lr=0.1)
    one.partial_fc.keep_optimizer_state_in_class_order(resumed, one.weight)
    resumed.load_state_dict(results[0][0])
    torch.testing.assert_close(resumed.state[one.weight]["exp_avg_sq"], expected["exp_avg_sq"])
    plain = ArcFaceHead(D, C).double()
    plain.load_state_dict(results[1][1])
    torch.testing.assert_close(plain.weight, full.weight)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.neck = nn.Linear(D, D).double()
        self.loss = CosFaceHead(D, C, partial_fc=True).double()

    def forward(self, x, labels):
        return self.loss(self.neck(x), labels)


def _ddp_worker(rank, world, state, x, labels):
    torch.manual_seed(rank)  # different starting necks: DDP's broadcast must make them rank 0's
    model = _Model()
    model.loss.load_state_dict(state["loss"])
    ignored = distributed.skip_broadcast_of_replicated_buffers(model)
    ddp = nn.parallel.DistributedDataParallel(model)
    mine = slice(rank * n, (rank + 1) * n)
    ddp(x[mine], labels[mine]).backward()
    return ignored, model.neck.weight.detach(), model.neck.weight.grad, model.loss.weight.grad


@pytest.mark.slow
def test_ddp_leaves_the_blocks_alone_and_averages_the_rest_to_the_one_process_gradient(two_processes):
    x, labels = _batch()
    state = _ddp_state()
    results = [r["ddp"] for r in two_processes]
    torch.manual_seed(0)
    one = _Model()  # rank 0's neck, which DDP broadcasts
    one.loss.load_state_dict(state["loss"])
    one(x, labels).backward()
    for rank, (ignored, neck, dneck, dblock) in enumerate(results):
        start, stop = shard_bounds(C, rank, 2)
        assert ignored == ["loss.weight"]
        torch.testing.assert_close(neck, one.neck.weight.detach())
        torch.testing.assert_close(dneck, one.neck.weight.grad)  # averaged: the 1-process gradient
        torch.testing.assert_close(dblock, one.loss.weight.grad[start:stop])  # not averaged


def _ddp_state():
    torch.manual_seed(2)
    return {"loss": CosFaceHead(D, C).double().state_dict()}


def _all_workers(rank, world):
    """Every two-process check in one spawn (starting processes is most of their time)."""
    x, labels = _batch()
    fulls = [_full_head(cls, kwargs).state_dict() for cls, kwargs in CASES]
    sx, slabels = _sampled_batch()
    sampled_fulls = [_full_head(cls, kwargs, num_classes=C_SAMPLED).state_dict() for cls, kwargs in CASES]
    return {
        "rate_one": _rate_one_worker(rank, world, CASES, fulls, x, labels),
        "sampled": _sampled_worker(rank, world, CASES, sampled_fulls, sx, slabels),
        "optimizer": _optimizer_worker(rank, world, _full_head(ArcFaceHead, {}).state_dict(), x, labels),
        "ddp": _ddp_worker(rank, world, _ddp_state(), x, labels),
    }


@pytest.fixture(scope="module")
def two_processes():
    return run_in_processes(_all_workers)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(partial_fc=True, sample_rate=0.0), "sample_rate must be in \\(0, 1\\]"),
        (dict(partial_fc=True, sample_rate=1.5), "sample_rate must be in \\(0, 1\\]"),
        (dict(partial_fc=True, sample_rate="a tenth"), "sample_rate must be a number"),
        (dict(sample_rate=0.1), "only with partial_fc=True"),
        (dict(partial_fc="yes"), "partial_fc must be True or False"),
    ],
)
@pytest.mark.parametrize("name", ["arcface", "cosface", "proxy_nca"])
def test_bad_arguments_are_one_value_error_naming_them(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build(name, embedding_dim=4, num_classes=10, **kwargs)


def test_recipe_keys_partial_fc_and_sample_rate():
    assert check_loss_kwargs("arcface", {"partial_fc": True, "sample_rate": 0.1}) == {
        "partial_fc": True,
        "sample_rate": 0.1,
    }
    head = build("arcface", embedding_dim=4, num_classes=10, partial_fc=True, sample_rate=0.1)
    assert "partial_fc=True, sample_rate=0.1" in repr(head)
    with pytest.raises(UserError, match="loss 'cosface': sample_rate=0.5 samples class centres only with partial_fc"):
        check_loss_kwargs("cosface", {"sample_rate": 0.5})
