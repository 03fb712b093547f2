"""FixMatch: a classifier trained on few labels and on its own confident predictions for unlabelled images.

References:
    [0] FixMatch, Sohn et al. 2020, https://arxiv.org/abs/2001.07685, algorithm 1 and section 2.

Each step takes ``B`` labelled images (``train.batch_size``) and ``mu B`` unlabelled ones, drawn by
one sampler from two streams (:mod:`sslkit.datasets.two_streams`: the labelled subset, and every
training image as unlabelled, as the paper). Every image comes as a weak view (the recipe's
``augment``: crops and flips), and every unlabelled one as a strong view too (another weak view, then
RandAugment and Cutout: :class:`~sslkit.augment.strong.StrongAugment`); the loss reads no strong view
of a labelled image, so none is made. With ``p = softmax(f(weak u))`` and the pseudo-label
``q = argmax p``::

    loss = CE(f(weak x), y)  +  lambda_u * (1 / mu B) sum_b 1[max p_b >= threshold] CE(f(strong u_b), q_b)

The mean runs over all ``mu B`` unlabelled images: one whose prediction is below the threshold counts
as zero (so the term shrinks while few predictions are confident). No gradient flows through
``q``. The three batches go through the network as one (BatchNorm sees them together, as in the
paper's code), and ``p`` is read from that same forward pass, detached.

The weights that train are the ``student`` (backbone and head). What the run evaluates, exports and
checkpoints as ``backbone`` and ``head`` is their exponential moving average (EMA, decay
``ema_decay``), moved after every optimizer step (:func:`~sslkit.methods.momentum.update_momentum`;
BatchNorm statistics are copied). The decay starts low, ``min(ema_decay, (1 + t) / (10 + t))`` at
step ``t`` as TensorFlow's ``ExponentialMovingAverage`` with ``num_updates``, so that a short run's
average is not mostly its starting weights. The student starts from ``run.init_from`` (a pretrained
encoder) or at random, and the EMA as its copy.

The log shows, beside the loss, its two terms (``supervised_loss``, and ``unlabelled_loss`` before
``lambda_u``), the ``mask_rate`` (the share of the unlabelled images whose pseudo-label passes the
threshold, which the paper's code logs every step: near 0 the unlabelled images teach nothing) and the
``ema_decay`` of the average.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from sslkit.augment import StrongAugment, TwoViewAugment
from sslkit.datasets import DatasetInfo
from sslkit.datasets.two_streams import TwoStreamBatchSampler, two_stream_sampler
from sslkit.errors import UserError
from sslkit.methods.base import LossAndMetrics, Method
from sslkit.methods.finetune import build_head
from sslkit.methods.momentum import freeze, update_momentum


@dataclasses.dataclass
class FixMatchOptions:
    """FixMatch's options (the paper's defaults).

    Attributes:
        threshold: Confidence above which a prediction on an unlabelled image becomes its pseudo-label, in (0, 1].
        mu: Unlabelled images per labelled one in a step (each step draws ``mu x train.batch_size`` of them).
        lambda_u: Weight of the unlabelled term.
        ema_decay: Decay of the weight average that is evaluated and exported, in [0, 1) (0: the student itself).
        strong_ops: RandAugment ops drawn for each image's strong view (0: Cutout alone).
        strong_magnitude: Share of each RandAugment op's range its magnitudes are drawn from, in [0, 1] (1: the
            paper's ranges).
        cutout: Side of Cutout's grey square in the strong view, as a fraction of the image side, in [0, 1).
    """

    threshold: float = 0.95
    mu: int = 7
    lambda_u: float = 1.0
    ema_decay: float = 0.999
    strong_ops: int = 2
    strong_magnitude: float = 1.0
    cutout: float = 0.5


def unlabelled_loss(
    weak_logits: torch.Tensor, strong_logits: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """FixMatch's unlabelled term, ``(1 / n) sum_b 1[max p_b >= threshold] CE(strong_b, argmax p_b)``, and its mask
    rate, the share of the ``n`` images whose prediction passes the threshold.

    ``p = softmax(weak_logits)``; the mean is over all ``n`` images, those below the threshold counting as 0.
    The pseudo-labels and the mask come from ``weak_logits`` detached: no gradient reaches them.

    Shape:
        weak_logits, strong_logits: (n, C); returns two scalars.
    """
    with torch.no_grad():
        confidence, pseudo_labels = weak_logits.detach().float().softmax(dim=1).max(dim=1)  # (n,), (n,)
        mask = (confidence >= threshold).float()
    return (F.cross_entropy(strong_logits.float(), pseudo_labels, reduction="none") * mask).mean(), mask.mean()


class Classifier(nn.Module):
    """``head.logits(backbone(x))``: the network FixMatch trains, and the shape of its average."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head.logits(self.backbone(images))


