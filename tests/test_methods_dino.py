"""DINO: its forward against the paper's cross-entropy by loop (float64), with two global views and with
multi-crop's local views, the centre, the teacher-temperature warm-up and the frozen last layer by epoch, the
teacher's momentum, a ViT backbone (local views at their own size), a multi-crop run resumed exactly, and the
recipe mistakes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from sklearn.datasets import load_digits

from sslkit import methods, optim
from sslkit.cli.export import export
from sslkit.config import config_from_dict, load_config
from sslkit.errors import UserError
from sslkit.loop import train
from sslkit.losses import dino_teacher_temperature
from sslkit.models import build_backbone

BATCH = 8
LOSS = {"name": "dino", "output_dim": 32, "warmup_epochs": 4}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fixed_views(n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    pixels, _ = load_digits(return_X_y=True)
    images = torch.tensor(pixels[:n], dtype=torch.float32).view(n, 1, 8, 8) / 16
    noise = torch.Generator().manual_seed(1)
    return images + 0.05 * torch.randn(images.shape, generator=noise), images.flip(3)


def build(model: dict | None = None, **method_options):
    torch.manual_seed(0)
    model = model or {"width": 4, "projector_hidden": 16, "projector_out": 8, "projector_layers": 3}
    cfg = config_from_dict({"method": {"name": "dino", **method_options}, "model": model, "loss": LOSS})
    return methods.build_method(cfg, build_backbone("resnet18", 4, True, 1), 10)


@pytest.mark.parametrize("epoch", [0, 2, 7])
def test_forward_is_the_cross_entropy_of_each_view_against_the_teachers_other_view(epoch):
    method = build().double()
    method.epoch = epoch
    method.loss.center.copy_(torch.linspace(-0.1, 0.1, 32, dtype=torch.float64))
    center = method.loss.center.clone()
    view1, view2 = (v.double() for v in fixed_views())
    loss = method(view1, view2)
    with torch.no_grad():
        student = method.projector(method.backbone(torch.cat([view1, view2]))).chunk(2)
        teacher = method.momentum_projector(method.momentum_backbone(torch.cat([view1, view2]))).chunk(2)
    tau_t = dino_teacher_temperature(epoch, 0.07, 0.04, 4)
    terms = []
    for t_view, s_view in [(0, 1), (1, 0)]:  # a view is not compared with itself
        for i in range(BATCH):  # eq. 1-3 of DINO, one image at a time
            p_t = F.softmax((teacher[t_view][i] - center) / tau_t, dim=0)
            log_p_s = F.log_softmax(student[s_view][i] / 0.1, dim=0)
            terms.append(-(p_t * log_p_s).sum())
    torch.testing.assert_close(loss, torch.stack(terms).mean())
    # then the centre moves towards the teacher's mean output
    torch.testing.assert_close(method.loss.center, 0.9 * center + 0.1 * torch.cat(teacher).mean(0))


def test_the_last_layer_is_frozen_in_the_first_epoch_and_the_teacher_never_trains():
    method = build(freeze_last_layer_epochs=1)
    views = fixed_views()
    method(*views).backward()
    head = method.projector
    assert torch.count_nonzero(head.last_layer.grad) == 0
    assert all(torch.count_nonzero(p.grad) > 0 for p in head.mlp.parameters())
    teacher = [p for n, p in method.named_parameters() if n.startswith("momentum_")]
    assert teacher and all(p.grad is None and not p.requires_grad for p in teacher)
    # weight decay alone scales each row of the frozen layer: its normalised outputs stay as they were
    optimizer = optim.build_optimizer("adamw", optim.parameter_groups(method, 0.1, False), lr=0.1)
    features = torch.randn(4, 8)
    before = F.normalize(features) @ F.normalize(head.last_layer.detach(), dim=1).T
    optimizer.step()
    torch.testing.assert_close(F.normalize(features) @ F.normalize(head.last_layer.detach(), dim=1).T, before)
    method.zero_grad()
    method.epoch = 1
    method(*views).backward()
    assert torch.count_nonzero(head.last_layer.grad) > 0


def test_the_teacher_moves_by_the_momentum_rule_after_the_step():
    method = build(momentum=0.9)
    optimizer = optim.build_optimizer("sgd", optim.parameter_groups(method, 0.0, False), lr=0.1, momentum=0.0)
    method.epoch = 1
    method(*fixed_views()).backward()
    optimizer.step()
    teacher = {n: p.detach().clone() for n, p in method.named_parameters() if n.startswith("momentum_")}
    online = dict(method.named_parameters())
    m = optim.cosine_momentum(2, 10, 0.9, 1.0)
    # the log shows the momentum and the teacher temperature of epoch 1 (warm-up from 0.04 to 0.07 over 4 epochs)
    assert method.after_optimizer_step(2, 10) == {"momentum": m, "teacher_temperature": pytest.approx(0.05)}
    for name, param in method.named_parameters():
        if name.startswith("momentum_"):
            expected = m * teacher[name] + (1 - m) * online[name.removeprefix("momentum_")]
            torch.testing.assert_close(param, expected, msg=name)


def test_a_vit_trains_under_dino():
    model = {"backbone": "timm/vit_tiny_patch16_224", "projector_hidden": 16, "projector_out": 8}
    model["kwargs"] = {"img_size": 8, "patch_size": 4, "depth": 1, "embed_dim": 16, "num_heads": 2}
    torch.manual_seed(0)
    cfg = config_from_dict({"method": {"name": "dino"}, "model": model, "loss": LOSS, "augment": {"image_size": 8}})
    from sslkit.models import backbone_from_config

    method = methods.build_method(cfg, backbone_from_config(cfg.model, 1), 10)
    method.epoch = 1
    method(*fixed_views()).backward()
    assert all(p.grad is not None for p in method.backbone.parameters() if p.requires_grad)


def test_multi_crop_compares_every_student_view_with_the_teachers_other_global_views():
    """2 global views and 2 local ones (4x4): the teacher sees the global views only, each student view is
    compared with every global teacher view but itself; the local views go through the backbone together."""
    method = build().double()
    method.epoch = 1
    view1, view2 = (v.double() for v in fixed_views())
    local = [F.interpolate(v, size=4, mode="bilinear", antialias=True) for v in (view1, view2.flip(2))]
    loss = method(view1, view2, *local)
    with torch.no_grad():
        features = torch.cat([method.backbone(torch.cat([view1, view2])), method.backbone(torch.cat(local))])
        student = method.projector(features).chunk(4)
        teacher = method.momentum_projector(method.momentum_backbone(torch.cat([view1, view2]))).chunk(2)
    tau_t = dino_teacher_temperature(1, 0.07, 0.04, 4)
    terms = [
        -(F.softmax(teacher[t][i] / tau_t, dim=0) * F.log_softmax(student[s][i] / 0.1, dim=0)).sum()
        for t in range(2)
        for s in range(4)
        if s != t
        for i in range(BATCH)
    ]
    assert len(terms) == 6 * BATCH
    torch.testing.assert_close(loss, torch.stack(terms).mean())
    torch.testing.assert_close(method.loss.center, 0.1 * torch.cat(teacher).mean(0))  # from the global views


def test_a_vit_takes_local_views_at_their_own_size():
    model = {"backbone": "timm/vit_tiny_patch16_224", "projector_hidden": 16, "projector_out": 8}
    model["kwargs"] = {"img_size": 8, "patch_size": 2, "depth": 1, "embed_dim": 16, "num_heads": 2}
    model["kwargs"]["dynamic_img_size"] = True  # interpolated position embeddings for the 4x4 local views
    augment = {"image_size": 8, "local_views": 2, "local_size": 4}
    torch.manual_seed(0)
    cfg = config_from_dict({"method": {"name": "dino"}, "model": model, "loss": LOSS, "augment": augment})
    from sslkit.models import backbone_from_config

    method = methods.build_method(cfg, backbone_from_config(cfg.model, 1), 10)
    view1, view2 = fixed_views()
    method(view1, view2, view1[..., :4, :4], view2[..., 4:, 4:]).backward()
    assert all(p.grad is not None for p in method.backbone.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    "method, loss, words",
    [
        ({"name": "dino", "freeze_last_layer_epochs": -1}, LOSS, "freeze_last_layer_epochs must be >= 0"),
        ({"name": "dino"}, {**LOSS, "num_global_views": 3}, "loss.num_global_views must be 2"),
        ({"name": "dino"}, {"name": "byol"}, "trains with loss.name dino, got 'byol'"),
        ({"name": "simclr"}, LOSS, "loss.name 'dino' trains with method.name=dino"),
    ],
)
def test_recipe_mistakes_are_one_line(method, loss, words):
    with pytest.raises(UserError) as caught:
        config_from_dict({"method": method, "loss": loss})
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_multi_crop_run_resumes_exactly_and_exports(tmp_path):
    """4 steps of DINO with 2 local views on digits, straight and stopped after step 2 then resumed: the same
    losses, backbone and centre; the run evaluates and exports."""
    tiny = ["train.batch_size=32", "train.threads=1", "eval.linear_epochs=0", "eval.compare_random_init=false"]
    tiny += ["eval.compare_raw_pixels=false", "model.width=4", "model.projector_hidden=32", "loss.output_dim=32"]
    tiny += [
        "train.max_steps=4",
        "train.checkpoint_every_steps=2",
        "train.keep_checkpoints=3",
        "train.log_every_steps=1",
    ]
    tiny += ["augment.local_views=2", "augment.local_size=8", "augment.local_crop_scale=[0.2,0.5]"]

    def run(name: str, *overrides: str) -> None:
        train(load_config("quickstart_dino", [f"run.output_dir={tmp_path}", f"run.name={name}", *tiny, *overrides]))

    def losses(name: str) -> list[float]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if "loss" in r]

    run("straight")
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000004")
    for name in ("backbone.safetensors", "results.json"):
        (tmp_path / "resumed" / name).unlink()
    run("resumed", "run.resume=auto")
    assert len(losses("straight")) == 4 and losses("resumed") == losses("straight")
    states = [
        load_file(tmp_path / name / "checkpoints" / "step-00000004" / "model.safetensors")
        for name in ("straight", "resumed")
    ]
    assert states[0].keys() == states[1].keys() and all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert "loss.center" in states[0] and states[0]["loss.center"].abs().sum() > 0
    assert "knn_top1" in json.loads((tmp_path / "straight" / "results.json").read_text())["results"]["trained"]
    path, _ = export(tmp_path / "straight", "safetensors")
    exported, backbone = load_file(path), load_file(tmp_path / "straight" / "backbone.safetensors")
    assert exported.keys() == backbone.keys() and all(torch.equal(exported[k], backbone[k]) for k in backbone)
