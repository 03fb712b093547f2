"""The training loop: one readable function in Accelerate's idiom.

``train(cfg)`` runs unchanged in one CPU process, on one GPU, or under
``accelerate launch --num_processes N``: the accelerator places tensors, wraps the method in
DDP, shards the loader, and saves/loads state. Sections, in order:

    set-up -> data -> model, loss, optimizer -> prepare -> resume -> loop -> export, evaluate

and the loop body reads augment -> forward -> check -> backward -> step -> after-step hook ->
log -> checkpoint. Evaluation (the kNN monitor and the final rows) lives in
:mod:`sslkit.evaluation`, shared with ``sslkit/evaluate.py``.

Exactness of resume: the data order of epoch ``e`` is a pure function of ``(seed, e)``
(:mod:`sslkit.datasets.samplers`), the learning rate a pure function of the step, and
``accelerator.save_state`` stores model, optimizer, scaler and every process's RNG states
(kornia draws augmentation parameters from the torch RNG). A run resumed from a checkpoint
therefore continues with the same batches, augmentations and updates.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, set_seed
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch.utils.data import DataLoader, Sampler

from sslkit import checkpoint, distributed, launch, methods, models, optim
from sslkit.augment import EvalTransform, TwoViewAugment
from sslkit.config import Config, flatten, save_config, to_dict
from sslkit.console import console, print_config, results_table
from sslkit.datasets import (
    Splits,
    WithIndices,
    build_splits,
    collate_batch,
    folders,
    label_subset,
    shards,
    training_sampler,
)
from sslkit.errors import UserError
from sslkit.evaluation import RunEvaluator
from sslkit.report import write_report
from sslkit.sync_batchnorm import convert_sync_batchnorm


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
    """Loss, speed and data wait over the batches since the last log line.

    It counts batches, not steps x ``grad_accum_steps``: the last step of an epoch may
    accumulate fewer batches than that (Accelerate steps at the loader's end).
    """

    def __init__(self, finite: FiniteLoss) -> None:
        self.start, self.data_wait, self.batches, self.loss_sum = time.perf_counter(), 0.0, 0, 0.0
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

    def add(self, loss: torch.Tensor) -> None:
        """Add a batch's loss, on its device: summed there, read once per log line."""
        self.loss_sum, self.batches = self.loss_sum + loss.detach().float(), self.batches + 1

    def record(self, progress: LoopState, optimizer, batch_size: int, accelerator: Accelerator) -> dict:
        """The log line of this window (every process calls it: the loss is averaged over processes); the
        scheduled lr is the first group's lr over its scale."""
        loss = accelerator.reduce(torch.as_tensor(self.loss_sum, device=accelerator.device), reduction="mean")
        elapsed = time.perf_counter() - self.start
        group = optimizer.param_groups[0]
        return {
            "step": progress.step,
            "epoch": progress.epoch,
            "loss": loss.item() / self.batches,
            "lr": group["lr"] / group.get("lr_scale", 1.0),
            "images_per_s": self.batches * batch_size / elapsed,
            "data_wait_share": self.data_wait / elapsed,
        }


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
        self.last_good = checkpoint.save_checkpoint(self.accelerator, self.run_dir, vars(progress), self.keep)
        return self.last_good

    def save_unless_saved(self, progress: LoopState) -> Path:
        """The run's final checkpoint: saved unless the last one is already of this step."""
        if self.last_good is None or checkpoint.read_progress(self.last_good)["step"] != progress.step:
            self.save(progress)
        return self.last_good


# ---------------------------------------------------------------------- builders
# The pieces a training step touches, built as train() builds them. Also used by
# tools/bench/train.py, so that the benchmark times the loop users run, not a copy of it.


def make_run_dir(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


def make_accelerator(cfg: Config, run_dir: Path | None = None) -> Accelerator:
    """The Accelerator of a training run; ``run_dir`` is where trackers write (none: no trackers)."""
    t = cfg.train
    return Accelerator(
        mixed_precision=t.mixed_precision,
        gradient_accumulation_steps=t.grad_accum_steps,
        log_with=list(t.trackers) if t.trackers and run_dir is not None else None,
        project_dir=str(run_dir) if run_dir is not None else None,
        # Our sampler already orders data by (seed, epoch): keep it rather than substituting Accelerate's.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=False),
        # While the backbone is frozen its parameters get no gradient; DDP must be told to expect that.
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=cfg.train.freeze_backbone_epochs > 0)],
    )


