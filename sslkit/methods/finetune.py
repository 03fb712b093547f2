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

``method.finetune_from_projector_layer`` k > 0 fine-tunes from inside the pretrained projector
rather than from the backbone's output (SimCLRv2, Chen et al. 2020, https://arxiv.org/abs/2006.10029,
section 2: "fine-tuning from the first layer of the projection head"): the projector's first k
layers (Linear, BatchNorm, ReLU each) stay between the backbone and the classifier, with the
pretraining run's weights (``run.init_from`` must then be its run directory or a checkpoint: an
exported backbone holds no projector). SimCLRv2 finds this worth most with the fewest labels.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from sslkit import losses
from sslkit.errors import UserError
from sslkit.methods.base import Method
from sslkit.models import build_mlp, weights


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


def projector_layers(cfg, k: int, in_dim: int) -> nn.Sequential:
    """The first ``k`` layers of the recipe's projector (``model.projector_*``).

    Its children are numbered as the pretraining projector's (``0.weight``, ``1.running_mean``, ...),
    so its weights load from that projector's by name. Empty for k = 0 (:meth:`FineTune.check_config`
    keeps k below ``model.projector_layers``).
    """
    m = cfg.model
    return build_mlp(in_dim, m.projector_hidden, m.projector_out, m.projector_layers)[: 3 * k]


@dataclasses.dataclass
class FineTuneOptions:
    """Fine-tuning's options.

    Attributes:
        finetune_from_projector_layer: Keep the first k layers of the pretrained projector (from
            ``run.init_from``; ``model.projector_*`` as the pretraining's) under the classifier, as SimCLRv2 (k=1);
            0: fine-tune from the backbone's output, as SimCLR.
    """

    finetune_from_projector_layer: int = 0


class FineTune(Method):
    """``head(p(f(v)), y)`` on one augmented view ``v``; ``logits(x) = head.logits(p(f(x)))``.

    ``f`` is the backbone and ``p`` the kept projector layers (the identity by default).

    Shape:
        view: (B, C, H, W); labels: (B,) int in [0, num_classes); returns a scalar loss.
    """

    needs_labels = True
    num_views = 1
    loss_names = tuple(losses.BY_KIND["head"])
    Options = FineTuneOptions
    classifier_metric = "finetune_top1"

    def __init__(self, backbone: nn.Module, head: nn.Module, projector: nn.Sequential | None = None) -> None:
        super().__init__()
        self.backbone, self.head = backbone, head
        self.projector = projector if projector is not None else nn.Sequential()

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        k, n = cls.options_of(cfg).finetune_from_projector_layer, cfg.model.projector_layers
        if not 0 <= k < n:
            # The last projector layer is the embedding the loss saw, not a layer to fine-tune from.
            raise UserError(
                f"{source}: 'method.finetune_from_projector_layer' must be in [0, {n - 1}] for a {n}-layer projector "
                f"(model.projector_layers), got {k}; 0 fine-tunes from the backbone's output, 1 from the first layer"
            )

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> FineTune:
        projector = projector_layers(cfg, cls.options_of(cfg).finetune_from_projector_layer, backbone.feature_dim)
        width = cfg.model.projector_hidden if len(projector) else backbone.feature_dim
        return cls(backbone, build_head(cfg, width, num_classes), projector)

    def start_from(self, source: str) -> None:
        """The kept projector layers' weights from the pretraining run or checkpoint ``source``.

        Raises:
            UserError: ``source`` holds no projector, or one of another width.
        """
        if not len(self.projector):
            return
        try:
            state = weights.load_method_state(source)
        except UserError:
            state = {}
        own = self.projector.state_dict()
        theirs = weights.submodule_state(state, "projector")
        wrong_shape, missing, _ = weights.state_differences(theirs, own)
        if not theirs or missing:
            raise UserError(
                f"method.finetune_from_projector_layer={len(self.projector) // 3} needs the pretrained projector, "
                f"but run.init_from '{source}' holds none; give the pretraining's run directory or checkpoint "
                f"(not an exported backbone), or set method.finetune_from_projector_layer=0"
            )
        if wrong_shape:
            name = wrong_shape[0]
            raise UserError(
                f"run.init_from '{source}': its projector's {name} is {tuple(theirs[name].shape)}, this recipe's "
                f"{tuple(own[name].shape)}; set model.projector_hidden (and model.projector_out) to the pretraining's"
            )
        self.projector.load_state_dict({k: theirs[k] for k in own})

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """Class scores of preprocessed images, (B, num_classes)."""
        return self.head.logits(self.projector(self.backbone(images)))

    def forward(self, view: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.projector(self.encode(view)), labels)
