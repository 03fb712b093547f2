"""DINO's loss: value and gradient against a loop written from eq. 1-3 of Caron et al. 2021 (averaged as
the authors' code), against lightly over several steps of the centre and temperature schedule, the centre
across two real processes, exact resume from the state dict, and under fp16/bf16 autocast."""

import pytest
import torch
from dist_utils import run_in_processes
from loss_utils import value_and_grads

from sslkit.losses import build
from sslkit.losses.dino import DINOLoss, dino_loss, dino_teacher_temperature


def dino_reference(student, teacher, teacher_temperature, student_temperature, center, global_views):
    """Mean over the pairs (global view g, view v != g) of the mean over images of ``H(P_t, P_s)``, in float64.

    ``P_t = softmax((t - c) / tau_t)``, ``P_s = softmax(s / tau_s)``, ``H(a, b) = -sum_k a_k log b_k``;
    written out with ``exp`` and sums, the teacher a constant.
    """
    s, t, c = student.double(), teacher.double().detach(), center.double()
    n = t.shape[0] // global_views
    views, k = s.shape[0] // n, s.shape[1]

    def softmax(logits):
        e = [torch.exp(logits[j]) for j in range(k)]
        total = sum(e)
        return [x / total for x in e]

    pairs = []
    for g in range(global_views):
        for v in range(views):
            if v == g:
                continue
            terms = []
            for i in range(n):
                p_t = softmax((t[g * n + i] - c) / teacher_temperature)
                p_s = softmax(s[v * n + i] / student_temperature)
                terms.append(-sum(p_t[j] * torch.log(p_s[j]) for j in range(k)))
            pairs.append(sum(terms) / n)
    return sum(pairs) / len(pairs)


@pytest.mark.parametrize("n,views,global_views", [(1, 2, 2), (3, 2, 1), (3, 5, 2), (2, 4, 3)])
@pytest.mark.parametrize("temperatures", [(0.04, 0.1), (0.5, 1.0)])
def test_matches_reference_value_and_gradient(n, views, global_views, temperatures):
    g = torch.Generator().manual_seed(n * 100 + views)
    student = torch.randn(views * n, 5, generator=g, dtype=torch.float64)
    teacher = torch.randn(global_views * n, 5, generator=g, dtype=torch.float64)
    center = torch.randn(5, generator=g, dtype=torch.float64) * 0.3
    args = (*temperatures, center, global_views)
    ours = value_and_grads(dino_loss, student, teacher, *args)
    ref = value_and_grads(dino_reference, student, teacher, *args)
    torch.testing.assert_close(ours[:2], ref[:2], rtol=1e-10, atol=1e-12)
    assert ours[2] is None and ref[2] is None  # no gradient reaches the teacher


def test_teacher_temperature_is_the_authors_linear_warmup():
    schedule = torch.linspace(0.04, 0.07, 30, dtype=torch.float64)  # main_dino.py: np.linspace, then constant
    for epoch in range(40):
        expected = schedule[epoch].item() if epoch < 30 else 0.07
        assert dino_teacher_temperature(epoch) == pytest.approx(expected, rel=1e-12)
    assert dino_teacher_temperature(0, 0.07, 0.04, warmup_epochs=0) == 0.07
    assert dino_teacher_temperature(0, 0.07, 0.04, warmup_epochs=1) == 0.04
    assert dino_teacher_temperature(1, 0.07, 0.04, warmup_epochs=1) == 0.07
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        dino_teacher_temperature(-1)


def test_centre_moves_after_the_loss_towards_the_teacher_mean():
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(8, 6, generator=g), torch.randn(4, 6, generator=g)
    loss_fn = DINOLoss(output_dim=6, warmup_epochs=0)
    first = loss_fn(student, teacher, epoch=0)
    torch.testing.assert_close(first, dino_loss(student, teacher, 0.07, 0.1, center=None))  # the centre was 0
    torch.testing.assert_close(loss_fn.center, 0.1 * teacher.mean(dim=0))
    centre = loss_fn.center.clone()
    second = loss_fn(student, teacher, epoch=0)
    torch.testing.assert_close(second, dino_loss(student, teacher, 0.07, 0.1, center=centre))
    torch.testing.assert_close(loss_fn.center, 0.9 * centre + 0.1 * teacher.mean(dim=0))


def _lightly_steps(lightly_dino, batches):
    results = []
    loss_fn = lightly_dino(output_dim=5, warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_epochs=3)
    for student, teacher, epoch in batches:
        student = student.clone().requires_grad_(True)
        loss = loss_fn(list(teacher.chunk(2)), list(student.chunk(len(student) // (len(teacher) // 2))), epoch=epoch)
        loss.backward()
        results.append((loss.detach(), student.grad))
    return results


def test_matches_lightly_over_steps_of_the_centre_and_the_schedule():
    lightly_dino = pytest.importorskip("lightly.loss").DINOLoss
    g = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(6 * 4, 5, generator=g, dtype=torch.float64),
            torch.randn(2 * 4, 5, generator=g, dtype=torch.float64),
            epoch,
        )
        for epoch in (0, 1, 2, 5)
    ]
    ours = DINOLoss(output_dim=5, teacher_temperature=0.07, warmup_teacher_temperature=0.04, warmup_epochs=3).double()
    theirs = _lightly_steps(lightly_dino, batches)
    for (student, teacher, epoch), expected in zip(batches, theirs):
        got = value_and_grads(lambda s, t: ours(s, t, epoch), student, teacher)
        # lightly keeps its schedule in float32: the temperatures agree to about 1e-8
        torch.testing.assert_close(got[:2], expected, rtol=1e-6, atol=1e-9)


def test_a_restored_state_dict_continues_exactly():
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(8, 6, generator=g), torch.randn(4, 6, generator=g)) for _ in range(3)]
    trained = DINOLoss(output_dim=6)
    for student, teacher in batches[:2]:
        trained(student, teacher, epoch=0)
    resumed = DINOLoss(output_dim=6)
    resumed.load_state_dict(trained.state_dict())
    student, teacher = batches[2]
    assert torch.equal(resumed(student, teacher, epoch=1), trained(student, teacher, epoch=1))
    assert torch.equal(resumed.center, trained.center) and resumed.center.abs().sum() > 0


