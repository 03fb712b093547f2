"""Schedules are pure functions of the step; LARS follows its update rule; groups split correctly."""

import pytest
import torch
from torch import nn

from sslkit.optim import (
    LARS,
    build_optimizer,
    cosine_lr,
    cosine_momentum,
    parameter_groups,
    scaled_lr,
    set_learning_rate,
)


def test_cosine_lr_warms_up_then_decays():
    lrs = [cosine_lr(t, 100, 1.0, warmup_steps=10, min_lr_ratio=0.1) for t in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert cosine_lr(100, 100, 1.0, 10, 0.1) == pytest.approx(0.1)
    assert cosine_lr(55, 100, 1.0, 10, 0.0) == pytest.approx(0.5)


def test_momentum_schedule_goes_from_base_to_one():
    assert cosine_momentum(0, 10, 0.99) == pytest.approx(0.99)
    assert cosine_momentum(10, 10, 0.99) == pytest.approx(1.0)


def test_scaled_lr_rules():
    assert scaled_lr(0.3, 512, "linear") == pytest.approx(0.6)
    assert scaled_lr(0.3, 1024, "sqrt") == pytest.approx(0.6)
    assert scaled_lr(0.3, 512, "none") == 0.3


def test_groups_exclude_bias_and_norm_and_honour_lr_scales():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2, bias=False))
    groups = parameter_groups(model, weight_decay=0.1, exclude_bias_and_norm=True, lr_scales={"2.weight": 100.0})
    by_scale = {(g["weight_decay"], g["lr_scale"]): g["names"] for g in groups}
    assert by_scale[(0.1, 1.0)] == ["0.weight"]
    assert sorted(by_scale[(0.0, 1.0)]) == ["0.bias", "1.bias", "1.weight"]
    assert by_scale[(0.1, 100.0)] == ["2.weight"]
    optimizer = build_optimizer("sgd", groups, lr=0.5)
    set_learning_rate(optimizer, 0.01)
    assert sorted(g["lr"] for g in optimizer.param_groups) == pytest.approx([0.01, 0.01, 1.0])


def test_lars_step_matches_its_formula():
    w = nn.Parameter(torch.tensor([3.0, 4.0]))
    w.grad = torch.tensor([0.6, 0.8])
    opt = LARS([{"params": [w], "lars": True}], lr=0.1, momentum=0.9, weight_decay=0.0, trust_coefficient=0.01)
    opt.step()
    trust = 0.01 * 5.0 / 1.0
    torch.testing.assert_close(w.detach(), torch.tensor([3.0, 4.0]) - 0.1 * trust * torch.tensor([0.6, 0.8]))


def test_lars_plain_group_is_sgd():
    w = nn.Parameter(torch.tensor([1.0]))
    w.grad = torch.tensor([2.0])
    LARS([{"params": [w], "lars": False, "weight_decay": 0.0}], lr=0.1).step()
    assert w.item() == pytest.approx(1.0 - 0.2)


def test_unknown_optimizer():
    with pytest.raises(ValueError, match="optimizer"):
        build_optimizer("adam", [{"params": [nn.Parameter(torch.zeros(1))]}], lr=0.1)


# --------------------------------------------------------------------------- layer decay, no_weight_decay

VIT_KWARGS = {"img_size": 16, "patch_size": 4, "depth": 3, "embed_dim": 32, "num_heads": 2}


def test_layer_decay_of_a_vit_is_timms():
    """Every parameter's lr multiplier equals the one timm's own ``param_groups_layer_decay`` gives it."""
    timm = pytest.importorskip("timm")
    from timm.optim import param_groups_layer_decay

    from sslkit import models
    from sslkit.optim import layer_decay_scales

    vit = models.build_timm_backbone("vit_tiny_patch16_224", 1, VIT_KWARGS)
    ours = layer_decay_scales(vit, 0.65)
    theirs = {id(p): g["lr_scale"] for g in param_groups_layer_decay(vit, 0.05, layer_decay=0.65) for p in g["params"]}
    assert {name: pytest.approx(theirs[id(p)]) for name, p in vit.named_parameters()} == ours
    assert ours["patch_embed.proj.weight"] == pytest.approx(0.65**3) and ours["blocks.2.mlp.fc2.weight"] == 1.0
    assert isinstance(vit, timm.models.VisionTransformer)


def test_layer_decay_of_sslkits_resnet_goes_block_by_block_from_the_stem():
    from sslkit import models
    from sslkit.optim import layer_decay_scales

    scales = layer_decay_scales(models.build_backbone("resnet18", 8, True, 1), 0.5)
    assert scales["layer4.1.conv2.weight"] == 1.0 and scales["layer4.0.bn1.bias"] == 0.5
    assert scales["layer1.0.conv1.weight"] == 0.5**7 and scales["conv1.weight"] == scales["bn1.weight"] == 0.5**8
    assert layer_decay_scales(models.build_backbone("resnet18", 8, True, 1), 1.0) == {}


def test_the_trainer_decays_the_backbone_layers_and_keeps_a_vits_embeddings_out_of_weight_decay():
    pytest.importorskip("timm")
    from sslkit import methods, models
    from sslkit.config import load_config
    from sslkit.loop.build import make_optimizer

    kwargs = "model.kwargs={" + ", ".join(f"{k}: {v}" for k, v in VIT_KWARGS.items()) + "}"
    cfg = load_config(
        "quickstart_finetune",
        ["model.backbone=vit_tiny_patch16_224", kwargs, "optim.layer_decay=0.5", "optim.backbone_lr_scale=0.1"],
    )
    method = methods.build_method(cfg, models.backbone_from_config(cfg.model, 1), 10, 100)
    optimizer, _ = make_optimizer(cfg, method)
    scale = {name: g["lr_scale"] for g in optimizer.param_groups for name in g["names"]}
    decay = {name: g["weight_decay"] for g in optimizer.param_groups for name in g["names"]}
    assert scale["backbone.blocks.2.attn.qkv.weight"] == pytest.approx(0.1)
    assert scale["backbone.blocks.0.attn.qkv.weight"] == pytest.approx(0.1 * 0.5**2)
    assert scale["backbone.pos_embed"] == pytest.approx(0.1 * 0.5**3)
    assert all(s == 1.0 for name, s in scale.items() if not name.startswith("backbone."))  # the classifier
    assert decay["backbone.pos_embed"] == decay["backbone.cls_token"] == 0.0
    assert decay["backbone.blocks.0.attn.qkv.weight"] == cfg.optim.weight_decay > 0


@pytest.mark.parametrize("value", [0, 1.5])
def test_a_layer_decay_outside_zero_to_one_is_one_line(value):
    from sslkit.config import config_from_dict
    from sslkit.errors import UserError

    with pytest.raises(UserError, match=r"'optim.layer_decay' must be in \(0, 1\]"):
        config_from_dict({"optim": {"layer_decay": value}})
