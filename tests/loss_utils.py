"""Plumbing shared by the loss tests (tests/test_loss_*.py).

Only the mechanics live here: leaf copies and backward passes, the two-process workers and their
comparison with one process, autocast runs, random inputs and label layouts. What a test checks,
and the reference written from each paper's formula, stay in the test file.
"""

import pytest
import torch

# --- values and gradients ------------------------------------------------------------------


def value_and_grads(fn, *inputs, **kwargs):
    """Call ``fn(*inputs, **kwargs)`` on fresh leaf copies of the floating-point tensors in ``inputs``.

    Other inputs (integer labels, ...) pass through as they are; so do the keyword arguments (a
    memory bank given as ``negatives=`` gets no gradient). Returns the detached loss followed by
    the gradient of each floating-point input, in order: ``(loss, dz1, dz2)`` for two views,
    ``(loss, dx)`` for (embeddings, labels), ``(loss, dx, dproxies)`` for (x, labels, proxies).
    """
    leaves = [t.clone().requires_grad_(True) if _is_float_tensor(t) else t for t in inputs]
    loss = fn(*leaves, **kwargs)
    loss.backward()
    return (loss.detach(), *(t.grad for t in leaves if _is_float_tensor(t)))


def _is_float_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def head_and_reference(head, x, labels, reference, **kwargs):
    """A classification head and a reference formula on the same embeddings and class weights.

    ``reference(x, weight, labels, **kwargs)`` gets leaf copies of ``x`` and of ``head.weight``.
    Returns ``(loss, dx, dW)`` of the head and ``(loss, dx, dW)`` of the reference.
    """
    ours = _head_value_and_grads(head, x, labels)
    x2 = x.clone().requires_grad_(True)
    w2 = head.weight.detach().clone().requires_grad_(True)
    ref = reference(x2, w2, labels, **kwargs)
    ref.backward()
    return ours, (ref.detach(), x2.grad, w2.grad)


def head_and_pml(head, theirs, x, labels):
    """A classification head and a pytorch-metric-learning classification loss on the same input.

    PML stores its class weights ``W`` as (D, C): copy them in before the call. Returns
    ``(loss, dx, dW)`` of the head and of PML, PML's ``dW`` transposed to sslkit's (C, D).
    """
    ours = _head_value_and_grads(head, x, labels)
    x2 = x.clone().requires_grad_(True)
    ref = theirs(x2, labels)
    ref.backward()
    return ours, (ref, x2.grad, theirs.W.grad.T)


def _head_value_and_grads(head, x, labels):
    x1 = x.clone().requires_grad_(True)
    loss = head(x1, labels)
    loss.backward()
    return loss, x1.grad, head.weight.grad


def pml_proxy_value_and_grads(theirs, x, labels, proxies):
    """A pytorch-metric-learning proxy loss with its proxies set to ``proxies`` (both (C, D)).

    Returns ``(loss, dx, dproxies)``, in the order ``value_and_grads`` gives sslkit's.
    """
    theirs.proxies.data = proxies.clone()
    xt = x.clone().requires_grad_(True)
    loss = theirs(xt, labels)
    loss.backward()
    return loss.detach(), xt.grad, theirs.proxies.grad


# --- random inputs and label layouts --------------------------------------------------------

# Label layouts: balanced, a class with a single sample, one class only, no two samples alike.
LABEL_LAYOUTS = {
    "balanced": [0, 0, 1, 1, 2, 2],
    "singleton": [0, 0, 0, 1, 1, 2],
    "one_class": [4, 4, 4, 4],
    "all_distinct": [0, 1, 2, 3, 5],
    "mixed7": [1, 0, 1, 2, 0, 1, 3],
}


@pytest.fixture(autouse=True)
def seeded_torch_rng():
    """Autouse where imported: every test draws the same numbers on every run (no flaky random inputs)."""
    torch.manual_seed(0)


