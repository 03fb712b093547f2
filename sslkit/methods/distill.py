"""Self-training: a student learns a fine-tuned teacher's predictions on every image, labelled or not.

References:
    [0] SimCLRv2, Chen et al. 2020, "Big Self-Supervised Models are Strong Semi-Supervised Learners",
        https://arxiv.org/abs/2006.10029, section 2 eq. 2-3: the third step, distillation of the
        fine-tuned network into a student on the unlabelled images, adds the most where labels are
        fewest (its table 3).
    [1] Noisy Student, Xie et al. 2020, "Self-training with Noisy Student improves ImageNet
        classification", https://arxiv.org/abs/1911.04252, section 2: the teacher sees clean
        images, the student noised ones, so that the student learns more than the teacher knows.

The loss on a batch of ``B`` images (eq. 2), with teacher and student logits ``t`` and ``s``::

    L_distill = -1/B sum_i sum_y softmax(t_i / T)_y log softmax(s_i / T)_y

plus, with ``method.distill_label_weight`` w > 0, ``w`` times the student head's own loss on the
batch's labelled images (eq. 3 weighs the two; SimCLRv2 uses distillation alone). The teacher is
a finished run with a classifier (``method.teacher``: ``finetune``, ``supervised``, ``distill``, or
``fixmatch``, whose weight average teaches), loaded with its own recipe's model, kept frozen and in
eval mode; the student is this run's network, started from ``run.init_from``.

The teacher is built and loaded by :func:`sslkit.methods.build_method` (``needs_teacher``): its
method may be any registered method with a classifier.

The teacher predicts on view 1 and the student learns on view 2, two views of the same image: the
student then learns what the teacher predicts for the image, not for one crop of it (Fashion-MNIST,
1% of the labels, three seeds: 0.830 against 0.820 for one view shared by both; docs/results.md).
The recipe's ``*_view2`` augmentation settings can make the student's view the stronger one, the
noised student of [1].
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import losses
from sslkit.errors import UserError
from sslkit.methods.base import Method
from sslkit.methods.finetune import build_head


@dataclasses.dataclass
class DistillOptions:
    """Distillation's options.

    Attributes:
        teacher: The fine-tuned run (a run directory or checkpoint) whose softened predictions the student learns
            from.
        distill_temperature: The temperature of teacher and student softmaxes (SimCLRv2: 1).
        distill_label_weight: Weight of the cross-entropy on the labelled images (``data.label_fraction``) added to
            the distillation loss; 0: distillation alone, as SimCLRv2.
    """

    teacher: str | None = None
    distill_temperature: float = 1.0
    distill_label_weight: float = 0.0


class Distill(Method):
    """Student ``head(f(v2))`` against the teacher's softened predictions on ``v1``, two views of each image.

    Shape:
        view1, view2: (B, C, H, W); labels: (B,) int, -1 for unlabelled images; returns a scalar loss.
    """

    num_views = 2
    needs_teacher = True
    loss_names = tuple(losses.BY_KIND["head"])
    Options = DistillOptions
    classifier_metric = "finetune_top1"

    def __init__(
        self,
        backbone: nn.Module,
        head: nn.Module,
        teacher: nn.Module,
        temperature: float = 1.0,
        label_weight: float = 0.0,
    ) -> None:
        super().__init__()
        self.backbone, self.head, self.teacher = backbone, head, teacher
        self.temperature, self.label_weight = temperature, label_weight

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        m = cls.options_of(cfg)
        if not m.distill_temperature > 0:
            raise UserError(f"{source}: 'method.distill_temperature' must be > 0, got {m.distill_temperature}")
        if m.distill_label_weight < 0:
            raise UserError(f"{source}: 'method.distill_label_weight' must be >= 0.0, got {m.distill_label_weight}")

    @classmethod
    def from_config(
        cls,
        cfg,
        backbone: nn.Module,
        num_classes: int,
        num_samples: int | None = None,
        teacher: Method | None = None,
    ) -> Distill:
        """As :meth:`Method.from_config`, with the ``teacher`` that ``method.teacher`` names, loaded and frozen."""
        if teacher is None:
            raise ValueError("Distill.from_config needs the teacher (sslkit.methods.load_teacher builds it)")
        m = cls.options_of(cfg)
        head = build_head(cfg, backbone.feature_dim, num_classes)
        return cls(backbone, head, teacher, m.distill_temperature, m.distill_label_weight)

    def train(self, mode: bool = True) -> Distill:
        super().train(mode)
        self.teacher.eval()  # the teacher's BatchNorm keeps its statistics: its predictions stay its own
        return self

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """The student's class scores of preprocessed images, (B, num_classes)."""
        return self.head.logits(self.backbone(images))

    def forward(self, view1: torch.Tensor, view2: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            targets = F.softmax(self.teacher.logits(view1).float() / self.temperature, dim=1)  # (B, C)
        features = self.encode(view2)  # (B, D)
        student = F.log_softmax(self.head.logits(features).float() / self.temperature, dim=1)  # (B, C)
        loss = -(targets * student).sum(dim=1).mean()
        if self.label_weight > 0 and labels is not None:
            labelled = labels >= 0
            if bool(labelled.any()):
                loss = loss + self.label_weight * self.head(features[labelled], labels[labelled])
        return loss
