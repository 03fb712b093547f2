"""Every method: a few optimizer steps on a fixed digits batch lower its loss, its state_dict
round-trips, and head parameters reach the optimizer with the learning rate they declare."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sslkit import datasets, losses, methods, models, optim
from sslkit.augment import TwoViewAugment
from sslkit.config import config_from_dict

TINY_MODEL = {"backbone": "resnet18", "width": 4, "cifar_stem": True, "projector_hidden": 32, "projector_out": 16}
CASES = {
    "simclr": {"method": {"name": "simclr"}, "loss": {"name": "ntxent", "temperature": 0.2}},
    "simclr-dcl": {"method": {"name": "simclr"}, "loss": {"name": "dcl", "temperature": 0.2}},
    "supcon": {"method": {"name": "supcon"}, "loss": {"name": "supcon", "temperature": 0.2}},
    "supcon-triplet": {"method": {"name": "supcon"}, "loss": {"name": "triplet", "mining": "hard"}},
    "supervised-proxy-anchor": {"method": {"name": "supervised"}, "loss": {"name": "proxy_anchor"}},
    "supervised-arcface": {
        "method": {"name": "supervised"},
        "loss": {"name": "arcface", "scale": 16.0, "margin": 0.2},
    },
    "supervised-sphereface": {"method": {"name": "supervised"}, "loss": {"name": "sphereface"}},
}


def build(case: str):
    cfg = config_from_dict({**CASES[case], "model": TINY_MODEL, "augment": {"image_size": 8}})
    ds = datasets.build_dataset("digits")
    augment = TwoViewAugment(cfg.augment, ds.info.channels, ds.info.mean, ds.info.std)
    torch.manual_seed(0)
    backbone = models.build_backbone("resnet18", 4, True, augment.out_channels)
    return cfg, ds, augment, methods.build_method(cfg, backbone, ds.info.num_classes)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_few_steps_lower_the_loss(case):
    cfg, ds, augment, method = build(case)
    images, labels = ds.__getitems__(list(range(64)))
    torch.manual_seed(1)
    view1, view2 = augment(images)
    groups = optim.parameter_groups(method, 0.0, True)
    optimizer = optim.build_optimizer("adamw", groups, lr=3e-3)
    method.train()
    losses = []
    for _ in range(8):
        loss = method(view1, view2, labels=labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_dict_round_trips(case, tmp_path):
    cfg, ds, augment, method = build(case)
    torch.save(method.state_dict(), tmp_path / "m.pt")
    _, _, _, fresh = build(case)
    for p in fresh.parameters():
        torch.nn.init.normal_(p)
    fresh.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    images, labels = ds.__getitems__(list(range(16)))
    view1, view2 = augment(images)
    method.eval(), fresh.eval()
    torch.testing.assert_close(method(view1, view2, labels=labels), fresh(view1, view2, labels=labels))


@pytest.mark.parametrize("case", ["simclr", "supcon"])
def test_multi_crop_contrasts_every_view_with_every_other(case):
    """2 global views of 8x8 and 3 local ones of 4x4: the local views go through the backbone in a batch of
    their own, the projector sees every view, and the loss treats the 5 views as SupCon's n views."""
    cfg = config_from_dict(
        {**CASES[case], "model": TINY_MODEL, "augment": {"image_size": 8, "local_views": 3, "local_size": 4}}
    )
    ds = datasets.build_dataset("digits")
    augment = TwoViewAugment(cfg.augment, ds.info.channels, ds.info.mean, ds.info.std)
    torch.manual_seed(0)
    method = methods.build_method(cfg, models.build_backbone("resnet18", 4, True, 1), 10).double()
    images, labels = ds.__getitems__(list(range(12)))
    views = [view.double() for view in augment(images)]
    assert [view.shape[-1] for view in views] == [8, 8, 4, 4, 4]
    loss = method(*views, labels=labels)
    features = torch.cat([method.backbone(torch.cat(views[:2])), method.backbone(torch.cat(views[2:]))])
    z = method.projector(features)  # (5 x 12, D), view by view
    same = labels if case == "supcon" else torch.arange(12)  # each image its own class: every other view
    torch.testing.assert_close(loss, losses.supcon_loss(z, same.repeat(5), temperature=0.2))


@pytest.mark.parametrize("name", ["supervised", "nce", "finetune", "distill"])
def test_a_method_without_local_views_refuses_them_in_one_line(name):
    from sslkit.errors import UserError

    recipe = {"method": {"name": name}, "loss": {"name": methods.METHODS[name].loss_names[0]}}
    with pytest.raises(UserError) as caught:
        config_from_dict({**recipe, "augment": {"local_views": 2, "local_size": 4}})
    message = str(caught.value)
    assert f"method '{name}' trains on its global views only" in message and "\n" not in message, message
    takers = "simclr, supcon, moco, mocov3, byol, simsiam, barlow_twins, vicreg, dino"
    assert message.endswith(f"set augment.local_views=0, or use a method with multi-crop: {takers}"), message