def check_training_set(cfg: Config, splits: Splits, world: int) -> int:
    """Raise one line when the data cannot train the method; returns the per-process batch."""
    name, d = cfg.method.name, cfg.data
    if methods.METHODS[name].needs_labels and bool((splits.train.labels < 0).any()):
        raise UserError(
            f"method '{name}' needs labels but dataset '{d.name}' split '{d.train_split}' has unlabelled images; "
            f"use data.train_split=train or a self-supervised method (simclr, moco, ...)"
        )
    batch = cfg.train.batch_size
    if batch % world:
        raise UserError(f"train.batch_size {batch} must be divisible by the number of processes ({world})")
    if batch > len(splits.train):
        raise UserError(
            f"train.batch_size {batch} is larger than the dataset's {len(splits.train)} training images; "
            f"lower train.batch_size"
        )
    return batch // world


def make_train_loader(cfg: Config, train_set, local_batch: int) -> tuple[DataLoader, Sampler]:
    """The training loader (uint8 batches, ``local_batch`` per process) and the sampler that orders its epochs."""
    if isinstance(train_set, shards.ShardStream):  # tar shards: the stream splits and orders its own epochs
        if methods.METHODS[cfg.method.name].needs_indices:
            raise UserError(f"method '{cfg.method.name}' keeps per-sample state, which streamed shards cannot index")
        loader = shards.stream_loader(train_set, local_batch, cfg.data.num_workers, cfg.run.seed)
        return loader, loader
    d = cfg.data
    sampler = training_sampler(
        d.sampler, train_set.labels, d.m_per_class, cfg.train.batch_size, local_batch, cfg.run.seed
    )
    # Methods with per-sample state (NPID's memory bank) get each sample's index with its batch.
    needs_indices = methods.METHODS[cfg.method.name].needs_indices
    loader = DataLoader(
        WithIndices(train_set) if needs_indices else train_set,
        batch_size=local_batch,
        sampler=sampler,
        drop_last=True,
        collate_fn=collate_batch,
        num_workers=cfg.data.num_workers,
        persistent_workers=cfg.data.num_workers > 0,
        # Its own generator: otherwise starting an epoch's iterator draws from the global
        # RNG (worker base seed), and a resumed run would augment with shifted random numbers.
        generator=torch.Generator().manual_seed(cfg.run.seed),
    )
    return loader, sampler


def make_backbone(cfg: Config, in_channels: int, main: bool) -> torch.nn.Module:
    """The recipe's backbone, with ``run.init_from``'s weights when it names a run."""
    backbone = models.backbone_from_config(cfg.model, in_channels)
    if cfg.run.init_from:
        unused = checkpoint.init_backbone(backbone, cfg.run.init_from)
        if main:
            console.print(
                f"backbone initialised from {cfg.run.init_from}"
                + (f"; keys not used: {', '.join(unused)}" if unused else "")
            )
    return backbone


def make_method(
    cfg: Config, backbone: torch.nn.Module, num_classes: int, num_samples: int, device_type: str
) -> torch.nn.Module:
    """The recipe's method around ``backbone``, with global BatchNorm and channels_last if it asks for them."""
    method = methods.build_method(cfg, backbone, num_classes, num_samples)
    if cfg.run.init_from:
        method.start_from(cfg.run.init_from)
    if cfg.model.sync_batchnorm:  # every BatchNorm, momentum encoders included
        method = convert_sync_batchnorm(method, device_type)
    if cfg.model.channels_last:
        models.to_channels_last(method)
    return method


