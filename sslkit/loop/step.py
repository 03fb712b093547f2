"""One training step: forward, a check that the loss is finite, backward, optimizer step.

:class:`TrainingStep` holds what a step touches, prepared by the accelerator; the loop and the
benchmarks under ``tools/bench/`` call the same object, so a benchmark times the step users run.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from accelerate import Accelerator

from sslkit import optim
from sslkit.config import Config
from sslkit.errors import UserError
from sslkit.loop.checkpointer import Checkpointer
from sslkit.loop.state import LoopState
from sslkit.methods.base import LossAndMetrics, loss_and_metrics


class FiniteLoss:
    """Stops the run on a non-finite loss, without making an accelerator wait for the host on every batch.

    On the CPU each batch's loss is read as it is computed (nothing queues there, so reading costs
    nothing) and the run stops before a bad loss reaches the weights. On an accelerator, reading it
    would stall the device queue on every batch; there a count of non-finite losses stays on the
    device and is read with the loss at every log line (:meth:`check`): at most
    ``train.log_every_steps`` steps pass before the run stops, and :class:`Checkpointer`, which
    checks the weights themselves, never saves what those steps leave.
    """

    def __init__(self, accelerator: Accelerator, checkpoints: Checkpointer | None = None) -> None:
        self.accelerator, self.checkpoints = accelerator, checkpoints
        self.eager = accelerator.device.type == "cpu"
        self.bad = torch.zeros((), device=accelerator.device)

    def add(self, loss: torch.Tensor, progress: LoopState | None = None) -> None:
        if self.eager:
            # Every process agrees on the mean, so all of them stop together.
            value = self.accelerator.reduce(loss.detach().float(), reduction="mean").item()
            if not math.isfinite(value):
                self._stop(f"loss became {value}", progress)
        else:
            self.bad += (~torch.isfinite(loss.detach())).float()  # no host sync

    def check(self, progress: LoopState) -> None:
        """Raise if a loss since the last check was non-finite (every process calls it at the same step)."""
        if not self.eager and (bad := int(self.accelerator.reduce(self.bad, reduction="sum").item())):
            self._stop(f"the loss was not finite in {bad} batch{'es' if bad > 1 else ''}", progress)

    def _stop(self, what: str, progress: LoopState | None):
        where = self.checkpoints.where() if self.checkpoints else "no checkpoint was written yet"
        at = f" at step {progress.step} (epoch {progress.epoch})" if progress else ""
        raise UserError(
            f"{what}{at}; training stopped, {where}; "
            f"try a lower optim.lr, a higher loss temperature, or train.mixed_precision=no"
        )


@dataclass
class TrainingStep:
    """The prepared method and optimizer, and the finite-loss check: what one optimizer step touches."""

    accelerator: Accelerator
    method: torch.nn.Module  # as prepared: DDP-wrapped (and compiled) where the run asks for it
    optimizer: torch.optim.Optimizer
    finite: FiniteLoss

    def __call__(self, views, labels, indices, lr: float, progress: LoopState | None = None) -> LossAndMetrics:
        """Forward, check, backward and (at the end of an accumulation window) step; returns the loss and the
        method's metrics (detached, on the device: when to wait for the device to read them is the caller's choice).

        ``finite`` stops the run on a non-finite loss (see :class:`FiniteLoss`), naming ``progress``'s step.
        """
        accelerator, method, optimizer = self.accelerator, self.method, self.optimizer
        with accelerator.accumulate(method):
            with accelerator.autocast():
                # The views by position (the global views, then any local views), the rest by name.
                by_name = {"labels": labels, "indices": indices[0]} if indices else {"labels": labels}
                loss, metrics = loss_and_metrics(method(*views, **by_name))
            self.finite.add(loss, progress)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                optim.set_learning_rate(optimizer, lr)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return LossAndMetrics(loss.detach(), metrics)

    @property
    def unwrapped(self) -> torch.nn.Module:
        """The method itself, under DDP's and torch.compile's wrappers."""
        return self.accelerator.unwrap_model(self.method)


@contextlib.contextmanager
def compile_failures(cfg: Config):
    """With ``train.compile``, torch.compile's own failures (no C++ compiler for inductor, an op it cannot
    trace) are one line that says how to train without it; every other exception passes unchanged."""
    try:
        yield
    except Exception as error:
        if not cfg.train.compile or not type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):
            raise
        first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise UserError(
            f"train.compile: torch.compile (backend {cfg.train.compile_backend}) failed: {type(error).__name__}: "
            f"{first.strip()}; set train.compile=false, or train.compile_backend=aot_eager"
        ) from None
