"""The interface every method implements: :class:`Method`, with its defaults in code."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn
from torch.utils.data import Sampler

from sslkit.augment import TwoViewAugment
from sslkit.datasets import DatasetInfo
from sslkit.datasets.samplers import EpochBatchSampler, training_sampler


@dataclasses.dataclass
class NoOptions:
    """A method that reads no ``method.*`` key besides ``name``."""


class LossAndMetrics(NamedTuple):
    """What ``forward`` returns when a step has more to show than its loss: the loss, and named scalars measured in
    the same step, which the trainer logs beside it (``metrics.jsonl``, the trackers, the progress line), averaged
    as the loss is: over the batches since the last log line and over every process.

    Attributes:
        loss: the scalar the optimizer steps on.
        metrics: ``{name: scalar}``, detached, the same names at every step (FixMatch's ``mask_rate``).
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]


def loss_and_metrics(output: torch.Tensor | LossAndMetrics) -> LossAndMetrics:
    """``forward``'s output as a loss and its metrics: none for a method that returns the loss alone."""
    return output if isinstance(output, LossAndMetrics) else LossAndMetrics(output, {})


class Method(nn.Module):
    """How a batch of augmented views (and maybe labels) becomes a loss.

    A method holds everything that trains: backbone, heads and the loss (with any parameters of
    its own, such as a classification head), so one ``accelerator.prepare(method)`` and one
    optimizer cover every parameter. A subclass sets the class attributes that differ from
    these defaults, implements :meth:`from_config` and ``forward``, overrides the hooks whose
    default does not fit it, and is registered by name in :data:`sslkit.methods.METHODS`; see
    ``docs/add-a-method.md``.

    What the trainer asks of it beyond the loss, each a hook with a default that fits most methods:
    the batches it trains on (:meth:`training_batches`, and :attr:`can_stream_shards`), the views it
    needs (:meth:`training_views`), the images a batch loads (:meth:`images_per_batch`) and the
    network the optimizer trains (:meth:`trained_backbone`, :meth:`trained_head`), which is not
    always the one that is evaluated (:attr:`backbone`).

    ``forward(view1, view2, labels=None)`` returns the scalar loss, or a :class:`LossAndMetrics` with the
    figures a reader of the log needs to follow the method (FixMatch's mask rate and its two terms); the
    trainer passes the views by position and ``labels`` by name (None unless :attr:`needs_labels`; a
    method with :attr:`needs_indices` also takes ``indices`` by name). A method that
    :attr:`takes_local_views` is ``forward(view1, view2, *local_views, labels=None)``.

    Attributes:
        needs_labels: the dataset must be labelled; the trainer passes ``labels``.
        needs_indices: the method keeps per-sample state (NPID's memory bank): the trainer passes
            each sample's index into the training set as ``indices``.
        loss_names: the registry losses (``loss.name``) it trains with, checked when a recipe is
            loaded (:func:`sslkit.methods.check_loss`).
        min_batch_size: the smallest global batch it can contrast. 2 for the methods whose negatives
            are the batch's other images: with one image the loss is exactly 0 and nothing trains
            (:func:`sslkit.methods.check_batch_size`).
        min_batch_reason: why it needs ``min_batch_size`` images, for the one-line error of a batch too small.
        Options: the dataclass of the ``method.*`` recipe keys it reads, with their types, defaults and
            meanings (its ``Attributes:`` docstring is the method's part of ``docs/config.md``). The
            recipe's values are checked against it when a recipe loads, and a key that only another
            method reads is noted when training starts (:func:`sslkit.methods.unused_options`).
        num_views: how many augmented views of each image the trainer passes: 2 for the contrastive
            methods and distillation (teacher on view 1, student on view 2), 1 for fine-tuning
            (``forward(view, labels)``).
        takes_local_views: the method trains with multi-crop's local views (``augment.local_views``), which the
            trainer passes after the two global views; a recipe with local views and a method without
            them is refused when it loads.
        needs_teacher: the method learns from a finished run with a classifier, named by
            ``method.teacher``: :func:`sslkit.methods.build_method` loads it (its own recipe and
            weights, frozen) and passes it to :meth:`from_config` as ``teacher``.
        classifier_metric: for a method with a classifier of its own (:meth:`logits` returns
            class scores), the name under which the final evaluation reports its test top-1
            (``finetune_top1``, ``head_top1``); None for the others.
        can_stream_shards: its batches can come from streamed tar shards, which order themselves;
            False for a method that draws images by index (its own :meth:`training_batches`, or
            per-sample state, :attr:`needs_indices`).
        backbone: the encoder that is evaluated, exported and saved as ``backbone.*`` in checkpoints,
            for every method (set by the subclass). Most methods evaluate the encoder the optimizer
            trains; one that evaluates an average of it (FixMatch) returns the trained one from
            :meth:`trained_backbone`.
        head: the classifier with weights of its own (a loss of kind ``"head"``: ArcFace, a softmax
            layer, proxies), or None: the one that is evaluated (:meth:`logits`), as ``backbone`` is.
            The optimizer gives the parameters of :meth:`trained_head` the learning-rate scales it
            declares (``param_groups``); two-view and label losses, which hold no weights, are the
            method's ``loss``.
        epoch: the epoch being trained (from 0); the trainer sets it when each epoch starts, for a method
            with schedules by epoch (DINO's teacher temperature and frozen last layer).
        backbone_frozen: the trainer sets it during ``train.freeze_backbone_epochs``; a method
            encodes through :meth:`encode`, which then sends no gradient to the backbone.
    """

    needs_labels: bool = False
    needs_indices: bool = False
    loss_names: tuple[str, ...] = ()
    min_batch_size: int = 1
    min_batch_reason: str = "contrasts each image with the other images of its batch (with none the loss is exactly 0)"
    Options: ClassVar[type] = NoOptions
    num_views: int = 2
    takes_local_views: bool = False
    needs_teacher: bool = False
    classifier_metric: str | None = None
    can_stream_shards: bool = True
    backbone: nn.Module

    def __init__(self) -> None:
        super().__init__()
        self.backbone_frozen = False
        self.epoch = 0
        self.head: nn.Module | None = None
        # Checkpoints written before the classifier was called a head name its weights loss.*.
        self.register_load_state_dict_pre_hook(_head_was_loss)

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> Method:
        """The method around ``backbone`` with the recipe's ``method.*``, ``model.*`` and ``loss`` settings.

        Args:
            cfg: the run's :class:`~sslkit.config.Config`.
            backbone: the encoder, already built from ``cfg.model``.
            num_classes: classes of the training set (heads size their weights with it).
            num_samples: images in the training set, for methods that keep per-sample state; None
                where the caller does not know it.

        Raises:
            UserError: one line for a setting the method cannot train with.
        """
        raise NotImplementedError(f"{cls.__name__} does not implement from_config")

    @classmethod
    def options_of(cls, cfg) -> Any:
        """The recipe's ``method.*`` values as an :attr:`Options` instance (defaults for the keys not set)."""
        names = {item.name for item in dataclasses.fields(cls.Options)}
        return cls.Options(**{key: value for key, value in cfg.method.options.items() if key in names})

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        """Raise one line for options that cannot train with the rest of the recipe; run when a recipe
        loads, before anything is written (:func:`sslkit.methods.check_config` has checked the types)."""

    @classmethod
    def notes(cls, cfg, num_samples: int) -> list[str]:
        """Notes on settings that run but defeat the method on a training set of ``num_samples`` images."""
        return []

    @classmethod
    def training_batches(cls, cfg, labels: torch.Tensor, local_batch: int) -> Sampler[list[int]]:
        """The training loader's batches of one process: indices into the training set, in an order that is a
        function of ``(run.seed, epoch)`` (``set_epoch`` and ``epoch`` pick it), every batch ``batch_size`` long.

        By default the recipe's ``data.sampler`` (:func:`~sslkit.datasets.samplers.training_sampler`) in batches of
        ``local_batch``.

        Args:
            cfg: the run's config.
            labels: the training set's labels, -1 for an image without one.
            local_batch: this process's share of ``train.batch_size``.

        Raises:
            UserError: one line for an order the training set or the batch cannot give.

        Shape:
            labels: (N,) int64.
        """
        d = cfg.data
        order = training_sampler(d.sampler, labels, d.m_per_class, cfg.train.batch_size, local_batch, cfg.run.seed)
        return EpochBatchSampler(order, local_batch)

    @classmethod
    def training_views(cls, cfg, info: DatasetInfo) -> TwoViewAugment:
        """The augmentation that makes a batch's views, which ``forward`` takes by position: by default
        :attr:`num_views` views of every image (and the recipe's local views) from the recipe's ``augment``."""
        return TwoViewAugment(cfg.augment, info.channels, info.mean, info.std, cls.num_views)

    @classmethod
    def images_per_batch(cls, cfg, batch_size: int) -> int:
        """Images a batch of ``batch_size`` (a share of ``train.batch_size``) loads: ``batch_size`` by default."""
        return batch_size

    def trained_backbone(self) -> nn.Module:
        """The encoder the optimizer trains, at ``optim.backbone_lr_scale`` (and ``optim.layer_decay``), and
        :meth:`encode` runs: :attr:`backbone` by default."""
        return self.backbone

    def trained_head(self) -> nn.Module | None:
        """The classifier the optimizer trains, at ``optim.head_lr_scale`` and the scales it declares: :attr:`head`
        by default."""
        return self.head

    def start_from(self, source: str) -> None:
        """Load what the method keeps of the ``run.init_from`` run beyond its backbone, which the
        trainer has loaded already (fine-tuning's kept projector layers); nothing by default."""

    def after_optimizer_step(self, step: int, total_steps: int) -> dict[str, float]:
        """Called by the trainer after every optimizer step, for state the optimizer does not own; returns the
        values of the method's own schedules at this step, by name, which the log shows as of its step.

        ``step`` counts the steps before this one. MoCo moves its momentum encoder here (and returns the
        ``momentum`` it moved it with); nothing to do and nothing to show by default.
        """
        return {}

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Features of the :meth:`trained_backbone`; while :attr:`backbone_frozen`, no gradient reaches it and its
        BatchNorm keeps its statistics.

        Freezing this way (no graph through the backbone, rather than ``requires_grad_(False)``)
        can be switched on and off between epochs under DDP, and the optimizer skips parameters
        whose gradient is None, so momentum buffers are not touched while frozen.
        """
        backbone = self.trained_backbone()
        if not self.backbone_frozen:
            return backbone(images)
        was_training = backbone.training
        backbone.eval()
        with torch.no_grad():
            features = backbone(images)
        backbone.train(was_training)
        return features

    def encode_views(self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor) -> torch.Tensor:
        """``[f([v1; v2]); f([l1; ...])]``: backbone features of every view, view by view, the first view's rows first.

        The two global views go through :meth:`encode` in one batch (faster than two, and BatchNorm sees
        both views together, as in SimCLR's implementation); multi-crop's local views, which are smaller,
        in a second batch of their own (DINO's ``MultiCropWrapper`` groups the views by size the same way).

        Shape:
            view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; returns (V B, F), V = 2 + len(local_views).
        """
        features = self.encode(torch.cat([view1, view2]))  # (2B, F)
        if local_views:
            features = torch.cat([features, self.encode(torch.cat(local_views))])  # (VB, F)
        return features

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """Class scores of preprocessed images, (B, num_classes), from a method with a classifier of its
        own (:attr:`classifier_metric`); evaluation reports their top-1."""
        raise NotImplementedError(f"{type(self).__name__} has no classifier")


def _head_was_loss(module: Method, state_dict: dict, prefix: str, *args) -> None:
    """``loss.*`` -> ``head.*`` in a state dict of a method with a head (run directories of earlier versions)."""
    if module.head is None or any(key.startswith(f"{prefix}head.") for key in state_dict):
        return
    for key in [key for key in state_dict if key.startswith(f"{prefix}loss.")]:
        state_dict[f"{prefix}head.{key[len(prefix) + 5 :]}"] = state_dict.pop(key)
