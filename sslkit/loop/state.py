"""The loop's counters and its schedule: what a checkpoint records and what the learning rate follows."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sslkit import optim
from sslkit.config import Config


@dataclass
class LoopState:
    """Loop counters saved with every checkpoint."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch
    batch_in_epoch: int = 0  # batches of the current epoch already consumed


@dataclass
class Schedule:
    """How many batches and optimizer steps a run has, and its warm-up: pure functions of the recipe."""

    batches_per_epoch: int
    total_steps: int
    warmup_steps: int
    base_lr: float

    @classmethod
    def from_config(cls, cfg: Config, batches_per_epoch: int, base_lr: float, total_steps: int | None = None):
        """The recipe's schedule; ``total_steps`` replaces its length (a benchmark's few steps)."""
        # Accelerate syncs at the end of the loader too, so a short last window still makes a step.
        steps_per_epoch = math.ceil(batches_per_epoch / cfg.train.grad_accum_steps)
        if total_steps is None:
            total_steps = cfg.train.epochs * steps_per_epoch
            if cfg.train.max_steps is not None:
                total_steps = min(total_steps, cfg.train.max_steps)
        warmup_steps = min(int(cfg.optim.warmup_epochs * steps_per_epoch), total_steps // 2)
        return cls(batches_per_epoch, total_steps, warmup_steps, base_lr)

    def lr(self, step: int, cfg: Config) -> float:
        return optim.cosine_lr(step, self.total_steps, self.base_lr, self.warmup_steps, cfg.optim.min_lr_ratio)
