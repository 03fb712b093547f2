"""MoCo v2, MoCo v3 and the NPID memory-bank method: losses against loops, what trains and what does not,
state that survives a checkpoint, two real processes, and a run of the command in two processes.

Everything runs a width-4 ResNet-18 on scikit-learn's 8x8 digits so the file stays fast on two cores.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_as_ranks, run_in_processes
from safetensors.torch import load_file, save_file
from sklearn.datasets import load_digits

from sslkit import distributed, methods, optim
from sslkit.config import config_from_dict
from sslkit.errors import UserError
from sslkit.losses.ntxent import multi_view_infonce_loss
from sslkit.methods.moco import MoCo, MoCoV3, SplitBatchNorm, split_batch_norm
from sslkit.methods.nce import MemoryBankNCE
from sslkit.models import build_backbone

ROOT = Path(__file__).resolve().parents[1]
BATCH = 16
LOSS = {"moco": "ntxent", "mocov3": "ntxent", "nce": "nce"}


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny: with 2 threads on a busy 2-core machine, OpenMP hand-offs made each step ~40x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fixed_views(n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Two fixed "views" of n digits: the images and their mirror images, each with a little noise."""
    pixels, _ = load_digits(return_X_y=True)
    images = torch.tensor(pixels[:n], dtype=torch.float32).view(n, 1, 8, 8) / 16
    noise = torch.Generator().manual_seed(1)
    return (
        images + 0.05 * torch.randn(images.shape, generator=noise),
        images.flip(3) + 0.05 * torch.randn(images.shape, generator=noise),
    )


def build(name: str, seed: int = 0, num_samples: int = 50_000, loss: str | None = None, **method_options):
    """A tiny method by registry name. nce: a 50k-entry bank, so its 64 noise draws almost never hit
    the batch's own entries (with a small bank and a fixed batch, the batch becomes its own noise)."""
    torch.manual_seed(seed)
    options = {"queue_size": 64, "predictor_hidden": 32, "num_negatives": 64, "bn_splits": 4, **method_options}
    cfg = config_from_dict(
        {
            "method": {"name": name, **options},
            "model": {"width": 4, "projector_hidden": 32, "projector_out": 16},
            "loss": {"name": loss or LOSS[name], "temperature": 0.2},
            "train": {"batch_size": BATCH},
        }
    )
    extra = {"num_samples": num_samples} if name == "nce" else {}
    return methods.METHODS[name].from_config(cfg, build_backbone("resnet18", 4, True, 1), 10, **extra)


def call(method, view1, view2):
    if isinstance(method, MemoryBankNCE):
        return method(view1, view2, None, torch.arange(view1.shape[0]))
    return method(view1, view2)


def fill_queue(method: MoCo, count: int = 32) -> None:
    """Random unit keys, so the loss has negatives from the first call."""
    method.queue.enqueue(
        F.normalize(torch.randn(count, method.queue.dim, generator=torch.Generator().manual_seed(2)), dim=1)
    )


# --------------------------------------------------------------------------- BatchNorm in one process


def test_split_batch_norm_normalises_each_contiguous_block_as_its_own_batch():
    torch.manual_seed(0)
    x = torch.randn(12, 3, 4, 4) * 3 + 1
    split = SplitBatchNorm(3, num_splits=4)
    with torch.no_grad():
        split.weight.uniform_(0.5, 2)
        split.bias.uniform_(-1, 1)
    out = split(x)
    expected = torch.empty_like(x)
    means, variances = [], []
    for group in range(4):  # samples 3 group, 3 group + 1, 3 group + 2
        mean, var = torch.zeros(3), torch.ones(3)
        rows = slice(3 * group, 3 * group + 3)
        expected[rows] = F.batch_norm(x[rows], mean, var, split.weight, split.bias, training=True, momentum=0.1)
        means.append(mean), variances.append(var)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(split.running_mean, torch.stack(means).mean(0))
    torch.testing.assert_close(split.running_var, torch.stack(variances).mean(0))
    split.eval()
    plain = torch.nn.BatchNorm2d(3).eval()
    plain.load_state_dict(split.state_dict())
    torch.testing.assert_close(split(x), plain(x))
    with pytest.raises(ValueError, match="bn_splits"):
        split.train()(x[:10])


