"""FixMatch: the unlabelled term against the paper's algorithm written as a loop (with the mask rate and the terms
it logs), the weight average that is evaluated, the two-stream batches (both streams, exact resume, two processes,
no streamed shards), the strong view (of the unlabelled images only), and the recipe mistakes it refuses in one
line.

On the bundled digits and a width-4 ResNet-18, so every test takes about a second; the runs themselves are in
test_fixmatch_e2e.py.
"""

from __future__ import annotations

import contextlib
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.data_loader import BatchSamplerShard
from PIL import Image

from sslkit import models
from sslkit.augment import StrongAugment, TwoViewAugment
from sslkit.augment.strong import fixmatch_pool
from sslkit.cli.write_shards import main as write_shards
from sslkit.config import load_config
from sslkit.datasets import TwoStreamBatchSampler, build_dataset, build_splits, two_stream_sampler
from sslkit.datasets.batches import AugmentedViews
from sslkit.errors import UserError
from sslkit.loop.build import make_augment, make_optimizer, make_train_loader
from sslkit.methods import METHODS, FixMatch
from sslkit.methods.fixmatch import unlabelled_loss

TINY = ["model.width=4", "augment.image_size=8", "train.threads=1"]


def tiny_fixmatch(*overrides: str):
    cfg = load_config("quickstart_fixmatch", [*TINY, *overrides])
    torch.manual_seed(0)
    backbone = models.backbone_from_config(cfg.model, 1)
    return cfg, METHODS["fixmatch"].from_config(cfg, backbone, num_classes=10)


# ---------------------------------------------------------------------- the loss


def papers_unlabelled_term(weak: torch.Tensor, strong: torch.Tensor, threshold: float) -> torch.Tensor:
    """Algorithm 1 of the paper, image by image: (1 / mu B) sum_b 1{max q_b >= tau} H(argmax q_b, p(strong_b))."""
    total = strong.new_zeros(())
    for weak_b, strong_b in zip(weak, strong):
        q = torch.softmax(weak_b.detach(), dim=0)  # the pseudo-label's distribution, a constant
        if q.max() >= threshold:
            total = total - torch.log_softmax(strong_b, dim=0)[q.argmax()]
    return total / len(weak)


def test_the_unlabelled_term_is_the_papers_in_value_and_gradient_with_no_gradient_to_the_pseudo_labels():
    generator = torch.Generator().manual_seed(0)
    weak = (torch.randn(24, 10, generator=generator) * 4).requires_grad_()  # some confident, some not
    strong = torch.randn(24, 10, generator=generator, requires_grad=True)
    confident = int((weak.softmax(1).max(1).values >= 0.95).sum())
    assert 0 < confident < 24  # both kinds of image are in the batch

    ours, mask_rate = unlabelled_loss(weak, strong, 0.95)
    assert mask_rate == confident / 24  # the share of pseudo-labels kept, which the log shows
    ours.backward()
    ours_grad, strong.grad = strong.grad.clone(), None
    reference = papers_unlabelled_term(weak, strong, 0.95)
    reference.backward()
    assert torch.allclose(ours, reference, atol=1e-6)
    assert torch.allclose(ours_grad, strong.grad, atol=1e-7)
    assert weak.grad is None  # nothing flows back through the pseudo-labels or the mask
    # The mean runs over all 24 images: an image below the threshold counts as 0, not as absent.
    masked_mean = reference * 24 / confident
    assert not torch.isclose(ours, masked_mean)
    everything, all_kept = unlabelled_loss(weak, strong, 1e-6)
    assert torch.allclose(everything, F.cross_entropy(strong, weak.argmax(1))) and all_kept == 1


def test_a_step_is_the_supervised_term_plus_the_unlabelled_term_of_the_same_network():
    """The method's loss against the algorithm written from separate passes (BatchNorm in eval mode, so a pass
    does not depend on what else is in it), value and gradient of every trained weight; and the metrics it returns
    with it, the two terms and the mask rate."""
    cfg, method = tiny_fixmatch("method.threshold=0.135", "method.lambda_u=0.7")
    method.eval()
    generator = torch.Generator().manual_seed(1)
    b, mu = 2, 7
    weak, strong = torch.randn(2, (1 + mu) * b, 1, 8, 8, generator=generator).unbind(0)
    labels = torch.cat([torch.tensor([3, 8]), torch.full((mu * b,), -1)])
    loss, metrics = method(weak, strong[b:], labels=labels)  # the strong view of the unlabelled images only
    assert loss.requires_grad and not any(p.requires_grad for p in [*method.backbone.parameters()])
    assert not any(value.requires_grad for value in metrics.values())
    ours = torch.autograd.grad(loss, list(method.student.parameters()))

    student = method.student
    with torch.no_grad():
        weak_u = student(weak[b:])  # the pseudo-labels: no graph at all
    confident = int((weak_u.softmax(1).max(1).values >= 0.135).sum())
    assert 0 < confident < mu * b  # (an untrained network's predictions are barely above 1 / 10)
    supervised = F.cross_entropy(student(weak[:b]), labels[:b])
    unlabelled = papers_unlabelled_term(weak_u, student(strong[b:]), 0.135)
    expected = supervised + 0.7 * unlabelled
    reference = torch.autograd.grad(expected, list(student.parameters()))
    assert torch.allclose(loss, expected, atol=1e-5)
    assert metrics["mask_rate"] == confident / (mu * b)
    assert torch.allclose(metrics["supervised_loss"], supervised, atol=1e-5)
    assert torch.allclose(metrics["unlabelled_loss"], unlabelled, atol=1e-5)
    for mine, theirs in zip(ours, reference):
        assert torch.allclose(mine, theirs, atol=1e-5)


