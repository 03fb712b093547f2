"""Optimizers (SGD, AdamW, LARS) with parameter groups, and schedules as pure functions.

Schedules are functions of the step, not stateful scheduler objects (nanoGPT's ``get_lr``,
DINO's ``cosine_scheduler``): resuming a run only needs the step, and a reader sees the
whole schedule in one line. The trainer sets ``group["lr"] = lr_at(step) * group["lr_scale"]``
before every optimizer step; ``lr_scale`` lets a head ask for its own learning rate
(Proxy-Anchor trains its proxies at 100x).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

OPTIMIZERS = ("sgd", "adamw", "lars")


def cosine_lr(step: int, total_steps: int, base_lr: float, warmup_steps: int = 0, min_lr_ratio: float = 0.0) -> float:
    """Linear warm-up from 0 to ``base_lr`` over ``warmup_steps``, then cosine decay to ``base_lr * min_lr_ratio``.

    ``lr(t) = base * (t + 1) / warmup`` for ``t < warmup``, then
    ``lr(t) = min + (base - min) * (1 + cos(pi * (t - warmup) / (total - warmup))) / 2``.
    """
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    min_lr = base_lr * min_lr_ratio
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def cosine_momentum(step: int, total_steps: int, base_momentum: float = 0.99, final_momentum: float = 1.0) -> float:
    """BYOL / MoCo v3 momentum schedule: ``1 - (1 - base) * (cos(pi * t / total) + 1) / 2``."""
    progress = min(1.0, step / max(1, total_steps))
    return final_momentum - (final_momentum - base_momentum) * (math.cos(math.pi * progress) + 1) / 2


def scaled_lr(base_lr: float, batch_size: int, rule: str) -> float:
    """The learning-rate scaling rule of SimCLR (appendix B.1): linear or square-root in batch / 256."""
    if rule == "linear":
        return base_lr * batch_size / 256
    if rule == "sqrt":
        return base_lr * math.sqrt(batch_size / 256)
    if rule == "none":
        return base_lr
    raise ValueError(f"lr_scaling must be 'none', 'linear' or 'sqrt', got {rule!r}")


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise adaptive rate scaling (You et al. 2017, arXiv 1708.03888).

    Hand-written because neither torch nor a small well-kept package provides it. For each
    parameter with ``lars=True`` in its group::

        g <- g + wd * w
        trust = eta * ||w|| / ||g||   (1 when either norm is 0)
        v <- m * v + trust * g;   w <- w - lr * v

    Groups with ``lars=False`` (biases and norms, as in SimCLR and BYOL) get plain SGD with
    momentum and no weight decay.
    """

    def __init__(
        self, params, lr: float, momentum: float = 0.9, weight_decay: float = 1e-6, trust_coefficient: float = 0.001
    ):
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay, trust_coefficient=trust_coefficient, lars=True
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group["lars"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(grad)
                    trust = torch.where(
                        (w_norm > 0) & (g_norm > 0),
                        group["trust_coefficient"] * w_norm / g_norm,
                        torch.ones_like(w_norm),
                    )
                    grad = grad.mul(trust)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.clone(grad).detach()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(grad)
                p.add_(state["momentum_buffer"], alpha=-group["lr"])
        return loss


def _is_bias_or_norm(name: str, param: nn.Parameter) -> bool:
    return param.ndim <= 1 or name.endswith(".bias")


def parameter_groups(
    module: nn.Module,
    weight_decay: float,
    exclude_bias_and_norm: bool,
    lr_scales: dict[str, float] | None = None,
    no_weight_decay: set[str] = frozenset(),
) -> list[dict]:
    """Split parameters into groups by weight decay and by per-parameter learning-rate scale.

    ``lr_scales`` maps a parameter's name (as in ``module.named_parameters()``) to a
    multiplier of the scheduled lr (a head's proxies at 100x). Biases and norm parameters, and
    the names in ``no_weight_decay`` (a ViT's position embedding and class token), get no weight
    decay (and no LARS adaptation) when ``exclude_bias_and_norm``.
    """
    lr_scales = lr_scales or {}
    groups: dict[tuple[bool, float], dict] = {}
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        plain = exclude_bias_and_norm and (_is_bias_or_norm(name, param) or name in no_weight_decay)
        scale = lr_scales.get(name, 1.0)
        group = groups.setdefault(
            (plain, scale),
            {
                "params": [],
                "names": [],
                "weight_decay": 0.0 if plain else weight_decay,
                "lars": not plain,
                "lr_scale": scale,
            },
        )
        group["params"].append(param)
        group["names"].append(name)
    return list(groups.values())


def model_no_weight_decay(backbone: nn.Module) -> set[str]:
    """The parameters a timm model says to keep out of weight decay (``no_weight_decay()``: a ViT's
    ``pos_embed`` and ``cls_token``); none for models that do not say."""
    declared = getattr(backbone, "no_weight_decay", None)
    if not callable(declared):
        return set()
    own = {name for name, _ in backbone.named_parameters()}
    return {name for name in declared() if name in own}


def layer_decay_scales(backbone: nn.Module, decay: float) -> dict[str, float]:
    """Layer-wise learning-rate decay (BEiT, Bao et al. 2021; MAE fine-tuning): each backbone parameter's lr
    multiplier ``decay ** (L - i)``, for its layer ``i`` of ``0..L``.

    The layers are timm's ``group_matcher(coarse=False)`` groups, numbered from the input: for a ViT the
    stem (patch embedding, class token, position embedding) is 0, block ``k`` is ``k + 1``, and the last
    block shares ``L`` with the final norm (full rate, as the heads on top); for a ResNet the stem is 0 and
    each residual block one more. timm's own grouping (``timm.models.group_parameters``), so that a
    backbone decays here exactly as timm's ``param_groups_layer_decay`` decays it (a test checks that).
    """
    if decay == 1.0:
        return {}
    # Imported here: timm takes about a second to import, and a run without layer decay never needs it.
    from timm.models import group_parameters

    matcher = getattr(backbone, "group_matcher", None)
    if not callable(matcher):
        raise ValueError(f"{type(backbone).__name__} has no group_matcher(): its layers are unknown")
    layer_of = group_parameters(backbone, matcher(coarse=False), reverse=True)
    top = max(layer_of.values())
    return {name: decay ** (top - layer) for name, layer in layer_of.items()}


def build_optimizer(
    name: str,
    groups: Iterable[dict],
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    trust_coefficient: float = 0.001,
) -> torch.optim.Optimizer:
    """An optimizer by name over prepared parameter groups (see :func:`parameter_groups`)."""
    groups = [dict(g) for g in groups]
    if name == "sgd":
        for g in groups:
            g.pop("lars", None)
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adamw":
        for g in groups:
            g.pop("lars", None)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay)
    if name == "lars":
        return LARS(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, trust_coefficient=trust_coefficient)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Apply the scheduled lr to every group, times the group's own ``lr_scale``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