def test_split_batch_norm_keeps_channels_last_and_matches_nchw():
    torch.manual_seed(1)
    x = torch.randn(8, 5, 3, 3, requires_grad=True)
    x_cl = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    split, split_cl = SplitBatchNorm(5, num_splits=2), SplitBatchNorm(5, num_splits=2)
    out, out_cl = split(x), split_cl(x_cl)
    assert out_cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out_cl, out)
    grad = torch.randn_like(out)
    out.backward(grad), out_cl.backward(grad)
    torch.testing.assert_close(x_cl.grad, x.grad)
    torch.testing.assert_close(split_cl.running_var, split.running_var)


def test_split_batch_norm_backbone_keeps_torchvision_keys():
    backbone = split_batch_norm(build_backbone("resnet18", 4, True, 1), 4)
    assert sum(isinstance(m, SplitBatchNorm) for m in backbone.modules()) == 20
    build_backbone("resnet18", 4, True, 1).load_state_dict(backbone.state_dict())  # same keys and shapes


# --------------------------------------------------------------------------- what trains


@pytest.mark.parametrize("name", ["moco", "mocov3"])
def test_momentum_encoder_gets_no_gradient_and_no_optimizer_slot(name):
    method = build(name)
    if name == "moco":
        fill_queue(method)
    call(method, *fixed_views()).backward()
    momentum = {n: p for n, p in method.named_parameters() if n.startswith("momentum_")}
    assert momentum and all(p.grad is None and not p.requires_grad for p in momentum.values())
    assert all(p.grad is not None for p in method.backbone.parameters())
    grouped = {n for g in optim.parameter_groups(method, 1e-4, True) for n in g["names"]}
    assert grouped and not grouped & set(momentum)
    assert grouped == {n for n, p in method.named_parameters() if not n.startswith("momentum_")}


@pytest.mark.parametrize("name", ["moco", "mocov3", "nce"])
def test_a_few_sgd_steps_on_a_fixed_batch_lower_the_loss(name):
    method = build(name)
    optimizer = optim.build_optimizer("sgd", optim.parameter_groups(method, 0.0, False), lr=0.02, momentum=0.9)
    if name == "moco":
        fill_queue(method)
        # The same negatives every step (the queue would otherwise fill with this batch's own keys).
        negatives = {k: v.clone() for k, v in method.queue.state_dict().items()}
    views, history = fixed_views(), []
    for step in range(8):
        if name == "moco":
            method.queue.load_state_dict(negatives)
        torch.manual_seed(3)  # the same noise draw (nce) and key shuffle (moco) every step
        loss = call(method, *views)
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if hasattr(method, "after_optimizer_step"):
            method.after_optimizer_step(step, 8)
        history.append(loss.item())
    assert history[-1] < 0.8 * history[0], history


# --------------------------------------------------------------------------- losses against loops


def test_moco_first_step_has_no_negatives_and_its_keys_join_the_queue():
    method = build("moco")
    view1, view2 = fixed_views()
    torch.manual_seed(4)
    assert abs(method(view1, view2).item()) < 1e-6  # an empty queue: the positive is the only candidate
    assert int(method.queue.filled) == 2 * BATCH
    torch.manual_seed(4)
    keys = method._keys(torch.cat([view2, view1]))  # the same shuffle, hence the same keys
    torch.testing.assert_close(method.queue.negatives(), F.normalize(keys, dim=1))


@pytest.mark.parametrize("symmetric", [True, False])
def test_moco_loss_matches_a_loop_over_queries(symmetric):
    method = build("moco", symmetric=symmetric).double()
    fill_queue(method)
    negatives = F.normalize(method.queue.negatives().clone(), dim=1)
    view1, view2 = (v.double() for v in fixed_views())
    torch.manual_seed(5)
    loss = method(view1, view2)
    torch.manual_seed(5)
    with torch.no_grad():
        if symmetric:
            q = method.projector(method.backbone(torch.cat([view1, view2])))
            k = method._keys(torch.cat([view2, view1]))
        else:
            q, k = method.projector(method.backbone(view1)), method._keys(view2)
    terms = []
    for qi, ki in zip(F.normalize(q, dim=1), F.normalize(k, dim=1)):
        positive = torch.exp(qi @ ki / 0.2)
        terms.append(-torch.log(positive / (positive + torch.exp(negatives @ qi / 0.2).sum())))
    # symmetric: the mean over 2B queries is (l(q1, k2) + l(q2, k1)) / 2
    torch.testing.assert_close(loss, torch.stack(terms).mean())