class StrongViewOfUnlabelled(nn.Module):
    """The strong view of the ``mu b`` unlabelled rows of a FixMatch batch of ``(1 + mu) b`` (its second weak view).

    Shape:
        images: ((1 + mu) b, C, H, W) float in [0, 1], the ``b`` labelled rows first; returns (mu b, C, H, W).
    """

    def __init__(self, strong: StrongAugment, mu: int) -> None:
        super().__init__()
        self.strong, self.mu = strong, mu

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.strong(images, first=images.shape[0] // (1 + self.mu))


class FixMatch(Method):
    """FixMatch on a weak and a strong view of ``B`` labelled, then ``mu B`` unlabelled images (see the module doc).

    Attributes:
        student: the :class:`Classifier` the optimizer trains (:meth:`trained_backbone`, :meth:`trained_head`).
        backbone, head: the student's weight average, evaluated and exported (frozen: no gradient).

    Shape:
        weak: ((1 + mu) b, C, H, W), the ``b`` labelled images first; strong: (mu b, C, H, W), the unlabelled
        images'; labels: ((1 + mu) b,), those of the first ``b`` rows >= 0 (the rest are not read); returns the
        scalar loss with its metrics: ``mask_rate``, ``supervised_loss`` and ``unlabelled_loss``
        (``loss = supervised_loss + lambda_u unlabelled_loss``).
    """

    num_views = 2
    loss_names = ("softmax",)
    Options = FixMatchOptions
    classifier_metric = "finetune_top1"
    can_stream_shards = False  # its batches are drawn by index from two streams

    def __init__(self, backbone: nn.Module, head: nn.Module, options: FixMatchOptions | None = None) -> None:
        super().__init__()
        self.options = options or FixMatchOptions()
        self.student = Classifier(backbone, head)
        self.backbone, self.head = freeze(copy.deepcopy(backbone)), freeze(copy.deepcopy(head))

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        m = cls.options_of(cfg)
        checks = (
            (0 < m.threshold <= 1, "threshold", "in (0, 1] (FixMatch: 0.95)", m.threshold),
            (m.mu >= 1, "mu", ">= 1 unlabelled images per labelled one (FixMatch: 7)", m.mu),
            (m.lambda_u >= 0, "lambda_u", ">= 0 (FixMatch: 1)", m.lambda_u),
            (0 <= m.ema_decay < 1, "ema_decay", "in [0, 1) (FixMatch: 0.999; 0 evaluates the student)", m.ema_decay),
            (m.strong_ops >= 0, "strong_ops", ">= 0 (FixMatch: 2)", m.strong_ops),
            (0 <= m.strong_magnitude <= 1, "strong_magnitude", "in [0, 1] (1: the paper's)", m.strong_magnitude),
            (0 <= m.cutout < 1, "cutout", "in [0, 1) (FixMatch: 0.5 of the side)", m.cutout),
        )
        for ok, key, rule, value in checks:
            if not ok:
                raise UserError(f"{source}: 'method.{key}' must be {rule}, got {value}")
        if cfg.data.sampler != "random":
            raise UserError(
                f"{source}: method 'fixmatch' draws its labelled and unlabelled images itself; "
                f"data.sampler={cfg.data.sampler} cannot order them: set data.sampler=random"
            )

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> FixMatch:
        return cls(backbone, build_head(cfg, backbone.feature_dim, num_classes), cls.options_of(cfg))

    @classmethod
    def training_batches(cls, cfg, labels: torch.Tensor, local_batch: int) -> TwoStreamBatchSampler:
        """``local_batch`` labelled images, then ``mu`` times as many of any (:mod:`sslkit.datasets.two_streams`)."""
        mu = cls.options_of(cfg).mu
        return two_stream_sampler(labels, cfg.train.batch_size, local_batch, mu, cfg.run.seed, cfg.method.name)

    @classmethod
    def training_views(cls, cfg, info: DatasetInfo) -> TwoViewAugment:
        """A weak view of every image (the recipe's ``augment``) and a strong one of the unlabelled ones: a second
        weak view, then RandAugment and Cutout (:class:`StrongViewOfUnlabelled`)."""
        m = cls.options_of(cfg)
        strong = StrongAugment(info.channels, m.strong_ops, m.strong_magnitude, m.cutout)
        views = StrongViewOfUnlabelled(strong, m.mu)
        return TwoViewAugment(cfg.augment, info.channels, info.mean, info.std, 2, view2_ops=views)

    @classmethod
    def images_per_batch(cls, cfg, batch_size: int) -> int:
        """``batch_size`` labelled images and ``mu`` times as many unlabelled ones."""
        return batch_size * (1 + cls.options_of(cfg).mu)

    def trained_backbone(self) -> nn.Module:
        return self.student.backbone

    def trained_head(self) -> nn.Module:
        return self.student.head

    def train(self, mode: bool = True) -> FixMatch:
        super().train(mode)
        # The average is only evaluated: its BatchNorm keeps the statistics copied from the student.
        self.backbone.eval()
        self.head.eval()
        return self

    def labelled_rows(self, rows: int) -> int:
        """``b``, the labelled images at the top of a batch of ``rows = (1 + mu) b``."""
        if rows % (1 + self.options.mu):
            raise ValueError(f"a FixMatch batch has (1 + mu) b rows, mu = {self.options.mu}; got {rows}")
        return rows // (1 + self.options.mu)

    def forward(self, weak: torch.Tensor, strong: torch.Tensor, labels: torch.Tensor | None = None) -> LossAndMetrics:
        if labels is None:
            raise ValueError("FixMatch needs the labels of the labelled rows")
        rows, labelled = weak.shape[0], self.labelled_rows(weak.shape[0])
        if strong.shape[0] != rows - labelled:
            raise ValueError(
                f"FixMatch takes a strong view of the {rows - labelled} unlabelled rows, got {strong.shape[0]}"
            )
        # One pass, as the paper's code: labelled weak, unlabelled weak, unlabelled strong.
        logits = self.student.head.logits(self.encode(torch.cat([weak, strong]))).float()
        supervised = F.cross_entropy(logits[:labelled], labels[:labelled])
        unlabelled, mask_rate = unlabelled_loss(logits[labelled:rows], logits[rows:], self.options.threshold)
        loss = supervised + self.options.lambda_u * unlabelled
        # FixMatch's health: the share of pseudo-labels kept, and the two terms (unlabelled before lambda_u).
        terms = {"mask_rate": mask_rate, "supervised_loss": supervised, "unlabelled_loss": unlabelled}
        return LossAndMetrics(loss, {name: value.detach() for name, value in terms.items()})

    @torch.no_grad()
    def after_optimizer_step(self, step: int, total_steps: int) -> dict[str, float]:
        """Move the weight average towards the student; returns the ``ema_decay`` it moved with."""
        decay = min(self.options.ema_decay, (1 + step) / (10 + step))
        update_momentum(self.student.backbone, self.backbone, decay)
        update_momentum(self.student.head, self.head, decay)
        return {"ema_decay": decay}

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """The weight average's class scores of preprocessed images, (B, num_classes)."""
        return self.head.logits(self.backbone(images))