def test_proxy_anchor_proxies_get_their_100x_in_the_trainer_groups():
    from sslkit.loop.build import make_optimizer

    cfg, _, _, method = build("supervised-proxy-anchor")
    optimizer, _ = make_optimizer(cfg, method)
    groups = optimizer.param_groups
    proxies = [g for g in groups if any(n.startswith("head.") for n in g["names"])]
    assert proxies and all(g["lr_scale"] == 100.0 for g in proxies)
    seen = [n for g in groups for n in g["names"]]
    assert sorted(seen) == sorted(n for n, p in method.named_parameters() if p.requires_grad)  # every parameter, once


def test_frozen_backbone_gets_no_gradient_and_keeps_batchnorm_statistics():
    _, ds, augment, method = build("supcon")
    images, labels = ds.__getitems__(list(range(32)))
    view1, view2 = augment(images)
    method.train()
    method.backbone_frozen = True
    stats = method.backbone.bn1.running_mean.clone()
    method(view1, view2, labels=labels).backward()
    assert all(p.grad is None for p in method.backbone.parameters())
    assert any(p.grad is not None for p in method.projector.parameters())
    assert torch.equal(stats, method.backbone.bn1.running_mean)
    assert method.backbone.training  # restored after the frozen forward


def test_wrong_loss_kind_for_a_method_is_one_line():
    from sslkit.errors import UserError

    for method_name, loss_name, words in [
        ("simclr", "supcon", "two-view"),
        ("supcon", "ntxent", "label loss"),
        ("supervised", "triplet", "needs a head"),
    ]:
        with pytest.raises(UserError, match=words):  # config validation already refuses the pair
            config_from_dict({"method": {"name": method_name}, "loss": {"name": loss_name}, "model": TINY_MODEL})
        accepted = methods.METHODS[method_name].loss_names[0]
        cfg = config_from_dict({"method": {"name": method_name}, "loss": {"name": accepted}, "model": TINY_MODEL})
        cfg.loss.name = loss_name  # past validation, as a caller of the Python API may do: build_method checks too
        with pytest.raises(UserError, match=words):
            methods.build_method(cfg, models.build_backbone("resnet18", 4, True, 1), 10)


def test_recipe_with_a_loss_its_method_cannot_train_is_refused_when_loaded():
    """The check runs in config validation, before any data or model: and it says which method takes the loss."""
    from sslkit.config import load_config
    from sslkit.errors import UserError

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"
    for overrides, words in [
        (["method.name=supervised", "loss.name=supcon"], ["needs a head", "method.name=supcon"]),
        (["method.name=moco", "loss.name=dcl"], ["ntxent or infonce", "method.name=simclr"]),
        (["method.name=nce", "loss.name=ntxent"], ["loss.name nce", "simclr or moco or mocov3"]),
    ]:
        with pytest.raises(UserError) as caught:
            load_config(recipe, overrides)
        for word in words:
            assert word in str(caught.value), str(caught.value)
    load_config(recipe, ["method.name=supcon", "loss.name=triplet"])  # a pair that goes together loads


def test_head_class_count_must_match_the_dataset():
    from sslkit.errors import UserError

    cfg = config_from_dict(
        {"method": {"name": "supervised"}, "loss": {"name": "proxy_anchor", "num_classes": 100}, "model": TINY_MODEL}
    )
    with pytest.raises(UserError, match="loss.num_classes is 100 but dataset 'digits' has 10"):
        methods.build_method(cfg, models.build_backbone("resnet18", 4, True, 1), 10)


def test_sphereface_annealing_follows_the_trainer_step_and_is_checkpointed():
    _, _, _, method = build("supervised-sphereface")
    start = method.head.lambda_
    method.after_optimizer_step(99, 1000)
    assert int(method.head.step) == 100 and method.head.lambda_ < start
    assert int(method.state_dict()["head.step"]) == 100