def test_mocov3_loss_is_two_cross_entropies_by_loop():
    method = build("mocov3").double()
    view1, view2 = (v.double() for v in fixed_views())
    loss = method(view1, view2)
    with torch.no_grad():
        q = F.normalize(method.predictor(method.projector(method.backbone(torch.cat([view1, view2])))), dim=1)
        k = F.normalize(method.momentum_projector(method.momentum_backbone(torch.cat([view1, view2]))), dim=1)

    def ctr(queries, keys):
        terms = [
            -torch.log(torch.exp(qi @ keys[i] / 0.2) / torch.exp(keys @ qi / 0.2).sum())
            for i, qi in enumerate(queries)
        ]
        return 2 * 0.2 * torch.stack(terms).mean()

    torch.testing.assert_close(loss, ctr(q[:BATCH], k[BATCH:]) + ctr(q[BATCH:], k[:BATCH]))


# --------------------------------------------------------------------------- multi-crop's local views


def local_views(n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Two smaller "views" of the same n digits: 4x4 crops of the top and bottom halves, with a little noise."""
    pixels, _ = load_digits(return_X_y=True)
    images = torch.tensor(pixels[:n], dtype=torch.float32).view(n, 1, 8, 8) / 16
    noise = torch.Generator().manual_seed(2)
    return tuple(images[:, :, top : top + 4, 2:6] + 0.05 * torch.randn(n, 1, 4, 4, generator=noise) for top in (0, 4))


def by_hand(method, view1, view2, *local):
    """The loss MoCo v2 or v3 trains, from its modules called one by one: the global views through the query
    encoder in one batch, the local views in a second, keys of the global views only (MoCo v2: shuffled as
    the method shuffles them, after ``torch.manual_seed(5)``); the two-view loss without local views, as the
    methods computed it before they took local views."""
    features = method.backbone(torch.cat([view1, view2]))
    if local:
        features = torch.cat([features, method.backbone(torch.cat(local))])
    if isinstance(method, MoCoV3):
        queries = method.predictor(method.projector(features))
        keys = method.momentum_encode(torch.cat([view1, view2]))
        return method.loss.multi_view(queries, keys) if local else method.loss(queries, keys)
    queries = method.projector(features)
    torch.manual_seed(5)
    keys = method._keys(torch.cat([view2, view1]))  # [k2; k1]
    if local:
        return multi_view_infonce_loss(queries, keys.roll(len(view1), dims=0), method.queue.negatives(), 0.2)
    return method.loss(queries, keys, negatives=method.queue.negatives())


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def forward_keeping_the_queue(method, *views):
    """The method's loss, seeded as :func:`by_hand`, and the queue put back as it was (MoCo v2 enqueues)."""
    queue = {key: value.clone() for key, value in method.state_dict().items() if key.startswith("queue.")}
    torch.manual_seed(5)
    loss = method(*views)
    method.load_state_dict(queue, strict=False)
    return loss


@pytest.mark.parametrize("name", ["moco", "mocov3"])
def test_without_local_views_the_forward_is_the_two_view_loss_exactly(name):
    method = build(name)
    if name == "moco":
        fill_queue(method)
    views = fixed_views()
    assert torch.equal(forward_keeping_the_queue(method, *views), by_hand(method, *views))


@pytest.mark.parametrize("name", ["moco", "mocov3"])
def test_local_views_are_queries_against_the_global_views_keys(name):
    """Value and gradient of every parameter, in float64, with two local views of 4x4 next to the 8x8 globals."""
    method = build(name).double()
    if name == "moco":
        fill_queue(method)
    views = [view.double() for view in (*fixed_views(), *local_views())]
    loss = forward_keeping_the_queue(method, *views)
    loss.backward()
    by_method = grads(method)
    method.zero_grad()
    expected = by_hand(method, *views)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    assert by_method.keys() == grads(method).keys()
    for key, grad in grads(method).items():
        torch.testing.assert_close(by_method[key], grad, rtol=1e-10, atol=1e-12, msg=key)
    assert not torch.allclose(loss, by_hand(method, *views[:2]))  # the local views count


def test_moco_enqueues_the_global_views_keys_only():
    with pytest.raises(ValueError, match="local views need symmetric=True"):
        build("moco", symmetric=False)(*fixed_views(), *local_views())
    method = build("moco")
    view1, view2 = fixed_views()
    torch.manual_seed(4)
    method(view1, view2, *local_views())
    torch.manual_seed(4)
    keys = method._keys(torch.cat([view2, view1]))  # the same shuffle, hence the same keys
    assert int(method.queue.filled) == 2 * BATCH
    torch.testing.assert_close(method.queue.negatives(), F.normalize(keys, dim=1))


def test_mocov3_under_loss_name_mocov3_is_the_loss_recipes_call_ntxent():
    """Recipes say loss.name=ntxent for MoCo v3 (only its temperature is read): the same loss as its own name."""
    views = fixed_views()
    by_recipe, by_name = build("mocov3"), build("mocov3", loss="mocov3")
    assert repr(by_name.loss) == repr(by_recipe.loss) == "MoCoV3Loss(temperature=0.2, gather_distributed=True)"
    assert torch.equal(by_name(*views), by_recipe(*views))


def test_nce_bank_moves_halfway_towards_the_new_embeddings():
    method = build("nce", num_samples=40)
    view1, view2 = fixed_views()
    before = method.bank.clone()
    torch.manual_seed(6)
    loss = method(view1, view2, None, torch.arange(3, 3 + BATCH))
    assert torch.isfinite(loss)
    with torch.no_grad():
        z = F.normalize(method.projector(method.backbone(torch.cat([view1, view2]))), dim=1)
    new = F.normalize(z[:BATCH] + z[BATCH:], dim=1)
    torch.testing.assert_close(method.bank[3 : 3 + BATCH], F.normalize(0.5 * before[3 : 3 + BATCH] + 0.5 * new, dim=1))
    assert torch.equal(method.bank[:3], before[:3]) and torch.equal(method.bank[3 + BATCH :], before[3 + BATCH :])
    torch.testing.assert_close(method.bank.norm(dim=1), torch.ones(40))


# --------------------------------------------------------------------------- state and processes


@pytest.mark.parametrize("name", ["moco", "nce"])
def test_state_dict_round_trip_through_safetensors(tmp_path, name):
    """What a checkpoint holds (accelerate writes model.safetensors) restores queue, bank and key encoder exactly."""
    method = build(name)
    views = fixed_views()
    for step in range(2):
        call(method, *views).backward()
        if hasattr(method, "after_optimizer_step"):
            method.after_optimizer_step(step, 10)
    save_file(method.state_dict(), tmp_path / "model.safetensors")  # fails on shared tensors, as accelerate would
    fresh = build(name, seed=1)
    fresh.load_state_dict(load_file(tmp_path / "model.safetensors"))
    for key, value in method.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    if name == "moco":
        assert int(fresh.queue.filled) == 4 * BATCH and int(fresh.queue.ptr) == 4 * BATCH % 64
        assert any(k.startswith("momentum_backbone.") for k in method.state_dict())


def _two_process_checks(rank: int, world: int) -> dict:
    # NPID's bank: each process updates different rows; both must end with the same bank.
    # (MoCo v3's loss across processes: tests/test_loss_mocov3.py.)
    method = build("nce", num_samples=64)
    view1, view2 = fixed_views(16)
    half = slice(8 * rank, 8 * rank + 8)
    method(view1[half], view2[half], None, torch.arange(8 * rank, 8 * rank + 8) * 3)
    return {"bank": method.bank}


@pytest.mark.slow
def test_two_processes_share_one_bank():
    results = run_in_processes(_two_process_checks)
    assert torch.equal(results[0]["bank"], results[1]["bank"])
    untouched = build("nce", num_samples=64).bank
    changed = (results[0]["bank"] != untouched).any(dim=1).nonzero().flatten().tolist()
    assert changed == list(range(0, 48, 3))  # rows 0, 3, ..., 45: both processes' indices


def _ddp_steps(rank: int, world: int, name: str) -> dict:
    """Three DDP steps of a tiny method, each process on its own half of the digits, as the trainer
    wraps it; then one forward after rank 1 has written markers into its buffers."""
    method = build(name, num_samples=64, queue_size=256)  # the same seed on both processes
    skipped = distributed.skip_broadcast_of_replicated_buffers(method)
    ddp = torch.nn.parallel.DistributedDataParallel(method)  # broadcast_buffers=True, as Accelerate wraps it
    optimizer = torch.optim.SGD(method.parameters(), lr=0.1)
    view1, view2 = fixed_views(2 * BATCH)
    half = slice(BATCH * rank, BATCH * (rank + 1))
    for step in range(3):
        indices = torch.arange(BATCH * rank, BATCH * (rank + 1)) * 2
        loss = ddp(view1[half], view2[half], None, indices) if name == "nce" else ddp(view1[half], view2[half])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if hasattr(method, "after_optimizer_step"):
            method.after_optimizer_step(step, 10)
    replicated = method.queue.keys if name == "moco" else method.bank
    state = replicated.clone()
    batch_norm = next(m for m in method.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d))
    if rank == 1:  # a broadcast from rank 0 before the next forward would overwrite both markers
        replicated.fill_(7.0)
        batch_norm.num_batches_tracked.fill_(100)
    with torch.no_grad():
        ddp(view1[half], view2[half], None, torch.arange(BATCH)) if name == "nce" else ddp(view1[half], view2[half])
    return {
        "skipped": skipped,
        "state": state,
        "marker_rows": int((replicated == 7.0).all(dim=1).sum()),
        "batches_tracked": int(batch_norm.num_batches_tracked),
    }