def make_labels(kind, n, generator):
    """``n`` labels: ``"one_class"``, ``"pairs"`` (an odd n leaves the last sample alone) or
    ``"mixed"`` (a few classes of random sizes, plus one class with a single sample)."""
    if kind == "one_class":
        return torch.zeros(n, dtype=torch.long)
    if kind == "pairs":
        return torch.arange(n) // 2
    labels = torch.randint(0, max(1, n // 3), (n,), generator=generator)
    labels[-1] = 99
    return labels


def random_labelled_batch(n, d, num_classes, seed):
    """``n`` float32 embeddings of dimension ``d`` and labels in ``[0, num_classes)``, from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    return x, labels


def random_class_batch(n, d, num_classes, seed):
    """A batch for a classification head: float64 embeddings and labels, the last class always present."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    labels[0] = num_classes - 1
    return x, labels


# --- half precision -------------------------------------------------------------------------

# Relative tolerance of a two-view loss under autocast against fp32. The only error left is the
# embeddings' own rounding to half precision: measured at most 5e-5 (fp16) and 3e-4 (bf16)
# relative over 20 random draws; the tolerance keeps a 10x margin.
HALF_RTOL = {torch.float16: 5e-4, torch.bfloat16: 3e-3}


def two_views_under_autocast(fn, dtype, z1, z2, negatives=None, requires_grad=True, **kwargs):
    """``fn(z1, z2, negatives=..., **kwargs)`` under CPU autocast, every embedding rounded to ``dtype``.

    Returns the loss and the two rounded views (leaves that require grad unless told otherwise:
    call ``backward`` on the loss to fill their gradients).
    """
    halves = [z1.to(dtype).requires_grad_(requires_grad), z2.to(dtype).requires_grad_(requires_grad)]
    with torch.autocast("cpu", dtype=dtype):
        loss = fn(*halves, negatives=None if negatives is None else negatives.to(dtype), **kwargs)
    return loss, halves


def labelled_under_autocast(fn, x, labels, dtype, backward=False, **kwargs):
    """``fn(x, labels, **kwargs)`` under CPU autocast on ``x`` rounded to ``dtype``, and in fp32 to compare.

    With ``backward``, the rounded input is a leaf that requires grad and the loss is
    backpropagated (a module's parameter gradients are filled too). Returns ``(loss, grad,
    rounded, expected)``: the autocast loss, the rounded input's gradient (None without
    ``backward``), ``fn`` in fp32 on the same rounded values, and ``fn`` in fp32 on ``x``.
    """
    expected = fn(x, labels, **kwargs)
    half = x.to(dtype).requires_grad_(backward)
    with torch.autocast("cpu", dtype=dtype):
        loss = fn(half, labels, **kwargs)
    if backward:
        loss.backward()
    rounded = fn(x.to(dtype).float(), labels, **kwargs)
    return loss, half.grad, rounded, expected


# --- across processes -----------------------------------------------------------------------
# The workers run in processes started by dist_utils.run_in_processes: they stay at module level
# (pickled by reference) and take the loss as a module-level class plus keyword arguments.


def rank_slice(t, rank, world):
    """Rank ``rank``'s share of a batch split evenly over ``world`` processes."""
    n = t.shape[0] // world
    return t[rank * n : (rank + 1) * n]


def two_view_worker(rank, world, loss_cls, cases):
    """For each ``(z1, z2, negatives, kwargs)``: ``loss_cls(**kwargs)`` on this rank's slice of the views.

    Returns, per case, ``(loss, dz1, dz2, state)``, ``state`` the loss module's state_dict after the call.
    """
    results = []
    for z1, z2, negatives, kwargs in cases:
        local1 = rank_slice(z1, rank, world).clone().requires_grad_(True)
        local2 = rank_slice(z2, rank, world).clone().requires_grad_(True)
        loss_fn = loss_cls(**kwargs)
        # without a bank, the call any two-view loss takes (Barlow Twins and VICReg take no negatives)
        loss = loss_fn(local1, local2) if negatives is None else loss_fn(local1, local2, negatives)
        loss.backward()
        results.append((loss.detach(), local1.grad, local2.grad, loss_fn.state_dict()))
    return results


def two_and_multi_view_worker(rank, world, loss_cls, cases, views):
    """:func:`two_view_worker` of ``cases``, then ``loss_cls().multi_view`` on this rank's slice of each of
    ``views`` (multi-crop), in the same processes (one spawn for both).

    Returns ``(two_view_results, (loss, dview_1, ..., dview_V))``.
    """
    local = [rank_slice(view, rank, world).clone().requires_grad_(True) for view in views]
    loss = loss_cls().multi_view(*local)
    loss.backward()
    return two_view_worker(rank, world, loss_cls, cases), (loss.detach(), *(view.grad for view in local))


def labelled_worker(rank, world, loss_cls, cases, x, labels):
    """For each ``kwargs`` in ``cases``: ``loss_cls(**kwargs)`` on this rank's slice of (x, labels).

    Returns, per case, ``(loss, dx)``.
    """
    local_labels = rank_slice(labels, rank, world)
    results = []
    for kwargs in cases:
        local = rank_slice(x, rank, world).clone().requires_grad_(True)
        loss = loss_cls(**kwargs)(local, local_labels)
        loss.backward()
        results.append((loss.detach(), local.grad))
    return results


def assert_processes_match_one_process(per_rank, expected):
    """Compare what each process returned with one process on the whole (concatenated) batch.

    ``per_rank[r]`` starts with ``(loss, grad, ...)`` of rank r, ``expected`` is ``(loss, grad,
    ...)`` of one process; entries of ``per_rank`` past ``len(expected)`` are not compared. Each
    process averages over its own anchors, so the mean over processes is the global loss; a
    process's gradient is world_size x the 1-process gradient of its slice (DDP averages it back).
    """
    world = len(per_rank)
    loss, *grads = expected
    torch.testing.assert_close(torch.stack([r[0] for r in per_rank]).mean(), loss)
    for k, grad in enumerate(grads, start=1):
        torch.testing.assert_close(torch.cat([r[k] for r in per_rank]) / world, grad)


def emulated_processes(monkeypatch, loss_fn, z1, z2, world):
    """Run ``loss_fn`` as each of ``world`` processes would, in this one process.

    ``gather_with_grad`` is replaced by a concatenation of this process's slice with separate
    leaves for the other processes' slices; summing every leaf's gradient over the processes
    is what the real gather's all-reduce does. Returns the mean loss and the per-slice
    gradients divided by ``world`` (the 1-process convention of ``sslkit.distributed``).
    """
    from sslkit import distributed

    n = z1.shape[0] // world
    losses, grads = [], [torch.zeros_like(z1), torch.zeros_like(z2)]
    for rank in range(world):
        leaves = [[z[s * n : (s + 1) * n].clone().requires_grad_(True) for s in range(world)] for z in (z1, z2)]

        def gather(tensor, check=True, leaves=leaves, rank=rank):  # check: the real gather's size check, moot here
            view = leaves[0] if tensor is leaves[0][rank] else leaves[1]
            return torch.cat([tensor if s == rank else view[s] for s in range(world)])

        monkeypatch.setattr(distributed, "is_distributed", lambda: True)
        monkeypatch.setattr(distributed, "world_size", lambda: world)
        monkeypatch.setattr(distributed, "rank", lambda rank=rank: rank)
        monkeypatch.setattr(distributed, "local_offset", lambda local, rank=rank: rank * local)
        monkeypatch.setattr(distributed, "gather_with_grad", gather)
        loss = loss_fn(leaves[0][rank], leaves[1][rank])
        loss.backward()
        losses.append(loss.detach())
        for v in range(2):
            for s in range(world):
                grads[v][s * n : (s + 1) * n] += leaves[v][s].grad
    monkeypatch.undo()
    return torch.stack(losses).mean(), grads[0] / world, grads[1] / world