def test_every_method_is_a_method_and_the_trainer_calls_need_no_probing():
    """The interface is the base class: each attribute and hook is there with its default, so the
    registry helpers and the trainer read them directly."""
    from sslkit.methods.base import Method, NoOptions

    defaults = {"needs_labels": False, "needs_indices": False, "min_batch_size": 1, "Options": NoOptions}
    defaults["num_views"] = 2
    defaults["classifier_metric"] = None
    assert {k: getattr(Method, k) for k in defaults} == defaults and Method.loss_names == ()
    with pytest.raises(NotImplementedError):
        Method.from_config(config_from_dict({}), models.build_backbone("resnet18", 4, True, 1), 10)
    for name, cls in methods.METHODS.items():
        assert issubclass(cls, Method), name
        assert cls.loss_names and cls.num_views == (1 if name == "finetune" else 2), name
        cfg = config_from_dict({"method": {"name": name}, "loss": {"name": cls.loss_names[0]}})
        assert cls.notes(cfg, num_samples=10**9) == []  # every default suits a large training set
        assert bool(cls.classifier_metric) == (cls.logits is not Method.logits), name  # a reported classifier
    expected = {
        "simclr": 2,
        "supcon": 2,
        "supervised": 1,
        "moco": 1,
        "mocov3": 2,
        "byol": 2,
        "simsiam": 2,
        "barlow_twins": 2,
        "vicreg": 2,
        "dino": 1,
        "nce": 1,
        "finetune": 1,
        "distill": 1,
        "fixmatch": 1,
    }
    assert {name: cls.min_batch_size for name, cls in methods.METHODS.items()} == expected
    assert [name for name, cls in methods.METHODS.items() if cls.needs_labels] == ["supcon", "supervised", "finetune"]
    assert [name for name, cls in methods.METHODS.items() if cls.needs_indices] == ["nce"]


def test_base_hooks_do_nothing():
    _, ds, augment, method = build("simclr")
    images, _ = ds.__getitems__(list(range(4)))
    view1, _ = augment(images)
    before = {k: v.clone() for k, v in method.state_dict().items()}
    method.after_optimizer_step(0, 10)
    assert all(torch.equal(v, method.state_dict()[k]) for k, v in before.items())
    assert not method.backbone_frozen and method.head is None
    with pytest.raises(NotImplementedError, match="SimCLR has no classifier"):
        method.logits(view1)


def test_build_method_passes_the_training_set_size_to_every_method():
    """``num_samples`` goes to every ``from_config`` alike: the methods without per-sample state ignore it."""
    cfg = config_from_dict({**CASES["simclr"], "model": TINY_MODEL})
    method = methods.build_method(cfg, models.build_backbone("resnet18", 4, True, 1), 10, num_samples=123)
    assert isinstance(method, methods.SimCLR)


@pytest.mark.parametrize("label_weight", [0.0, 0.5])
def test_distill_is_the_cross_entropy_of_the_teacher_on_view1_and_the_student_on_view2(label_weight):
    """SimCLRv2 eq. 2-3 written out: softened teacher probabilities of view 1 against the student's of view 2."""
    from sslkit.losses.softmax import SoftmaxHead
    from sslkit.methods.distill import Distill
    from sslkit.methods.finetune import FineTune

    ds = datasets.build_dataset("digits")
    torch.manual_seed(0)
    teacher = FineTune(models.build_backbone("resnet18", 4, True, 1), SoftmaxHead(32, 10)).eval()
    head = SoftmaxHead(32, 10)
    student = Distill(models.build_backbone("resnet18", 4, True, 1), head, teacher, 2.0, label_weight).train()
    images, labels = ds.__getitems__(list(range(12)))
    labels[::2] = -1  # half unlabelled
    cfg = config_from_dict({"augment": {"image_size": 8, "crop_scale_view2": [0.3, 0.6], "jitter_p_view2": 1.0}})
    view1, view2 = TwoViewAugment(cfg.augment, 1, ds.info.mean, ds.info.std)(images)
    loss = student(view1, view2, labels)
    loss.backward()

    with torch.no_grad():
        targets = torch.softmax((teacher.backbone(view1) @ teacher.head.weight.T + teacher.head.bias) / 2.0, dim=1)
    logits = student.backbone(view2) @ head.weight.T + head.bias  # (12, 10)
    expected = sum(-(targets[i] * torch.log_softmax(logits[i] / 2.0, dim=0)).sum() for i in range(12)) / 12
    labelled = [i for i in range(12) if labels[i] >= 0]
    cross_entropy = sum(-torch.log_softmax(logits[i], dim=0)[labels[i]] for i in labelled) / len(labelled)
    expected = expected + label_weight * cross_entropy
    torch.testing.assert_close(loss, expected)
    grads = [p.grad.clone() for p in student.backbone.parameters()]
    student.zero_grad()
    expected.backward()
    for ours, naive in zip(grads, (p.grad for p in student.backbone.parameters())):
        torch.testing.assert_close(ours, naive)
    assert all(p.grad is None for p in teacher.parameters()), "the teacher stays frozen"


def test_a_checkpoint_that_calls_the_head_loss_still_loads():
    """Run directories written before the classifier was called ``head`` store its weights as ``loss.*``."""
    _, _, _, method = build("supervised-arcface")
    old = {
        key.replace("head.", "loss.", 1) if key.startswith("head.") else key: v
        for key, v in method.state_dict().items()
    }
    assert "loss.weight" in old
    _, _, _, fresh = build("supervised-arcface")
    torch.nn.init.normal_(fresh.head.weight)
    fresh.load_state_dict(old)
    torch.testing.assert_close(fresh.head.weight, method.head.weight)