def _ddp_steps_of_both(rank: int, world: int) -> dict:
    return {name: _ddp_steps(rank, world, name) for name in ("moco", "nce")}  # one pair of processes for both


@pytest.fixture(scope="module")
def ddp_results() -> dict:
    by_rank = run_in_processes(_ddp_steps_of_both)
    return {name: [r[name] for r in by_rank] for name in ("moco", "nce")}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moco", "nce"])
def test_ddp_leaves_the_queue_and_bank_alone_and_they_stay_equal_on_every_process(ddp_results, name):
    """MoCo's queue and NPID's bank are equal everywhere by construction, so DDP no longer re-sends them
    from rank 0 each step (32 MiB for a 65,536-key queue); BatchNorm's statistics still are."""
    results = ddp_results[name]
    expected = ["queue.keys", "queue.ptr", "queue.filled"] if name == "moco" else ["bank"]
    assert results[0]["skipped"] == expected
    torch.testing.assert_close(results[0]["state"], results[1]["state"], rtol=0, atol=0)
    if name == "moco":
        assert results[0]["state"].abs().sum(dim=1).gt(0).sum() == 3 * 2 * 2 * BATCH  # 3 steps x 2 processes x 2 views
    # Not overwritten by rank 0's buffer; only the rows the last forward wrote have changed.
    assert results[1]["marker_rows"] == (256 - 2 * 2 * BATCH if name == "moco" else 64 - BATCH)
    assert results[1]["batches_tracked"] == results[0]["batches_tracked"]  # 100 overwritten: BatchNorm still synced