def make_optimizer(cfg: Config, method: torch.nn.Module) -> tuple[torch.optim.Optimizer, float]:
    """The optimizer over ``method``'s parameter groups, and the base learning rate after batch scaling."""
    o = cfg.optim
    lr = optim.scaled_lr(o.lr, cfg.train.batch_size, o.lr_scaling)
    # Per-part learning rates: backbone x backbone_lr_scale, head x head_lr_scale x what the head declares.
    # (and, with optim.layer_decay, each backbone layer below the top at layer_decay per layer)
    try:
        layers = optim.layer_decay_scales(method.backbone, o.layer_decay)
    except ValueError as error:
        raise UserError(f"optim.layer_decay={o.layer_decay}: {error}; set optim.layer_decay=1") from None
    lr_scales = {
        f"backbone.{name}": o.backbone_lr_scale * layers.get(name, 1.0)
        for name, _ in method.backbone.named_parameters()
    }
    if isinstance(getattr(method, "loss", None), torch.nn.Module):
        head_scales = _loss_lr_scales(method.loss)
        lr_scales.update({f"loss.{name}": scale * o.head_lr_scale for name, scale in head_scales.items()})
    no_decay = {f"backbone.{name}" for name in optim.model_no_weight_decay(method.backbone)}
    groups = optim.parameter_groups(method, o.weight_decay, o.exclude_bias_and_norm, lr_scales, no_decay)
    optimizer = optim.build_optimizer(o.name, groups, lr, o.momentum, o.weight_decay, o.betas, o.trust_coefficient)
    return optimizer, lr


def prepare_for_training(
    cfg: Config, accelerator: Accelerator, method: torch.nn.Module, optimizer, loader: DataLoader
):
    """``accelerator.prepare`` of the three, after telling DDP which buffers it need not re-send; with
    ``train.compile``, the prepared method compiled.

    Compiled after DDP wraps it, as torch recommends (DDP's buckets then split the graph at their
    all-reduces), and by sslkit rather than Accelerate's ``dynamo_backend``: Accelerate keeps that
    setting in process-wide state, so a second run in one process would keep the first run's choice.
    ``accelerator.unwrap_model`` sees through the compiled wrapper, so checkpoints keep the method's keys.
    """
    # MoCo's queue, NPID's bank: equal on every process already.
    distributed.skip_broadcast_of_replicated_buffers(method)
    method, optimizer, loader = accelerator.prepare(method, optimizer, loader)
    if cfg.train.compile:
        method = torch.compile(method, backend=cfg.train.compile_backend, mode=_compile_mode(cfg))
    return method, optimizer, loader


def _compile_mode(cfg: Config) -> str | None:
    # torch.compile takes no mode with a backend other than inductor.
    return cfg.train.compile_mode if cfg.train.compile_backend == "inductor" else None


def optimizer_step(
    accelerator, method, optimizer, views, labels, indices, lr: float, finite: FiniteLoss, progress=None
) -> torch.Tensor:
    """Forward, check, backward and (at the end of an accumulation window) step; returns the loss (detached, on
    the device: when to wait for the device to read it is the caller's choice).

    ``finite`` stops the run on a non-finite loss (see :class:`FiniteLoss`), naming ``progress``'s step.
    """
    with accelerator.accumulate(method):
        with accelerator.autocast():
            loss = method(*views, labels, *indices)
        finite.add(loss, progress)
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            optim.set_learning_rate(optimizer, lr)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()


# ---------------------------------------------------------------------- the steps of a run


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


WANDB_ID_FILE = "wandb_id.txt"


def tracker_run_id(path: Path) -> str:
    """The run's tracker id read from ``path``, or a new one written there (8 hex digits, as W&B's own)."""
    if path.is_file() and (saved := path.read_text().strip()):
        return saved
    new = secrets.token_hex(4)
    path.write_text(new + "\n")
    return new


