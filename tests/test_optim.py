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