def test_a_model_without_replicated_buffers_is_left_as_it_was():
    backbone = build_backbone("resnet18", 4)
    assert distributed.skip_broadcast_of_replicated_buffers(backbone) == []
    assert not hasattr(backbone, "_ddp_params_and_buffers_to_ignore")


# --------------------------------------------------------------------------- recipes and a real run


def test_a_queue_longer_than_an_epochs_keys_is_noted():
    """Past one epoch's keys the queue holds each image's own older keys as its negatives."""
    cfg = config_from_dict({"method": {"name": "moco", "queue_size": 4096}, "loss": {"name": "ntxent"}})
    assert methods.notes(cfg, num_samples=2049) == []  # symmetric: 4,098 keys an epoch, more than the queue holds
    (note,) = methods.notes(cfg, num_samples=2048)
    assert "method.queue_size=4096 is not below the 4,096 keys an epoch adds (2,048 images, both views)" in note
    cfg.method.options["symmetric"] = False
    assert methods.notes(cfg, num_samples=4097) == [] and len(methods.notes(cfg, num_samples=4096)) == 1
    assert methods.notes(config_from_dict({"method": {"name": "simclr"}}), num_samples=10) == []


def test_recipe_mistakes_are_one_line_user_errors():
    with pytest.raises(UserError, match="bn_splits 5"):
        build("moco", bn_splits=5)
    # The suggestion divides what each pass encodes: 2 images (a batch of one, both views) take 2, not 8.
    one = config_from_dict(
        {"method": {"name": "moco", "bn_splits": 8}, "loss": {"name": "ntxent"}, "train": {"batch_size": 1}}
    )
    with pytest.raises(UserError, match=r"divide the 2 images .* try method.bn_splits=2 or 1$"):
        MoCo.from_config(one, build_backbone("resnet18", 4), 10)
    odd = config_from_dict(
        {
            "method": {"name": "moco", "bn_splits": 2, "symmetric": False},
            "loss": {"name": "ntxent"},
            "train": {"batch_size": 1},
        }
    )
    with pytest.raises(UserError, match=r"try method.bn_splits=1$"):
        MoCo.from_config(odd, build_backbone("resnet18", 4), 10)
    with pytest.raises(UserError, match="loss.name"):
        MoCoV3.from_config(
            config_from_dict({"method": {"name": "mocov3"}, "loss": {"name": "dcl"}}),
            build_backbone("resnet18", 4),
            10,
        )
    nce = config_from_dict({"method": {"name": "nce"}, "loss": {"name": "nce"}})
    with pytest.raises(UserError, match="training set's size"):
        MemoryBankNCE.from_config(nce, build_backbone("resnet18", 4), 10)
    with pytest.raises(UserError, match="momentum_final"):
        build("moco", momentum=0.999, momentum_final=0.99)
    # Local views are a pass of their own: bn_splits must divide it too.
    local = config_from_dict(
        {
            "method": {"name": "moco", "bn_splits": 8},
            "augment": {"local_views": 1, "local_size": 16},
            "train": {"batch_size": 4},
        }
    )
    with pytest.raises(UserError, match=r"the 8 images .* and the 4 local views .* try method.bn_splits=4 or 1$"):
        MoCo.from_config(local, build_backbone("resnet18", 4), 10)
    with pytest.raises(UserError, match="with local views .* set method.symmetric=true"):
        config_from_dict(
            {"method": {"name": "moco", "symmetric": False}, "augment": {"local_views": 2, "local_size": 16}}
        )


