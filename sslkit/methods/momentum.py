"""Momentum (EMA) encoders: freeze a copy, then move it towards the online network after each step.

The update is a named utility (as lightly's ``update_momentum``), called by a method's
``after_optimizer_step``, not hidden inside ``forward``: a reader sees when the target moves.
:class:`MomentumMethod` is what MoCo v2 and v3 share: the key encoder, its keys and its update.

References:
    [0] MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722 (eq. 2)
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from sslkit.errors import UserError
from sslkit.methods.base import Method
from sslkit.optim import cosine_momentum


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


@dataclasses.dataclass
class MomentumOptions:
    """The momentum encoder's options (MoCo v2 and v3).

    Attributes:
        momentum: The momentum encoder's EMA momentum at the start; it follows a cosine from ``momentum`` to
            ``momentum_final`` over training.
        momentum_final: The EMA momentum at the end; set it equal to ``momentum`` for a constant one (MoCo v2:
            0.999).
    """

    momentum: float = 0.99
    momentum_final: float = 1.0


def check_momentum_options(options: MomentumOptions, source: str = "recipe") -> None:
    """One line unless ``0 <= method.momentum <= method.momentum_final <= 1``."""
    if not 0.0 <= options.momentum <= options.momentum_final <= 1.0:
        raise UserError(
            f"{source}: method.momentum {options.momentum} and method.momentum_final {options.momentum_final} must "
            f"satisfy 0 <= momentum <= momentum_final <= 1 (MoCo: 0.99 -> 1.0)"
        )


class MomentumMethod(Method):
    """A method whose keys come from momentum copies of its ``backbone`` and ``projector`` (MoCo v2, v3).

    The copies are frozen submodules ``momentum_backbone`` and ``momentum_projector``: saved in the
    ``state_dict`` and moved by ``.to(device)``, but with ``requires_grad=False``, so the
    optimizer's parameter groups and DDP's reducer leave them alone. After every optimizer step
    they move towards the online modules with the momentum of :func:`sslkit.optim.cosine_momentum`,
    from ``momentum`` at the first step to ``momentum_final`` at the last, which the log shows as ``momentum``.

    A subclass sets ``backbone`` and ``projector``, then calls :meth:`copy_momentum_encoder`.
    """

    Options = MomentumOptions

    def copy_momentum_encoder(self, momentum: float, momentum_final: float) -> None:
        """Freeze copies of ``backbone`` and ``projector`` as they are now, the start of the key encoder."""
        self.momentum_backbone = freeze(copy.deepcopy(self.backbone))
        self.momentum_projector = freeze(copy.deepcopy(self.projector))
        self.momentum, self.momentum_final = momentum, momentum_final

    @torch.no_grad()
    def momentum_encode(self, images: torch.Tensor) -> torch.Tensor:
        """Keys: ``g_m(f_m(images))`` from the momentum copies, without gradient."""
        return self.momentum_projector(self.momentum_backbone(images))

    @torch.no_grad()
    def after_optimizer_step(self, step: int, total_steps: int) -> dict[str, float]:
        """Move the momentum copies; returns the ``momentum`` they moved with."""
        m = cosine_momentum(step, total_steps, self.momentum, self.momentum_final)
        update_momentum(self.backbone, self.momentum_backbone, m)
        update_momentum(self.projector, self.momentum_projector, m)
        return {"momentum": m}