def start_trackers(cfg: Config, run_dir: Path, accelerator: Accelerator) -> None:
    """``train.trackers`` get the resolved config as hyperparameters (lists as text: TensorBoard's hparams take
    scalars only), under the project name ``sslkit``: TensorBoard writes to ``run_dir/sslkit``, W&B to
    ``run_dir/wandb`` as a run named ``run.name`` in project ``sslkit``."""
    if not cfg.train.trackers:
        return
    hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flatten(to_dict(cfg)).items()}
    init_kwargs = {"wandb": {"name": cfg.run.name, "dir": str(run_dir)}}
    if "wandb" in cfg.train.trackers and accelerator.is_main_process:
        # A resumed run continues its W&B run instead of starting a second one: the id lives in the run directory.
        init_kwargs["wandb"].update(id=tracker_run_id(run_dir / WANDB_ID_FILE), resume="allow")
    accelerator.init_trackers("sslkit", config=hparams, init_kwargs=init_kwargs)


def announce(cfg: Config, run_dir: Path, accelerator: Accelerator, notes: list[str], threads, splits: Splits):
    """Create the run directory with its config.yaml (and label subset), and print the config, the notes
    and the set-up line."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    if splits.subset is not None:
        label_subset.save(run_dir / label_subset.FILE_NAME, splits.subset_spec, splits.subset)
        notes.append(
            f"labels: {len(splits.subset)} labelled training images, {splits.subset_spec.describe()} "
            f"(indices in {label_subset.FILE_NAME}); the kNN memory and linear probe use only these"
        )
    if cfg.method.name == "finetune" and not cfg.run.init_from:
        notes.append("method.name=finetune without run.init_from trains from scratch (random init)")
    print_config(to_dict(cfg), f"sslkit pretrain — {run_dir}")
    t, world = cfg.train, accelerator.num_processes
    if t.freeze_backbone_epochs >= t.epochs:
        notes.append(
            f"train.freeze_backbone_epochs={t.freeze_backbone_epochs} covers all "
            f"{t.epochs} epochs: the backbone is never trained, only what sits on it"
        )
    if accelerator.device.type == "cpu" and t.mixed_precision == "fp16":
        notes.append(
            "train.mixed_precision=fp16 has no effect on the CPU (Accelerate runs fp32 there); "
            "train.mixed_precision=bf16 autocasts on CPUs that support it"
        )
    notes += models.notes(cfg.model)
    notes += [note for note in (methods.unused_options(cfg), *methods.notes(cfg, len(splits.train))) if note]
    for note in notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    count, source = threads
    console.print(
        f"{world} process{'es' if world > 1 else ''} on {accelerator.device} ({accelerator.distributed_type.value}), "
        f"{t.batch_size // world} images per process per batch, global batch {t.batch_size}"
        + (f", {t.grad_accum_steps} batches accumulated per step" if t.grad_accum_steps > 1 else "")
        + (f", {count} CPU thread{'s' if count > 1 else ''} per process ({source})" if count else "")
        + (
            ", BatchNorm over the global batch (model.sync_batchnorm)"
            if cfg.model.sync_batchnorm and world > 1
            else ""
        )
    )


def resume(cfg: Config, run_dir: Path, accelerator: Accelerator, total_steps: int) -> tuple[LoopState, Path | None]:
    """Load ``run.resume``'s checkpoint into the prepared objects; returns the loop state and that checkpoint."""
    main, progress = accelerator.is_main_process, LoopState()
    resume_from = checkpoint.resolve_resume(cfg.run.resume, run_dir)
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        progress = LoopState(**checkpoint.read_progress(resume_from))
        if main:
            finished = f"; the run had already finished (total {total_steps} steps): evaluating it again"
            console.print(
                f"resumed from {resume_from} at step {progress.step} "
                f"(epoch {progress.epoch}, batch {progress.batch_in_epoch})"
                + (finished if progress.step >= total_steps else "")
            )
    elif cfg.run.resume == "auto" and main:
        console.print(f"no checkpoint in {checkpoint.checkpoint_dir(run_dir)}: starting fresh")
    if main and (resume_from is not None or cfg.run.resume == "auto"):
        checkpoint.trim_metrics(run_dir, progress.step)  # lines past the checkpoint will be logged again
    return progress, resume_from