@pytest.mark.slow
def test_moco_in_two_processes(tmp_path):
    command = [
        sys.executable,
        "-m",
        "sslkit.cli.pretrain",
        str(ROOT / "recipes" / "quickstart.yaml"),
        f"run.output_dir={tmp_path}",
        "run.name=moco",
        "method.name=moco",
        "method.queue_size=200",
        "model.width=4",
        "model.projector_hidden=32",
        "model.projector_out=16",
        "augment.image_size=8",
        "train.batch_size=64",
        "train.epochs=1",
        "train.max_steps=4",
        "train.threads=1",
        "train.log_every_steps=1",
        "eval.linear_epochs=3",
        "eval.compare_random_init=false",
        "optim.warmup_epochs=0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    result = run_as_ranks(command, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "moco"
    losses = [
        json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
    ]
    # step 1: the queue was empty, the positive is the only candidate
    assert len(losses) == 4 and abs(losses[0]) < 1e-6
    assert all(loss > 1 for loss in losses[1:]), losses  # then 128, then 200 negatives
    # 64 images x 2 views = 128 keys a step, gathered from both processes
    state = load_file(sorted((run / "checkpoints").glob("step-*"))[-1] / "model.safetensors")
    assert int(state["queue.ptr"]) == 4 * 128 % 200 and int(state["queue.filled"]) == 200
    assert not torch.equal(state["momentum_backbone.conv1.weight"], state["backbone.conv1.weight"])
