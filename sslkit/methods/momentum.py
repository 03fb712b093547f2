"""Momentum (EMA) encoders: freeze a copy, then move it towards the online network after each step.

The update is a named utility (as lightly's ``update_momentum``), called by a method's
``after_optimizer_step``, not hidden inside ``forward``: a reader sees when the target moves.

References:
    [0] MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722 (eq. 2)
"""

from __future__ import annotations

import torch
from torch import nn


def freeze(module: nn.Module) -> nn.Module:
    """Turn off gradients for every parameter of ``module`` (in place) and return it.

    A frozen parameter stays in ``state_dict`` (so checkpoints keep it) but
    :func:`sslkit.optim.parameter_groups` skips it and DDP's reducer ignores it.
    """
    for param in module.parameters():
        param.requires_grad_(False)
    return module


@torch.no_grad()
def update_momentum(online: nn.Module, target: nn.Module, m: float) -> None:
    """``theta_target <- m * theta_target + (1 - m) * theta_online``; buffers are copied.

    Eq. 2 of [0]. ``m = 1`` leaves the parameters unchanged, ``m = 0`` copies them. Buffers
    (BatchNorm running statistics) are copied rather than averaged: the target encoder runs in
    training mode, normalising with its own batch statistics, so its running statistics are only
    read if someone evaluates it, and then the online network's are the ones to read.

    One fused ``_foreach_lerp_`` over all parameters instead of a Python loop of small kernels:
    ``lerp(target, online, 1 - m) = target + (1 - m) * (online - target)``.

    Args:
        online: the network trained by the optimizer.
        target: a structurally identical copy (same parameter and buffer order).
        m: momentum in [0, 1].
    """
    if not 0.0 <= m <= 1.0:
        raise ValueError(f"m must be in [0, 1], got {m}")
    online_params, target_params = list(online.parameters()), list(target.parameters())
    online_buffers, target_buffers = list(online.buffers()), list(target.buffers())
    if len(online_params) != len(target_params) or len(online_buffers) != len(target_buffers):
        raise ValueError("online and target must have the same structure (parameters and buffers)")
    if target_params:
        torch._foreach_lerp_(target_params, online_params, 1.0 - m)
    if target_buffers:
        torch._foreach_copy_(target_buffers, online_buffers)
