"""Supervised metric learning with a classification or proxy head (ArcFace, CosFace, Proxy-Anchor, ...).

backbone -> embedding neck (an MLP, ``model.projector_*``) -> a head of kind ``"head"`` from the
loss registry, which owns the class weights or proxies. The head is part of this module, so
its parameters are in the optimizer and prepared by Accelerate with everything else (a classic
peer bug is a head whose weights never train), with the learning-rate scale it declares.
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit import losses
from sslkit.methods.base import Method
from sslkit.methods.finetune import build_head
from sslkit.models import build_mlp


class Supervised(Method):
    """``head(neck(f(v)), y)`` on both augmented views (2B samples a step).

    Shape:
        view1, view2: (B, C, H, W); labels: (B,) int in [0, num_classes); returns a scalar loss.
    """

    needs_labels = True
    classifier_metric = "head_top1"
    loss_names = tuple(losses.BY_KIND["head"])  # heads with their own weights

    def __init__(self, backbone: nn.Module, neck: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.neck, self.head = backbone, neck, head

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> Supervised:
        m = cfg.model
        neck = build_mlp(backbone.feature_dim, m.projector_hidden, m.projector_out, m.projector_layers)
        return cls(backbone, neck, build_head(cfg, m.projector_out, num_classes))

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """The head's class scores of preprocessed images (no margin), (B, num_classes)."""
        return self.head.logits(self.neck(self.backbone(images)))

    def after_optimizer_step(self, step: int, total_steps: int) -> dict[str, float]:
        # Heads annealed by the step (SphereFace's lambda) follow the trainer's step.
        if hasattr(self.head, "set_step"):
            self.head.set_step(step + 1)
        return {}

    def forward(self, view1: torch.Tensor, view2: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        embeddings = self.neck(self.encode(torch.cat([view1, view2])))  # the head's space, (2B, D)
        return self.head(embeddings, torch.cat([labels, labels]))