def test_a_batch_that_is_not_labelled_then_mu_times_unlabelled_is_refused():
    _, method = tiny_fixmatch()
    images = torch.zeros(9, 1, 8, 8)
    with pytest.raises(ValueError, match=r"\(1 \+ mu\) b rows"):
        method(images, images, labels=torch.zeros(9, dtype=torch.int64))
    images = torch.zeros(16, 1, 8, 8)  # b = 2: a strong view of the 14 unlabelled rows, not of all 16
    with pytest.raises(ValueError, match="strong view of the 14 unlabelled rows, got 16"):
        method(images, images, labels=torch.zeros(16, dtype=torch.int64))


# ---------------------------------------------------------------------- the weight average


def test_the_evaluated_network_is_the_students_moving_average():
    _, method = tiny_fixmatch("method.ema_decay=0.999")
    start = {k: v.clone() for k, v in method.state_dict().items()}
    with torch.no_grad():
        for p in method.student.parameters():
            p.add_(1.0)
        method.student.backbone.bn1.running_mean.fill_(0.25)  # BatchNorm statistics are copied, not averaged
    assert method.after_optimizer_step(step=0, total_steps=100) == {"ema_decay": 0.1}  # min(0.999, 1 / 10), logged
    weight = "backbone.conv1.weight"
    assert torch.allclose(method.state_dict()[weight], start[weight] + 0.9)
    assert torch.equal(method.backbone.bn1.running_mean, method.student.backbone.bn1.running_mean)
    method.after_optimizer_step(step=10_000, total_steps=20_000)  # the decay has reached ema_decay
    assert torch.allclose(method.state_dict()[weight], start[weight] + 0.9 + 0.1 * 0.001)

    # What is evaluated (logits, the backbone that is exported) is the average, not the student.
    images = torch.randn(4, 1, 8, 8)
    method.eval()
    before = method.logits(images)
    with torch.no_grad():
        for p in method.student.parameters():
            p.mul_(-3.0)
    assert torch.equal(method.logits(images), before)
    assert torch.equal(method.logits(images), method.head.logits(method.backbone(images)))


def test_the_optimizer_trains_the_student_at_the_recipes_learning_rates():
    cfg, method = tiny_fixmatch("optim.backbone_lr_scale=0.1")
    optimizer, _ = make_optimizer(cfg, method)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in method.student.parameters()}
    scales = {id(p): group["lr_scale"] for group in optimizer.param_groups for p in group["params"]}
    assert {scales[id(p)] for p in method.student.backbone.parameters()} == {0.1}
    assert {scales[id(p)] for p in method.student.head.parameters()} == {1.0}


# ---------------------------------------------------------------------- the two streams


def digits_with_labels(*overrides: str):
    cfg = load_config("quickstart_fixmatch", [*TINY, "train.batch_size=4", "method.mu=3", *overrides])
    return cfg, build_splits(cfg).train  # every digit, 70 of them labelled


