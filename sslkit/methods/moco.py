"""MoCo v2 and v3: a query encoder trained against keys from a momentum encoder.

References:
    [0] MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722
    [1] MoCo v2, Chen et al. 2020, https://arxiv.org/abs/2003.04297
    [2] MoCo v3, Chen, Xie, He 2021, https://arxiv.org/abs/2104.02057
    [3] MoCo CIFAR-10 demo (the single-GPU colab),
        https://colab.research.google.com/github/facebookresearch/moco/blob/colab-notebook/colab/moco_cifar10_demo.ipynb

Both keep the key (momentum) encoder of :class:`~sslkit.methods.momentum.MomentumMethod`:
frozen copies of the backbone and projector that ``after_optimizer_step`` moves towards the
online encoder after every optimizer step. The MoCo v3 loss is :mod:`sslkit.losses.mocov3`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import distributed, losses
from sslkit.errors import UserError
from sslkit.losses._common import upcast
from sslkit.losses.mocov3 import MoCoV3Loss
from sslkit.losses.ntxent import multi_view_infonce_loss
from sslkit.methods.momentum import MomentumMethod, MomentumOptions, check_momentum_options
from sslkit.methods.queue import KeyQueue
from sslkit.models import build_mlp

# --------------------------------------------------------------------------- BatchNorm in one process


class SplitBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics come from ``num_splits`` sub-batches, as on several GPUs.

    The single-GPU form of MoCo's ShuffleBN, from the MoCo CIFAR demo [3]. With BatchNorm over
    one batch, a query and its positive key are normalised with the statistics of the same
    images, while the queue's keys come from other batches; the network can tell the positive
    by that batch signature instead of by content and "cheat" the task ([0], section 3.3). MoCo
    normalises per GPU and shuffles the keys' batch across GPUs so a query and its key see
    different statistics. Here the sub-batches play the GPUs: like a GPU's shard, each is a
    contiguous block of ``N / num_splits`` samples, and :class:`MoCo` shuffles the key batch.
    No process group is needed, and with several processes each one splits its own batch.

    Contiguous blocks, not the MoCo demo's interleaved groups (``view(-1, C * splits, H, W)``):
    a block is a view of the batch in any memory format, so each group is one ``batch_norm``
    call on a slice and the outputs are concatenated. The interleaved view is a copy of a
    channels_last batch and hands the next layers an NCHW tensor, so a step pays for layout
    copies, an NCHW max-pool and BatchNorm over the regrouped channels, which contiguous blocks
    avoid. Blocks are also what the GPUs hold in MoCo's own multi-GPU training: with both views
    in one batch, a block holds images of one view.

    In evaluation mode it is plain BatchNorm2d; its ``state_dict`` keys are BatchNorm2d's, so an
    exported backbone loads into a model built with ordinary BatchNorm.

    Shape:
        x: (N, C, H, W) with N divisible by ``num_splits`` in training mode.
    """

    def __init__(self, num_features: int, num_splits: int, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.num_splits = num_splits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.num_splits == 1 or not self.track_running_stats:
            return super().forward(x)
        n, s = x.shape[0], self.num_splits
        if n % s:
            raise ValueError(f"a batch of {n} cannot be split into {s} equal BatchNorm groups (method.bn_splits)")
        self.num_batches_tracked.add_(1)
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        outputs, means, variances = [], [], []
        for block in x.chunk(s):  # views: contiguous along the batch in any memory format
            # Each group updates its own copy of the running statistics.
            running_mean, running_var = self.running_mean.clone(), self.running_var.clone()
            outputs.append(
                F.batch_norm(block, running_mean, running_var, self.weight, self.bias, True, factor, self.eps)
            )
            means.append(running_mean)
            variances.append(running_var)
        with torch.no_grad():  # keep the groups' mean, as the GPUs' statistics average under SyncBN
            self.running_mean.copy_(torch.stack(means).mean(dim=0))
            self.running_var.copy_(torch.stack(variances).mean(dim=0))
        return torch.cat(outputs)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_splits={self.num_splits}"


def split_batch_norm(module: nn.Module, num_splits: int) -> nn.Module:
    """Replace every BatchNorm2d inside ``module`` by a :class:`SplitBatchNorm` with the same state (in place)."""
    for name, child in module.named_children():
        if type(child) is nn.BatchNorm2d and child.track_running_stats:
            split = SplitBatchNorm(
                child.num_features, num_splits, eps=child.eps, momentum=child.momentum, affine=child.affine
            )
            split.load_state_dict(child.state_dict())
            setattr(module, name, split.to(child.running_mean.device))
        else:
            split_batch_norm(child, num_splits)
    return module


def _mlp_without_batch_norm(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int) -> nn.Sequential:
    """MoCo v2's head, fc-ReLU-fc ([1], section 3); 1 layer is MoCo v1's linear head.

    No BatchNorm, unlike :func:`sslkit.models.build_mlp`, as in MoCo v2's code: BatchNorm in the
    head would need the same care against shared batch statistics as the backbone's.
    """
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        layers += [nn.Linear(dim, hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim))
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- MoCo v2


@dataclasses.dataclass
class MoCoOptions(MomentumOptions):
    """MoCo v2's options.

    Attributes:
        momentum: The momentum encoder's EMA momentum at the start; it follows a cosine from ``momentum`` to
            ``momentum_final`` over training.
        momentum_final: The EMA momentum at the end; set it equal to ``momentum`` for a constant one (MoCo v2:
            0.999).
        queue_size: Keys kept as negatives (MoCo v2: 65536).
        symmetric: The loss on (q1, k2) and (q2, k1), averaged; false: on (q1, k2) only (the MoCo CIFAR colab:
            kNN 85.3 symmetric vs 82.6 asymmetric).
        bn_splits: BatchNorm statistics over this many sub-batches, keys shuffled between them (ShuffleBN in one
            process); 1: BatchNorm over the whole batch.
    """

    queue_size: int = 65536
    symmetric: bool = True
    bn_splits: int = 8


class MoCo(MomentumMethod):
    """MoCo v2 [1]: InfoNCE of queries against their keys and a queue of past keys.

    ``q = g(f(x))`` from the online backbone ``f`` and head ``g``; ``k`` from their momentum
    copies; the loss is eq. 1 of [0] with the queue as negatives::

        l(q, k+) = -log( exp(q.k+ / T) / (exp(q.k+ / T) + sum_{k- in queue} exp(q.k- / T)) )

    computed by :class:`~sslkit.losses.NTXentLoss` with ``negatives``. Symmetric (the default):
    ``(l(q1, k2) + l(q2, k1)) / 2`` over both views, as in the MoCo CIFAR demo [3] (kNN 85.3
    vs 82.6 asymmetric, 200 epochs; the demo sums the two terms, the mean keeps the loss on the
    asymmetric scale); asymmetric: ``l(q1, k2)``. After the loss, the keys of this step join
    the queue (every process's keys, see :class:`KeyQueue`): they are negatives from the next
    step on, never for their own queries. Until the queue is full, only the keys so far are
    negatives (the first step has none: its loss is 0).

    BatchNorm: ``bn_splits > 1`` normalises each encoder pass in that many sub-batches and
    shuffles the key batch (see :class:`SplitBatchNorm`), MoCo's ShuffleBN in one process, as
    the MoCo CIFAR demo trains on one GPU (8 splits). ``bn_splits = 1`` is BatchNorm over the
    whole batch, which solo-learn uses (SyncBatchNorm, no shuffle) for its MoCo v2+ results.

    Multi-crop (``augment.local_views``, symmetric only): the key encoder sees the two global views
    only, the query encoder every view (the local views through the backbone in a batch of their
    own, :meth:`~sslkit.methods.base.Method.encode_views`, in ``bn_splits`` groups as the global
    views; only the keys are shuffled), and the queries of every view meet the keys of each global
    view but their own, the queue's keys the negatives:
    :func:`~sslkit.losses.ntxent.multi_view_infonce_loss`, the mean over those pairs, which for two
    views is the symmetric loss above. The queue takes the global views' keys, as without local views.

    Shape:
        view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; returns a scalar loss.
    """

    loss_names = ("ntxent", "infonce")  # InfoNCE against the queue
    Options = MoCoOptions
    takes_local_views = True

    def __init__(
        self,
        backbone: nn.Module,
        projector: nn.Module,
        loss: nn.Module,
        queue_size: int = 65536,
        momentum: float = 0.99,
        momentum_final: float = 1.0,
        symmetric: bool = True,
        bn_splits: int = 8,
    ) -> None:
        super().__init__()
        if bn_splits < 1:
            raise ValueError(f"bn_splits must be >= 1, got {bn_splits}")
        if bn_splits > 1:
            split_batch_norm(backbone, bn_splits)
        self.backbone, self.projector, self.loss = backbone, projector, loss
        self.copy_momentum_encoder(momentum, momentum_final)
        out_dim = next(m for m in reversed(projector) if isinstance(m, nn.Linear)).out_features
        self.queue = KeyQueue(queue_size, out_dim)
        self.symmetric, self.bn_splits = symmetric, bn_splits

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        m = cls.options_of(cfg)
        check_momentum_options(m, source)
        if m.queue_size < 1:
            raise UserError(f"{source}: method.queue_size must be >= 1, got {m.queue_size} (MoCo v2: 65536)")
        if cfg.model.sync_batchnorm and m.bn_splits > 1:
            raise UserError(
                f"{source}: model.sync_batchnorm normalises over every process's batch, method.bn_splits "
                f"{m.bn_splits} over parts of one process's batch: set method.bn_splits=1 with "
                f"model.sync_batchnorm=true"
            )
        if cfg.augment.local_views and not m.symmetric:
            raise UserError(
                f"{source}: method 'moco' with local views (augment.local_views={cfg.augment.local_views}) contrasts "
                f"every view's queries with the keys of both global views: set method.symmetric=true, or "
                f"augment.local_views=0"
            )

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> MoCo:
        m, model = cls.options_of(cfg), cfg.model
        local_batch = cfg.train.batch_size // distributed.world_size()
        per_pass = 2 * local_batch if m.symmetric else local_batch
        local_pass = cfg.augment.local_views * local_batch  # the local views: a pass of their own
        passes = [per_pass, local_pass] if local_pass else [per_pass]
        if m.bn_splits < 1 or any(images % m.bn_splits for images in passes):
            # The MoCo CIFAR demo's 8 when it divides; else the largest divisor below it (1 always does).
            # Checked here, not when the recipe loads: the batch per process needs the process count.
            fits = max(d for d in range(1, 9) if all(images % d == 0 for images in passes))
            local = f" and the {local_pass} local views it encodes in a pass of their own" if local_pass else ""
            raise UserError(
                f"method.bn_splits {m.bn_splits} must be >= 1 and divide the {per_pass} images each process "
                f"encodes per pass (train.batch_size per process{', both views' if m.symmetric else ''}){local}; "
                f"try method.bn_splits={fits}" + (" or 1" if fits > 1 else "")
            )
        projector = _mlp_without_batch_norm(
            backbone.feature_dim, model.projector_hidden, model.projector_out, model.projector_layers
        )
        return cls(
            backbone,
            projector,
            losses.build(cfg.loss.name, **cfg.loss.kwargs),
            m.queue_size,
            m.momentum,
            m.momentum_final,
            m.symmetric,
            m.bn_splits,
        )

    @classmethod
    def notes(cls, cfg, num_samples: int) -> list[str]:
        """A queue longer than one epoch's keys holds older keys of each query's own image, as its negatives."""
        m = cls.options_of(cfg)
        keys_per_epoch = num_samples * (2 if m.symmetric else 1)  # symmetric: both views' keys are enqueued
        if m.queue_size < keys_per_epoch:
            return []
        return [
            f"method.queue_size={m.queue_size} is not below the {keys_per_epoch:,} keys an epoch adds "
            f"({num_samples:,} images{', both views' if m.symmetric else ''}): the queue then holds older keys "
            f"of each image as negatives of that same image; keep it below (the MoCo CIFAR demo: 4,096 of 100,000)"
        ]

    @torch.no_grad()
    def _keys(self, images: torch.Tensor) -> torch.Tensor:
        """Keys from the momentum encoder, its batch shuffled so BatchNorm groups differ from the queries'."""
        if self.bn_splits == 1:
            return self.momentum_encode(images)
        order = torch.randperm(images.shape[0], device=images.device)
        keys = self.momentum_encode(images[order])
        return keys[torch.argsort(order)]  # back to the images' order

    def forward(
        self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        if local_views and not self.symmetric:
            raise ValueError("local views need symmetric=True: every view's queries meet both global views' keys")
        if self.symmetric:
            # One pass for both views (faster than two); row i of keys is the other view of row i of queries.
            queries = self.projector(self.encode_views(view1, view2, *local_views))  # (VB, D)
            keys = self._keys(torch.cat([view2, view1]))  # (2B, D): [k2; k1], the global views only
        else:
            queries = self.projector(self.encode(view1))  # (B, D)
            keys = self._keys(view2)  # (B, D)
        if local_views:  # every view's queries against both global views' keys, [k1; k2]
            keys_in_order = keys.roll(view1.shape[0], dims=0)
            loss = multi_view_infonce_loss(queries, keys_in_order, self.queue.negatives(), self.loss.temperature)
        else:  # the mean over 2B queries is (l(q1, k2) + l(q2, k1)) / 2
            loss = self.loss(queries, keys, negatives=self.queue.negatives())
        self.queue.enqueue(F.normalize(upcast(keys), dim=1))
        return loss


# --------------------------------------------------------------------------- MoCo v3


@dataclasses.dataclass
class MoCoV3Options(MomentumOptions):
    """MoCo v3's options.

    Attributes:
        momentum: The momentum encoder's EMA momentum at the start; it follows a cosine from ``momentum`` to
            ``momentum_final`` over training.
        momentum_final: The EMA momentum at the end; set it equal to ``momentum`` for a constant one.
        predictor_hidden: Hidden width of the 2-layer predictor.
        predictor_last_batch_norm: An affine-free BatchNorm after the predictor's last layer, as MoCo v3's ViT
            code has it (its ResNet code has none).
    """

    predictor_hidden: int = 4096
    predictor_last_batch_norm: bool = False


class MoCoV3(MomentumMethod):
    """MoCo v3 [2]: ``ctr(q1, k2) + ctr(q2, k1)`` with a predictor on the query side and no queue.

    Query ``q = h(g(f(x)))`` (backbone ``f``, projector ``g``, predictor ``h``); key
    ``k = g_m(f_m(x))`` from the momentum copies of ``f`` and ``g`` (no predictor); the loss is
    :class:`~sslkit.losses.MoCoV3Loss`, both directions summed as in [2]. The negatives are the other
    keys of the batch (all processes), so BatchNorm needs no shuffling here: in one process every
    key shares the positive's statistics. (With several processes, [2] uses SyncBatchNorm so
    keys from other processes share them too: ``model.sync_batchnorm``.) Both views go
    through each encoder in one batch (faster than [2]'s one pass per view; BatchNorm then pools
    the two views' statistics, as in :class:`~sslkit.methods.SimCLR`).

    Heads as in [2]'s ResNet code and solo-learn: projector ``projector_layers`` layers
    (``model.projector_*``; the paper's text says 3, its ResNet code uses 2) with an
    affine-free BatchNorm after the last; predictor 2 layers, ``predictor_hidden`` wide (with an
    affine-free BatchNorm after the last too in [2]'s ViT code: ``method.predictor_last_batch_norm``).

    Multi-crop (``augment.local_views``): the momentum encoder sees the two global views only, the
    query encoder every view (the local views through the backbone in a batch of their own,
    :meth:`~sslkit.methods.base.Method.encode_views`), and the queries of every view meet the keys
    of each global view but their own, that view's other keys the negatives:
    :func:`~sslkit.losses.mocov3.multi_view_mocov3_loss`, twice the mean over those pairs, which for
    two views is the loss above.

    Shape:
        view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; returns a scalar loss.
    """

    # InfoNCE against the other keys of the batch. Recipes (and loss.name's default) call it
    # ntxent or infonce, MoCo v3's InfoNCE: of those only the temperature is read.
    loss_names = ("mocov3", "ntxent", "infonce")
    min_batch_size = 2  # one image has no other key: its softmax is over the positive alone, loss 0
    Options = MoCoV3Options
    takes_local_views = True

    def __init__(
        self,
        backbone: nn.Module,
        projector: nn.Module,
        predictor: nn.Module,
        loss: nn.Module | None = None,
        momentum: float = 0.99,
        momentum_final: float = 1.0,
    ) -> None:
        super().__init__()
        self.backbone, self.projector, self.predictor = backbone, projector, predictor
        self.copy_momentum_encoder(momentum, momentum_final)
        self.loss = loss if loss is not None else MoCoV3Loss()

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        m = cls.options_of(cfg)
        check_momentum_options(m, source)
        if m.predictor_hidden < 1:
            raise UserError(
                f"{source}: method.predictor_hidden must be >= 1, got {m.predictor_hidden} (MoCo v3: 4096)"
            )

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> MoCoV3:
        # Multi-process note: without model.sync_batchnorm each process normalises its own keys;
        # keys gathered from other processes then carry other statistics than the positive.
        m, model = cls.options_of(cfg), cfg.model
        loss = losses.build(cfg.loss.name, **cfg.loss.kwargs)
        if not isinstance(loss, MoCoV3Loss):
            loss = MoCoV3Loss(loss.temperature)
        projector = build_mlp(
            backbone.feature_dim,
            model.projector_hidden,
            model.projector_out,
            model.projector_layers,
            last_batch_norm=True,
        )
        predictor = build_mlp(
            model.projector_out, m.predictor_hidden, model.projector_out, 2, m.predictor_last_batch_norm
        )
        return cls(backbone, projector, predictor, loss, m.momentum, m.momentum_final)

    def forward(
        self, view1: torch.Tensor, view2: torch.Tensor, *local_views: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        queries = self.predictor(self.projector(self.encode_views(view1, view2, *local_views)))  # (VB, D)
        keys = self.momentum_encode(torch.cat([view1, view2]))  # (2B, D): the global views' keys only
        if local_views:
            return self.loss.multi_view(queries, keys)
        return self.loss(queries, keys)  # ctr(q1, k2) + ctr(q2, k1)