def test_module_and_registry_give_the_function():
    loss_fn = build("dino", output_dim=4, warmup_epochs=0, teacher_temperature=0.05)
    assert isinstance(loss_fn, DINOLoss) and "sync_center=True" in repr(loss_fn)
    student, teacher = torch.randn(12, 4), torch.randn(6, 4)
    torch.testing.assert_close(loss_fn(student, teacher, epoch=0), dino_loss(student, teacher, 0.05, 0.1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(dtype):
    g = torch.Generator().manual_seed(3)
    student, teacher = torch.randn(6 * 8, 64, generator=g) * 5, torch.randn(2 * 8, 64, generator=g) * 5
    expected = dino_loss(student.to(dtype).float(), teacher.to(dtype).float(), 0.04)
    half = student.to(dtype).requires_grad_(True)
    with torch.autocast("cpu", dtype=dtype):
        loss = dino_loss(half, teacher.to(dtype), 0.04)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(half.grad.float()).all()
    torch.testing.assert_close(loss, expected)


def test_rejects_views_that_do_not_fit():
    student, teacher = torch.randn(12, 4), torch.randn(6, 4)
    with pytest.raises(ValueError, match=r"teacher must stack the 2 global views .* got 5"):
        dino_loss(student, teacher[:5])
    with pytest.raises(ValueError, match=r"student must stack every view of the teacher's 3 images.* got 11"):
        dino_loss(student[:11], teacher)
    with pytest.raises(ValueError, match=r"at least 6, got 3"):
        dino_loss(student[:3], teacher)  # fewer views than the teacher's
    with pytest.raises(ValueError, match=r"at least 2, got 1"):
        dino_loss(student[:1], teacher[:1], num_global_views=1)  # one view: no pair to compare
    with pytest.raises(ValueError, match="same K"):
        dino_loss(student, torch.randn(6, 5))
    with pytest.raises(ValueError, match=r"center must have shape \(4,\)"):
        DINOLoss(output_dim=8)(student, teacher, epoch=0)
    with pytest.raises(ValueError, match="center_momentum must be in"):
        DINOLoss(center_momentum=1.0)


# --- across processes -----------------------------------------------------------------------


def _views_and_teacher():
    g = torch.Generator().manual_seed(4)
    # 4 images: 4 views for the student (2 global, 2 local), the 2 global ones for the teacher
    return [
        (
            torch.randn(4 * 4, 6, generator=g, dtype=torch.float64),
            torch.randn(2 * 4, 6, generator=g, dtype=torch.float64),
        )
        for _ in range(2)
    ]


def _rank_share(t, rank, world):
    """Rank ``rank``'s images in every view block of a (views x 4, K) stack."""
    per = 4 // world
    return torch.cat([block[rank * per : (rank + 1) * per] for block in t.split(4)])


def _two_steps(rank, world, sync_center):
    """Two steps, the second with the centre of the first; the second's loss and gradient, and the centre."""
    loss_fn = DINOLoss(output_dim=6, sync_center=sync_center).double()
    for step, (student, teacher) in enumerate(_views_and_teacher()):
        local = _rank_share(student, rank, world).clone().requires_grad_(True)
        loss = loss_fn(local, _rank_share(teacher, rank, world), epoch=step)
    loss.backward()
    return loss.detach(), local.grad, loss_fn.center.clone()


def _uneven_centre(rank, world):
    """The centre after one step with 3 images on rank 0 and 1 on rank 1 (no drop_last)."""
    student, teacher = _views_and_teacher()[0]
    images = slice(0, 3) if rank == 0 else slice(3, 4)
    loss_fn = DINOLoss(output_dim=6).double()
    loss_fn(torch.cat([b[images] for b in student.split(4)]), torch.cat([b[images] for b in teacher.split(4)]), 0)
    return loss_fn.center


def _dino_worker(rank, world):
    return {sync: _two_steps(rank, world, sync) for sync in (True, False)} | {"uneven": _uneven_centre(rank, world)}


@pytest.mark.slow
def test_two_processes_match_one_process_and_share_the_centre():
    results = run_in_processes(_dino_worker)
    loss, grad, center = _two_steps(0, 1, sync_center=True)
    synced = [r[True] for r in results]
    torch.testing.assert_close((synced[0][0] + synced[1][0]) / 2, loss)
    for rank in range(2):
        # per-image terms: each process's gradient is 2x its share of the 1-process gradient (DDP averages it)
        torch.testing.assert_close(synced[rank][1], 2 * _rank_share(grad, rank, 2))
        torch.testing.assert_close(synced[rank][2], center)
    # without the synchronisation each process's centre follows its own images only
    assert not torch.allclose(results[0][False][2], results[1][False][2])
    # uneven batches: the centre is the mean over all 4 images' teacher rows, not a mean of the two means
    teacher = _views_and_teacher()[0][1]
    for r in results:
        torch.testing.assert_close(r["uneven"], 0.1 * teacher.mean(dim=0))