def test_each_batch_is_labelled_images_then_mu_times_as_many_of_any_and_an_epoch_is_a_pass_over_the_unlabelled():
    cfg, train = digits_with_labels()
    labels = train.labels
    labelled_count = int((labels >= 0).sum())
    assert labelled_count == 70 and len(labels) == 1437
    sampler = TwoStreamBatchSampler(labels, labelled_batch=4, unlabelled_ratio=3, seed=0)
    batches = torch.tensor(list(sampler))  # (steps, 4 + 12)
    assert batches.shape == (1437 // 12, 16) == (len(sampler), sampler.batch_size)
    labelled, unlabelled = batches[:, :4].flatten(), batches[:, 4:].flatten()
    assert bool((labels[labelled] >= 0).all())
    # The unlabelled stream is every image, labelled or not, each at most once an epoch.
    assert len(set(unlabelled.tolist())) == len(unlabelled) == 1437 // 12 * 12
    assert bool((labels[unlabelled] >= 0).any()) and bool((labels[unlabelled] < 0).any())
    # The labelled stream cycles: each pass over the 70 labelled images is a permutation of them.
    for start in range(0, len(labelled) - 70 + 1, 70):
        assert sorted(labelled[start : start + 70].tolist()) == (labels >= 0).nonzero().flatten().tolist()
    # The orders are a function of the seed and the epoch alone.
    again = TwoStreamBatchSampler(labels, 4, 3, seed=0)
    assert torch.equal(torch.tensor(list(again)), batches)
    again.set_epoch(1)
    assert not torch.equal(torch.tensor(list(again)), batches)


@pytest.mark.parametrize("in_workers", [False, True])
def test_a_run_resumed_mid_epoch_sees_the_batches_of_an_uninterrupted_one(in_workers):
    """Through the training loader as the loop builds and skips it; with ``data.augment_in_workers`` the views too."""
    cfg, train = digits_with_labels()
    augment = make_augment(cfg, train.info) if in_workers else None
    loader, sampler = make_train_loader(cfg, train, local_batch=4, augment=augment)

    def epoch(skip: int) -> list:
        prepared = Accelerator(cpu=True).prepare(loader)
        batches = Accelerator(cpu=True).skip_first_batches(prepared, skip) if skip else prepared
        batches.set_epoch(3)
        sampler.set_epoch(3)
        out = []
        for images, labels in batches:
            # with data.augment_in_workers the views: a weak one of all 16 images, a strong one of the 12 unlabelled
            views = [*images.views] if isinstance(images, AugmentedViews) else [images]
            out.append((torch.cat([view.flatten() for view in views]), [len(view) for view in views], labels))
        return out

    whole, resumed = epoch(0), epoch(40)
    assert len(whole) == 1437 // 12 and len(resumed) == len(whole) - 40
    for (views, _, labels), (views_again, _, labels_again) in zip(whole[40:], resumed):
        assert torch.equal(views, views_again) and torch.equal(labels, labels_again)
    _, rows, labels = whole[0]
    assert len(labels) == 16 and bool((labels[:4] >= 0).all())  # 4 labelled, then 12 of any image
    assert rows == ([16, 12] if in_workers else [16])


def test_two_processes_split_both_streams_into_disjoint_shares_of_each_step():
    _, train = digits_with_labels()
    labels = train.labels
    sampler = TwoStreamBatchSampler(labels, labelled_batch=2, unlabelled_ratio=3, seed=0, num_processes=2)
    assert len(sampler) == 2 * (1437 // 12)  # a step of the global batch 4 + 12 is two local batches
    shares = [list(BatchSamplerShard(sampler, num_processes=2, process_index=rank)) for rank in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == 1437 // 12
    whole = list(sampler)
    for step, (first, second) in enumerate(zip(*shares)):
        assert [first, second] == whole[2 * step : 2 * step + 2]  # consecutive stretches of both streams
        assert not set(first[2:]) & set(second[2:])  # unlabelled: disjoint
        if step < 70 // 4:  # within the first pass over the labelled images: disjoint too
            assert not set(first[:2]) & set(second[:2])
    unlabelled = [i for step in zip(*shares) for share in step for i in share[2:]]
    assert len(set(unlabelled)) == len(unlabelled)  # and across the epoch, each image once


@pytest.mark.parametrize("method", ["fixmatch", "nce"])
def test_a_method_that_draws_images_by_index_refuses_streamed_shards_in_one_line(tmp_path, method):
    for i in range(4):
        Image.new("L", (8, 8), i).save(tmp_path / f"{i}.png")
    assert write_shards([str(tmp_path), str(tmp_path / "shards" / "s-%06d.tar"), "--per-shard", "4"]) == 0
    stream = build_dataset("webdataset", root=str(tmp_path / "shards" / "s-000000.tar"))
    cfg = load_config("quickstart_fixmatch" if method == "fixmatch" else "nce", TINY)
    assert not METHODS[cfg.method.name].can_stream_shards
    with pytest.raises(UserError, match=f"method '{method}' draws images by index, which streamed shards cannot"):
        make_train_loader(cfg, stream, local_batch=4)


# ---------------------------------------------------------------------- the strong view


def test_every_op_with_a_range_leaves_the_image_as_it_is_at_its_identity_value():
    images = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    for op in fixmatch_pool(channels=3):
        if op.high == op.low:  # identity, autocontrast, equalize: no magnitude
            continue
        same = op.apply(images.clone(), torch.full((3,), op.identity))
        assert torch.allclose(same, images, atol=1e-5), op.name
        changed = op.apply(images.clone(), op.draw(torch.full((3,), 0.01), magnitude=1.0))
        assert not torch.allclose(changed, images, atol=1e-3), op.name


def test_each_image_draws_its_own_ops_and_cutout_greys_a_square_of_the_given_side():
    torch.manual_seed(0)
    image = torch.rand(1, 1, 16, 16)
    out = StrongAugment(channels=1, num_ops=2, magnitude=1.0, cutout=0.0)(image.expand(64, -1, -1, -1))
    assert len({tuple(row.flatten().tolist()) for row in out}) > 20  # one batch, many different draws
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    erased = StrongAugment(channels=1, num_ops=0, cutout=0.5)(torch.zeros(8, 1, 16, 16))
    assert ((erased == 0.5).sum(dim=(1, 2, 3)) == 64).all()  # 8 x 8 grey pixels in every image
    # Loader workers started by spawn get the augmentation pickled.
    again = pickle.loads(pickle.dumps(StrongAugment(channels=3)))
    torch.manual_seed(1)
    expected = StrongAugment(channels=3)(image.expand(4, 3, -1, -1))
    torch.manual_seed(1)
    assert torch.equal(again(image.expand(4, 3, -1, -1)), expected)


def test_the_labelled_images_get_no_strong_view_and_the_unlabelled_ones_the_view_of_draws_for_every_row():
    """The views the loop makes of a batch of b = 2 labelled and mu b = 6 unlabelled images: a weak view of all 8, a
    strong view of the 6; the random numbers are drawn for all 8 rows, so each unlabelled image gets the strong view
    StrongAugment makes of it in the whole batch, and the draws after the batch's are where they would be."""
    cfg, train = digits_with_labels("augment.normalize=false")  # mu = 3; views in [0, 1]
    images, info = train.images[:8], train.info
    views = METHODS["fixmatch"].training_views(cfg, info)
    torch.manual_seed(5)
    weak, strong = views(images)
    after = torch.rand(3)
    assert weak.shape == (8, 1, 8, 8) and strong.shape == (6, 1, 8, 8)

    m = FixMatch.options_of(cfg)
    torch.manual_seed(5)
    weak_again, second_weak = TwoViewAugment(cfg.augment, 1, info.mean, info.std, 2)(images)  # the same crops
    every_row = StrongAugment(1, m.strong_ops, m.strong_magnitude, m.cutout)(second_weak)
    assert torch.equal(weak, weak_again) and torch.equal(strong, every_row[2:])
    assert torch.equal(torch.rand(3), after)


def test_the_strong_view_is_made_after_view_one_which_it_leaves_as_it_was():
    cfg = load_config("quickstart_fixmatch", TINY).augment
    images = (torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
    plain = TwoViewAugment(cfg, 1, (0.3,), (0.3,), num_views=2)
    strong = TwoViewAugment(cfg, 1, (0.3,), (0.3,), num_views=2, view2_ops=StrongAugment(1))
    torch.manual_seed(5)
    weak_a, second_a = plain(images)
    torch.manual_seed(5)
    weak_b, second_b = strong(images)
    assert torch.equal(weak_a, weak_b) and not torch.equal(second_a, second_b)


# ---------------------------------------------------------------------- the user's mistakes


@pytest.mark.parametrize(
    "override, words",
    [
        ("method.threshold=0", ["'method.threshold' must be in (0, 1]", "got 0.0"]),
        ("method.threshold=1.5", ["'method.threshold' must be in (0, 1]", "got 1.5"]),
        ("method.mu=0", ["'method.mu' must be >= 1", "got 0"]),
        ("data.label_fraction=null", ["all 1437 training images are labelled", "data.label_fraction"]),
        ("train.batch_size=256", ["256 x 7", "more than the 1437 training images"]),
    ],
)
def test_a_recipe_fixmatch_cannot_train_is_one_line_and_writes_nothing(tmp_path, override, words):
    from sslkit.cli.pretrain import main

    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        status = main(["quickstart_fixmatch", f"run.output_dir={tmp_path}", *TINY, override])
    lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and all(word in lines[0] for word in words), lines
    assert not any(tmp_path.iterdir())


def test_fixmatch_needs_a_labelled_image():
    with pytest.raises(UserError, match="none of the 5 training images has a label"):
        two_stream_sampler(torch.full((5,), -1), 1, 1, 1, seed=0, method="fixmatch")


def test_fixmatch_is_registered_with_its_options():
    assert METHODS["fixmatch"] is FixMatch
    cfg = load_config("quickstart_fixmatch", TINY)
    assert {k: cfg.method.options[k] for k in ("threshold", "mu", "lambda_u", "ema_decay")} == {
        "threshold": 0.95,
        "mu": 7,
        "lambda_u": 1.0,
        "ema_decay": 0.999,
    }
