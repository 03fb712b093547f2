"""Saving a run's checkpoints from the loop: never of non-finite weights, remembering the last good one.

The files themselves (atomic writes, resume look-up, backbone export) are :mod:`sslkit.loop.run_directory`'s.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate import Accelerator

from sslkit.errors import UserError
from sslkit.loop.run_directory import read_progress, save_checkpoint
from sslkit.loop.state import LoopState


class Checkpointer:
    """Saves whole checkpoints, never of non-finite weights, and remembers the last good one."""

    def __init__(self, accelerator: Accelerator, run_dir: Path, method, keep: int, last_good: Path | None) -> None:
        self.accelerator, self.run_dir, self.method, self.keep, self.last_good = (
            accelerator, run_dir, method, keep, last_good,
        )  # fmt: skip

    def where(self) -> str:
        return f"last good checkpoint: {self.last_good}" if self.last_good else "no checkpoint was written yet"

    def save(self, progress: LoopState) -> Path:
        # A finite loss can still be followed by an update that overflows the weights: never save those.
        if not all(bool(torch.isfinite(p).all()) for p in self.method.parameters()):
            raise UserError(
                f"the weights became non-finite at step {progress.step} (epoch {progress.epoch}); training stopped, "
                f"{self.where()}; try a lower optim.lr or train.mixed_precision=no"
            )
        self.last_good = save_checkpoint(self.accelerator, self.run_dir, vars(progress), self.keep)
        return self.last_good

    def save_unless_saved(self, progress: LoopState) -> Path:
        """The run's final checkpoint: saved unless the last one is already of this step."""
        if self.last_good is None or read_progress(self.last_good)["step"] != progress.step:
            self.save(progress)
        return self.last_good