def epoch_batches(train_loader, sampler: Sampler, progress: LoopState, accelerator: Accelerator):
    """The batches of ``progress.epoch`` that remain (all of them, unless resuming mid-epoch)."""
    skip = progress.batch_in_epoch
    if isinstance(train_loader, shards.StreamLoader):  # it skips inside the stream, without decoding
        return train_loader.epoch(progress.epoch, skip)
    loader = accelerator.skip_first_batches(train_loader, skip) if skip else train_loader
    # Accelerate's loader counts its own iterations and passes that count to the sampler as
    # the epoch when iteration starts; after a resume the count would be wrong, so set it.
    loader.set_epoch(progress.epoch)
    sampler.set_epoch(progress.epoch)
    return loader


def progress_bar(progress: LoopState, total_steps: int, main: bool) -> tuple[Progress, int]:
    bar = Progress(
        TextColumn("[bold]epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("lr {task.fields[lr]:.2e}"),
        TextColumn("{task.fields[ips]:.0f} img/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not main or progress.step >= total_steps,
    )
    fields = {"epoch": progress.epoch, "loss": float("nan"), "lr": 0.0, "ips": 0.0}
    return bar, bar.add_task("train", total=total_steps, completed=progress.step, **fields)


def log_step(
    cfg: Config, window: LogWindow, progress: LoopState, optimizer, log: MetricsLog, bar: Progress, task, total: int
) -> LogWindow:
    """After an optimizer step: every ``train.log_every_steps`` (and at the last step) a log line, which starts
    a new window; otherwise only the bar moves. Returns the window the next batches count in."""
    if progress.step % cfg.train.log_every_steps and progress.step != total:
        bar.update(task, completed=progress.step)
        return window
    window.finite.check(progress)  # before the line: a non-finite loss stops the run rather than being logged
    r = window.record(progress, optimizer, cfg.train.batch_size, log.accelerator)
    log(r, progress.step)
    bar.update(task, completed=progress.step, epoch=r["epoch"], loss=r["loss"], lr=r["lr"], ips=r["images_per_s"])
    if log.accelerator.is_main_process and not console.is_terminal:  # a log file gets a line, a terminal the bar
        console.print(
            f"step {progress.step}/{total}  epoch {r['epoch']}  loss {r['loss']:.4f}  lr {r['lr']:.3g}  "
            f"{r['images_per_s']:.0f} img/s  data wait {r['data_wait_share']:.1%}"
        )
    return LogWindow(window.finite)


def end_epoch(cfg: Config, progress: LoopState, total_steps: int, evaluator: RunEvaluator, method, log, checkpoints):
    """An epoch ran to its end: count it, run the kNN monitor and save when the recipe says so."""
    progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
    every = cfg.train.knn_every_epochs if evaluator.classifies else 0  # no labelled evaluation set: no monitor
    if every and progress.epoch % every == 0 and progress.step < total_steps:  # the last epoch: final evaluation
        distributed.broadcast_buffers(log.accelerator.unwrap_model(method))  # every process evaluates rank 0's
        knn = evaluator.knn(log.accelerator.unwrap_model(method).backbone)
        method.train()
        log({"step": progress.step, "epoch": progress.epoch, **knn}, progress.step)
        if log.accelerator.is_main_process:
            console.print(f"epoch {progress.epoch}: kNN top-1 {knn['knn_top1']:.4f}")
    if progress.epoch % cfg.train.checkpoint_every_epochs == 0 or progress.epoch == cfg.train.epochs:
        checkpoints.save(progress)


def final_evaluation(cfg: Config, evaluator: RunEvaluator, method, start_state: dict | None, in_channels: int):
    """The results table's rows: the trained encoder (and the method's own classifier, if it has one), its
    starting weights (``eval.compare_random_init``), raw pixels (``eval.compare_raw_pixels``)."""
    if not evaluator.available:
        return {"trained": {}}
    results = {"trained": evaluator.evaluate(method.backbone)}
    if method.classifier_metric and evaluator.classifies:  # fine-tuning, the heads: the network's own test top-1
        results["trained"][method.classifier_metric] = evaluator.classifier_top1(method)
    if start_state is not None:
        # Built only now: building it draws from the RNG, which training must not see.
        start = models.backbone_from_config(cfg.model, in_channels)
        start.load_state_dict(start_state)
        row = "start (init_from)" if cfg.run.init_from else "random init"
        results[row] = evaluator.evaluate(start.to(evaluator.accelerator.device))
    if cfg.eval.compare_raw_pixels:
        results["raw pixels"] = evaluator.raw_pixels()
    return results


def write_results(cfg: Config, run_dir: Path, results: dict, progress: LoopState, last_good: Path) -> None:
    """results.json, the results table and the run's report (main process)."""
    backbone_file = run_dir / "backbone.safetensors"
    summary = {"results": results, "step": progress.step, "checkpoint": str(last_good), "backbone": str(backbone_file)}
    (run_dir / "results.json").write_text(json.dumps(summary, indent=2))
    m = cfg.model
    backbone = m.backbone if models.timm_name(m.backbone) else f"{m.backbone} (width {m.width})"
    if any(results.values()):
        console.print(results_table(results, f"{cfg.run.name}: {cfg.data.name}, {backbone}"))
    report = write_report(run_dir)
    console.print(
        f"run directory: {run_dir}  (report: {report.name}; "
        f"backbone.safetensors, checkpoints/, metrics.jsonl, config.yaml, results.json)"
    )


def train(cfg: Config) -> dict:
    """Pretrain an encoder as ``cfg`` says; returns the final evaluation results."""
    # ------------------------------------------------------------------ set-up
    run_dir = make_run_dir(cfg)
    notes = checkpoint.check_run_directory(run_dir, cfg.run.resume, to_dict(cfg))  # one run per directory
    accelerator = make_accelerator(cfg, run_dir)
    # train.threads applies on any device (data and host work); the automatic count only matters on the CPU.
    on_cpu, main = accelerator.device.type == "cpu", accelerator.is_main_process
    threads = launch.cpu_threads(cfg.train.threads) if cfg.train.threads or on_cpu else (None, "")
    set_seed(cfg.run.seed, device_specific=True)

    # ------------------------------------------------------------------ data
    # A resumed run reads its label subset back; supervised methods train on the labelled images only.
    needs_labels = methods.METHODS[cfg.method.name].needs_labels
    splits = build_splits(cfg, run_dir=run_dir, labelled_training=needs_labels)
    info = splits.info
    notes += folders.prepare_training_set(cfg, splits, accelerator.device)  # where images decode; evaluation or not
    local_batch = check_training_set(cfg, splits, accelerator.num_processes)
    train_loader, sampler = make_train_loader(cfg, splits.train, local_batch)

    # ------------------------------------------------------------------ model, loss, optimizer
    views = methods.METHODS[cfg.method.name].num_views
    augment = TwoViewAugment(cfg.augment, info.channels, info.mean, info.std, views).to(accelerator.device)
    preprocess = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    # Before the method: MoCo copies the backbone into its momentum encoder when it is built.
    backbone = make_backbone(cfg, augment.out_channels, main)
    method = make_method(cfg, backbone, info.num_classes, len(splits.train), accelerator.device.type)
    optimizer, lr = make_optimizer(cfg, method)
    if main and cfg.optim.lr_scaling != "none":
        console.print(
            f"learning rate: {cfg.optim.lr} x {cfg.optim.lr_scaling}(batch {cfg.train.batch_size} / 256) = {lr:.5g}"
        )
    # Only now, with the recipe, data, model and init_from known to be good, does the run directory appear.
    if main:
        announce(cfg, run_dir, accelerator, notes, threads, splits)
    log = MetricsLog(run_dir / "metrics.jsonl", accelerator)

    # ------------------------------------------------------------------ prepare
    method, optimizer, train_loader = prepare_for_training(cfg, accelerator, method, optimizer, train_loader)
    unwrapped = accelerator.unwrap_model(method)
    # The starting weights as every process now has them: DDP has just given all of them process 0's
    # (a copy taken before prepare would score a different network on each process's share of the data).
    start_state = None
    if cfg.eval.compare_random_init:
        start_state = {k: v.detach().clone() for k, v in unwrapped.backbone.state_dict().items()}
    schedule = Schedule.from_config(cfg, len(train_loader), lr)
    evaluator = RunEvaluator(cfg, splits, preprocess.to(accelerator.device), accelerator)
    start_trackers(cfg, run_dir, accelerator)

    # ------------------------------------------------------------------ resume
    progress, last_good = resume(cfg, run_dir, accelerator, schedule.total_steps)
    checkpoints = Checkpointer(accelerator, run_dir, method, cfg.train.keep_checkpoints, last_good)
    finite = FiniteLoss(accelerator, checkpoints)
    corrupt = folders.CorruptCount(cfg.data.on_corrupt, len(splits.train), accelerator)

    # ------------------------------------------------------------------ loop
    total = schedule.total_steps
    bar, task = progress_bar(progress, total, main)
    method.train()
    with bar, compile_failures(cfg):
        while progress.step < total and progress.epoch < cfg.train.epochs:
            unwrapped.backbone_frozen = progress.epoch < cfg.train.freeze_backbone_epochs
            window = LogWindow(finite)
            batches = corrupt.watch(epoch_batches(train_loader, sampler, progress, accelerator))
            for images, labels, *indices in window.timed(batches):
                progress.batch_in_epoch += 1
                with torch.no_grad():
                    views = augment(images)
                lr_now = schedule.lr(progress.step, cfg)
                loss = optimizer_step(accelerator, method, optimizer, views, labels, indices, lr_now, finite, progress)
                window.add(loss)
                if accelerator.sync_gradients:
                    # Methods with state outside the optimizer (MoCo's momentum encoder) update it here.
                    unwrapped.after_optimizer_step(progress.step, total)
                    progress.step += 1
                    window = log_step(cfg, window, progress, optimizer, log, bar, task, total)
                    if cfg.train.checkpoint_every_steps and progress.step % cfg.train.checkpoint_every_steps == 0:
                        checkpoints.save(progress)
                if progress.step >= total:
                    break
            if progress.batch_in_epoch == schedule.batches_per_epoch:
                corrupt.end_epoch(progress.epoch)
                end_epoch(cfg, progress, total, evaluator, method, log, checkpoints)
                bar.update(task, epoch=progress.epoch)

    # ------------------------------------------------------------------ export, evaluate
    last_good = checkpoints.save_unless_saved(progress)
    if main:
        checkpoint.export_backbone(unwrapped.backbone, run_dir / "backbone.safetensors")
    distributed.broadcast_buffers(unwrapped)  # every process evaluates the network the checkpoint holds
    results = final_evaluation(cfg, evaluator, unwrapped, start_state, augment.out_channels)
    final = {f"final_{k}": v for k, v in results["trained"].items()}
    log({"step": progress.step, "epoch": progress.epoch, **final}, progress.step)
    if main:
        write_results(cfg, run_dir, results, progress, last_good)
    accelerator.end_training()
    return results


def _loss_lr_scales(loss: torch.nn.Module) -> dict[str, float]:
    """Per-parameter lr multipliers a head declares through ``param_groups()`` (e.g. proxies at 100x)."""
    if not hasattr(loss, "param_groups"):
        return {}
    names = {id(p): n for n, p in loss.named_parameters()}
    return {names[id(p)]: float(g.get("lr_scale", 1.0)) for g in loss.param_groups() for p in g["params"]}
