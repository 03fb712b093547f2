"""Fine-tuning with labels: the whole network, backbone -> classifier, trained on one augmented view.

References:
    [0] SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709, section 7 and appendix B.5:
        fine-tune the whole pretrained network on a class-balanced 1% or 10% of the labels, with
        only random crops and horizontal flips as augmentation.

The classifier is a head from the loss registry (``loss.name``): ``softmax``, a linear layer and
cross-entropy, by default, or any margin / proxy head. The backbone starts from ``run.init_from``
(without it this is supervised training from scratch, the baseline pretraining has to beat) and
keeps its own learning rate (``optim.backbone_lr_scale``); ``train.freeze_backbone_epochs`` trains
the classifier alone first. The result is the network's own test top-1, ``finetune_top1``.
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit import losses
from sslkit.errors import UserError
from sslkit.methods.base import Method


def build_head(cfg, embedding_dim: int, num_classes: int) -> nn.Module:
    """The recipe's head (``loss.name`` and its arguments) for ``num_classes`` classes of the data.

    Raises:
        UserError: ``loss.num_classes`` set to another count than the data's.
    """
    kwargs = dict(cfg.loss.kwargs)
    stated = kwargs.pop("num_classes", num_classes)
    if stated != num_classes:
        raise UserError(
            f"loss.num_classes is {stated} but dataset '{cfg.data.name}' has {num_classes} classes; "
            f"remove loss.num_classes (it is taken from the dataset) or use the dataset it was meant for"
        )
    return losses.build(cfg.loss.name, embedding_dim=embedding_dim, num_classes=num_classes, **kwargs)


class FineTune(Method):
    """``head(f(v), y)`` on one augmented view ``v``; ``logits(x) = head.logits(f(x))``.

    Shape:
        view: (B, C, H, W); labels: (B,) int in [0, num_classes); returns a scalar loss.
    """

    needs_labels = True
    num_views = 1
    loss_names = tuple(losses.BY_KIND["head"])
    classifier_metric = "finetune_top1"

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.loss = backbone, head

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> FineTune:
        return cls(backbone, build_head(cfg, backbone.feature_dim, num_classes))

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """Class scores of preprocessed images, (B, num_classes)."""
        return self.loss.logits(self.backbone(images))

    def forward(self, view: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss(self.encode(view), labels)
