"""NPID: instance discrimination with a memory bank and binary NCE (Wu et al. 2018).

References:
    [0] NPID / Instance Discrimination, Wu et al. 2018, https://arxiv.org/abs/1805.01978
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import distributed, losses
from sslkit.errors import UserError
from sslkit.methods.base import Method
from sslkit.models import build_mlp


@dataclasses.dataclass
class NCEOptions:
    """NPID's options.

    Attributes:
        num_negatives: Noise samples drawn from the memory bank per step (NPID: 4096).
    """

    num_negatives: int = 4096


class MemoryBankNCE(Method):
    """Each image is its own class; its "class weight" is a memory-bank entry of its past embeddings.

    ``v = normalize(g(f(x)))`` from the backbone ``f`` and projection ``g`` (NPID: one linear
    layer to 128 dimensions, ``model.projector_layers: 1``). The bank holds one unit vector per
    training image. A step's loss is :class:`~sslkit.losses.NCELoss` (eq. 5-8 of [0]) of every
    embedding against its own bank entry (the positive) and ``num_negatives`` entries drawn
    uniformly from the bank (the noise; shared by the batch, NPID draws them per image). Then
    the bank entries of the batch move towards the new embeddings (section 3.1 of [0]; the
    momentum 0.5 is its code's)::

        bank[i] <- normalize(m * bank[i] + (1 - m) * v_i),   m = 0.5

    Both augmented views are anchors (NPID uses one view a step; the trainer gives two, and
    using both doubles the anchors for the same backbone passes); ``v_i`` for the update is the
    normalised mean of the two.

    The bank is a buffer: checkpoints save it, and every process applies the same update (the
    indices and embeddings of every process are gathered), so all processes hold the same bank.
    It starts from random unit vectors drawn from a fixed seed, identical in every process.

    Needs each sample's index into the training set: ``forward(view1, view2, labels, indices)``.

    Shape:
        view1, view2: (B, C, H, W); indices: (B,) int64 in [0, num_samples); returns a scalar.
    """

    needs_indices = True
    can_stream_shards = False  # a stream names no image by its index into the training set
    loss_names = ("nce",)
    Options = NCEOptions
    # Equal on every process (same seed, same gathered updates): DDP need not re-send it each step.
    replicated_buffers = ("bank",)

    def __init__(
        self,
        backbone: nn.Module,
        projector: nn.Module,
        loss: nn.Module,
        num_samples: int,
        num_negatives: int = 4096,
        bank_momentum: float = 0.5,
    ) -> None:
        super().__init__()
        if num_samples < 1 or num_negatives < 1:
            raise ValueError(f"num_samples and num_negatives must be >= 1, got {num_samples} and {num_negatives}")
        if not 0.0 <= bank_momentum < 1.0:
            raise ValueError(f"bank_momentum must be in [0, 1), got {bank_momentum}")
        self.backbone, self.projector, self.loss = backbone, projector, loss
        self.num_negatives, self.bank_momentum = num_negatives, bank_momentum
        dim = next(m for m in reversed(projector) if isinstance(m, nn.Linear)).out_features
        start = torch.rand(num_samples, dim, generator=torch.Generator().manual_seed(0)) * 2 - 1
        self.register_buffer("bank", F.normalize(start, dim=1))  # (num_samples, D)

    @classmethod
    def check_config(cls, cfg, source: str = "recipe") -> None:
        if "bank_size" in cfg.loss.kwargs:
            raise UserError(
                f"{source}: loss.bank_size is set by method 'nce' to the training set's size; "
                f"remove it from the recipe"
            )
        if (negatives := cls.options_of(cfg).num_negatives) < 1:
            raise UserError(f"{source}: method.num_negatives must be >= 1, got {negatives} (NPID: 4096)")

    @classmethod
    def from_config(cls, cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> MemoryBankNCE:
        if num_samples is None:
            raise UserError(
                "method 'nce' needs the training set's size for its memory bank, and this trainer does not pass it"
            )
        m = cfg.model
        projector = build_mlp(backbone.feature_dim, m.projector_hidden, m.projector_out, m.projector_layers)
        loss = losses.build("nce", **cfg.loss.kwargs, bank_size=num_samples)
        return cls(backbone, projector, loss, num_samples, cls.options_of(cfg).num_negatives)

    def forward(
        self,
        view1: torch.Tensor,
        view2: torch.Tensor,
        labels: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if indices is None:
            raise ValueError("MemoryBankNCE needs indices: each sample's position in the training set, shape (B,)")
        b = view1.shape[0]
        features = self.encode(torch.cat([view1, view2]))
        embeddings = F.normalize(self.projector(features).float(), dim=1)  # (2B, D)
        positives = self.bank[indices].repeat(2, 1)  # (2B, D)
        noise = self.bank[torch.randint(self.bank.shape[0], (self.num_negatives,), device=self.bank.device)]  # (K, D)
        loss = self.loss(embeddings, positives, noise)
        self._update_bank(indices, F.normalize(embeddings[:b] + embeddings[b:], dim=1).detach())
        return loss

    @torch.no_grad()
    def _update_bank(self, indices: torch.Tensor, embeddings: torch.Tensor) -> None:
        indices, embeddings = distributed.gather_no_grad(indices), distributed.gather_no_grad(embeddings, check=False)
        mixed = self.bank_momentum * self.bank[indices] + (1 - self.bank_momentum) * embeddings.to(self.bank.dtype)
        self.bank[indices] = F.normalize(mixed, dim=1)

    def extra_repr(self) -> str:
        return f"bank={tuple(self.bank.shape)}, num_negatives={self.num_negatives}, bank_momentum={self.bank_momentum}"
