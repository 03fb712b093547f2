"""What a run reports while it trains: ``metrics.jsonl`` and trackers, the log window, the progress bar."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from accelerate import Accelerator
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from sslkit.console import console
from sslkit.loop.state import LoopState
from sslkit.loop.step import FiniteLoss


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl`` (main process only) and to trackers."""

    def __init__(self, path: Path, accelerator: Accelerator) -> None:
        self.path, self.accelerator = path, accelerator

    def __call__(self, record: dict, step: int) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step",)}
        self.accelerator.log(numeric, step=step)


class LogWindow:
    """Loss, the method's own values, speed and data wait over the batches since the last log line.

    It counts batches and the images loaded, not steps x ``grad_accum_steps`` x ``train.batch_size``: the
    last step of an epoch may accumulate fewer batches than that (Accelerate steps at the loader's end),
    and a method's batch may load more images than its share of ``train.batch_size`` (``Method.images_per_batch``).

    The method's values are of two kinds: the metrics its ``forward`` returns with the loss (a mask rate, the
    terms of the loss), averaged as the loss is, and what its last ``after_optimizer_step`` returned
    (:attr:`schedules`: a momentum, a temperature), as of the line's step.
    """

    def __init__(self, finite: FiniteLoss) -> None:
        self.start, self.data_wait, self.loss_sum = time.perf_counter(), 0.0, 0.0
        self.metric_sums: dict[str, torch.Tensor] = {}
        self.schedules: dict[str, float] = {}
        self.batches, self.images = 0, 0
        self.finite = finite  # read with the loss, when a line is logged

    def timed(self, batches: Iterable) -> Iterator:
        """``batches``, adding the time spent waiting for each one to ``data_wait``."""
        iterator = iter(batches)
        while True:
            fetch_start = time.perf_counter()
            batch = next(iterator, None)
            if batch is None:
                return
            self.data_wait += time.perf_counter() - fetch_start
            yield batch

    def add(self, loss: torch.Tensor, images: int, metrics: dict[str, torch.Tensor] | None = None) -> None:
        """Add a batch's loss and metrics, on their device (summed there, read once per log line), and its
        ``images``: the images this process loaded for it."""
        self.loss_sum, self.batches = self.loss_sum + loss.detach().float(), self.batches + 1
        for name, value in (metrics or {}).items():
            self.metric_sums[name] = self.metric_sums.get(name, 0.0) + value.detach().float()
        self.images += images

    def record(self, progress: LoopState, optimizer, accelerator: Accelerator) -> dict:
        """The log line of this window (every process calls it: the loss and metrics are averaged over processes,
        in one reduction); the scheduled lr is the first group's lr over its scale; images/s counts every
        process's images, each process loading as many per batch."""
        sums = [torch.as_tensor(self.loss_sum, device=accelerator.device), *self.metric_sums.values()]
        loss, *metrics = accelerator.reduce(torch.stack(sums), reduction="mean").tolist()
        elapsed = time.perf_counter() - self.start
        group = optimizer.param_groups[0]
        return {
            "step": progress.step,
            "epoch": progress.epoch,
            "loss": loss / self.batches,
            **{name: value / self.batches for name, value in zip(self.metric_sums, metrics)},
            **self.schedules,
            "lr": group["lr"] / group.get("lr_scale", 1.0),
            "images_per_s": self.images * accelerator.num_processes / elapsed,
            "data_wait_share": self.data_wait / elapsed,
        }

    def method_values(self, record: dict) -> dict[str, float]:
        """The method's own values in ``record``, this window's: its metrics, then its schedules."""
        return {name: record[name] for name in [*self.metric_sums, *self.schedules]}


class ProgressBar:
    """The rich progress bar of the main process (hidden on the others, and for a run already finished)."""

    def __init__(self, progress: LoopState, total_steps: int, main: bool) -> None:
        self.bar = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            # Cut, rather than the epoch and the bar, where a method's figures leave the line too long.
            TextColumn(
                "{task.fields[figures]}", table_column=Column(no_wrap=True, max_width=max(20, console.width - 40))
            ),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not main or progress.step >= total_steps,
        )
        # Until the first logged step there is no loss or speed to show, and "loss nan 0 img/s" reads as a fault.
        fields = {"epoch": progress.epoch, "figures": "first steps..."}
        self.task = self.bar.add_task("train", total=total_steps, completed=progress.step, **fields)

    def __enter__(self) -> ProgressBar:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(
        self,
        completed: int | None = None,
        epoch: int | None = None,
        figures: dict | None = None,
        method_values: dict[str, float] | None = None,
    ) -> None:
        """Move the bar to step ``completed`` of ``epoch``; ``figures`` (loss, lr, ips) and the method's own values
        (a mask rate, a momentum) from a logged step."""
        fields = {} if epoch is None else {"epoch": epoch}
        if figures is not None:
            named = "".join(f" {name} {value:.4g}" for name, value in (method_values or {}).items())
            loss, lr, ips = figures["loss"], figures["lr"], figures["ips"]
            fields["figures"] = f"loss {loss:.4f}{named} lr {lr:.2e} {ips:.0f} img/s"
        self.bar.update(self.task, completed=completed, **fields)
