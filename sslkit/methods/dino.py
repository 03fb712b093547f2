"""DINO (Caron et al. 2021): a student matches a momentum teacher's centred, sharpened outputs.

References:
    [0] DINO, Caron et al. 2021, https://arxiv.org/abs/2104.14294 (section 3.1, Algorithm 1, appendix)
    [1] The authors' code, https://github.com/facebookresearch/dino (vision_transformer.py ``DINOHead``,
        main_dino.py)

Multi-crop ([0], section 3.1): the teacher sees the two global views of each image, the student
those and any local views (``augment.local_views``), and each student view is compared with the
teacher's output for every global view but itself.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import losses
from sslkit.errors import UserError
from sslkit.methods.momentum import MomentumMethod, MomentumOptions, check_momentum_options


class DINOHead(nn.Module):
    """DINO's projection head ([1], ``DINOHead``): an MLP to a bottleneck, L2-normalised, then a
    weight-normalised linear layer to K outputs.

    ``num_layers`` linear layers with GELU between them (no BatchNorm, [1]'s default) map the
    features to ``bottleneck_dim``; the last layer's rows are normalised to length 1 (weight
    normalisation with its gain fixed at 1, [1]'s ``norm_last_layer``), so its output is the
    cosine of the bottleneck with each of K directions.

    While :attr:`last_layer_frozen`, the last layer sends a zero gradient to its weight ([0]
    freezes it during the first epoch, which stabilises training): the weight stays in the graph,
    so DDP needs no ``find_unused_parameters``. The weight then changes by weight decay alone,
    which only scales each row and leaves the normalised layer, hence the outputs, as they were.

    Shape:
        x: (B, in_dim); returns (B, out_dim).
    """

    def __init__(self, in_dim: int, hidden_dim: int, bottleneck_dim: int, out_dim: int, num_layers: int = 3) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        layers: list[nn.Module] = []
        dim = in_dim
        for _ in range(num_layers - 1):
            layers += [nn.Linear(dim, hidden_dim), nn.GELU()]
            dim = hidden_dim
        layers.append(nn.Linear(dim, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        self.last_layer = nn.Parameter(torch.empty(out_dim, bottleneck_dim))
        nn.init.trunc_normal_(self.last_layer, std=0.02)  # [1] initialises its linear layers so
        self.last_layer_frozen = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.last_layer
        if self.last_layer_frozen:
            weight = weight.detach() + 0 * weight  # the same values, a zero gradient
        return F.normalize(self.mlp(x), dim=1) @ F.normalize(weight, dim=1).T  # (B, K)


@dataclasses.dataclass
class DINOOptions(MomentumOptions):
    """DINO's options (the head's sizes are ``model.projector_*``, K is ``loss.output_dim``).

    Attributes:
        momentum: The teacher's EMA momentum at the start; it follows a cosine from ``momentum`` to
            ``momentum_final`` over training (DINO: 0.996 -> 1).
        momentum_final: The EMA momentum at the end; set it equal to ``momentum`` for a constant one.
        freeze_last_layer_epochs: Epochs at the start during which the head's last layer is not trained
            (DINO: 1).
    """

    momentum: float = 0.996
    momentum_final: float = 1.0
    freeze_last_layer_epochs: int = 1


class DINO(MomentumMethod):
    """DINO [0] with multi-crop: :class:`~sslkit.losses.DINOLoss` of the student's outputs for every view
    against the teacher's for the two global views.

    Student ``s = h(f(x))`` (backbone ``f``, :class:`DINOHead` ``h``); teacher ``t = h_m(f_m(x))`` from
    momentum copies of both, without gradient, moved after every optimizer step with a momentum on a
    cosine from ``momentum`` to ``momentum_final``. The loss centres and sharpens the teacher's outputs
    (the centre, a buffer of the loss, is averaged over every process), with the teacher temperature of
    the current epoch (:attr:`~sslkit.methods.base.Method.epoch`, set by the trainer). The head's last
    layer is frozen for the first ``freeze_last_layer_epochs`` epochs. The head is
    ``model.projector_layers`` layers, ``model.projector_hidden`` wide to a ``model.projector_out``
    bottleneck (DINO: 3, 2048, 256), then K = ``loss.output_dim`` outputs (65536); any backbone, a
    ResNet or a ViT. Both global views go through each network in one batch, the local views through the
    student's backbone in a second one (they are smaller), and the student's head sees every view's
    features in one batch (the authors' ``MultiCropWrapper``).

    Shape:
        view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; returns a scalar loss.
    """

    loss_names = ("dino",)
    takes_local_views = True
    Options = DINOOptions

    def __init__(
        self,
        backbone: nn.Module,
        head: DINOHead,
        loss: losses.DINOLoss,
        momentum: float = 0.996,
        momentum_final: float = 1.0,
        freeze_last_layer_epochs: int = 1,
    ) -> None:
        super().__init__()
        self.backbone, self.projector, self.loss = backbone, head, loss
        self.copy_momentum_encoder(momentum, momentum_final)
        self.freeze_last_layer_epochs = freeze_last_layer_epochs

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        m = cls.options_of(cfg)
        check_momentum_options(m, source)
        if m.freeze_last_layer_epochs < 0:
            raise UserError(
                f"{source}: method.freeze_last_layer_epochs must be >= 0, got {m.freeze_last_layer_epochs}"
            )
        views = cfg.loss.kwargs.get("num_global_views", 2)
        if views != 2:
            raise UserError(
                f"{source}: method 'dino' gives its teacher the two global views the trainer passes (any "
                f"other views are local, augment.local_views): loss.num_global_views must be 2, got {views}"
            )

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> DINO:
        m, model = cls.options_of(cfg), cfg.model
        loss = losses.build(cfg.loss.name, **cfg.loss.kwargs)
        head = DINOHead(
            backbone.feature_dim, model.projector_hidden, model.projector_out, loss.output_dim, model.projector_layers
        )
        return cls(backbone, head, loss, m.momentum, m.momentum_final, m.freeze_last_layer_epochs)

    def after_optimizer_step(self, step: int, total_steps: int) -> dict[str, float]:
        """Move the teacher; returns its ``momentum`` and the ``teacher_temperature`` of this step's loss."""
        loss = self.loss
        temperature = losses.dino_teacher_temperature(
            self.epoch, loss.teacher_temperature, loss.warmup_teacher_temperature, loss.warmup_epochs
        )
        return {**super().after_optimizer_step(step, total_steps), "teacher_temperature": temperature}

    def forward(
        self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.projector.last_layer_frozen = self.epoch < self.freeze_last_layer_epochs
        student = self.projector(self.encode_views(view1, view2, *local_views))  # (VB, K), view by view
        return self.loss(student, self.momentum_encode(torch.cat([view1, view2])), self.epoch)  # then the centre moves
