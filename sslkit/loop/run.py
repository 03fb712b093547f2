"""The training run: one readable function in Accelerate's idiom.

``train(cfg)`` runs unchanged in one CPU process, on one GPU, or under
``accelerate launch --num_processes N``: the accelerator places tensors, wraps the method in
DDP, shards the loader, and saves/loads state. Sections, in order:

    set-up -> data -> model, loss, optimizer -> prepare -> resume -> loop -> export, evaluate

and the loop body reads augment -> forward -> check -> backward -> step -> after-step hook ->
log -> checkpoint. The log shows the method's own figures beside the loss: the metrics its forward
returns with it (:class:`~sslkit.methods.base.LossAndMetrics`) and what its after-step hook returns.
The prepared pieces travel together as one :class:`Run`. Evaluation (the kNN monitor and the final
rows) lives in :mod:`sslkit.evaluation`, shared with ``sslkit-evaluate``.

Exactness of resume: the data order of epoch ``e`` is a pure function of ``(seed, e)``
(:mod:`sslkit.datasets.samplers`), the learning rate a pure function of the step, and
``accelerator.save_state`` stores model, optimizer, scaler and every process's RNG states
(kornia draws augmentation parameters from the torch RNG; loader workers that augment,
``data.augment_in_workers``, seed each batch by ``(seed, epoch, batch)`` instead). A run resumed
from a checkpoint therefore continues with the same batches, augmentations and updates.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import Sampler

from sslkit import distributed, methods, models
from sslkit.augment import EvalTransform, TwoViewAugment
from sslkit.config import Config, flatten, save_config, to_dict
from sslkit.console import console, print_config, results_table
from sslkit.datasets import Splits, augmented, build_splits, folders, label_subset, shards
from sslkit.datasets.batches import AugmentedViews
from sslkit.errors import Preempted
from sslkit.evaluation import RunEvaluator
from sslkit.loop.build import (
    check_training_set,
    make_accelerator,
    make_augment,
    make_backbone,
    make_method,
    make_optimizer,
    make_run_dir,
    make_train_loader,
    prepare_for_training,
    stop_workers_before_exit,
)
from sslkit.loop.checkpointer import Checkpointer
from sslkit.loop.launch import cpu_threads
from sslkit.loop.logs import LogWindow, MetricsLog, ProgressBar
from sslkit.loop.run_directory import check_run_directory, read_progress, resolve_resume, trim_metrics
from sslkit.loop.signals import StopSignals
from sslkit.loop.state import LoopState, Schedule
from sslkit.loop.step import FiniteLoss, TrainingStep, compile_failures
from sslkit.loop.trackers import start_trackers
from sslkit.models import weights


@dataclass
class Run:
    """A training run's prepared pieces, built once by :func:`train` and handed to each part of the loop."""

    cfg: Config
    run_dir: Path
    accelerator: Accelerator
    step: TrainingStep  # the prepared method and optimizer
    loader: object  # the prepared DataLoader, or a shards.StreamLoader
    sampler: Sampler | shards.StreamLoader
    augment: TwoViewAugment  # on the device; with data.augment_in_workers the loader workers hold copies
    schedule: Schedule
    evaluator: RunEvaluator
    log: MetricsLog
    checkpoints: Checkpointer
    corrupt: folders.CorruptCount  # files found corrupt while loading, per epoch
    progress: LoopState

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def method(self) -> torch.nn.Module:
        """The method as prepared (DDP, compiled): what the forward pass calls."""
        return self.step.method

    @property
    def unwrapped(self) -> torch.nn.Module:
        """The method itself: its backbone, its hooks, the weights a checkpoint holds."""
        return self.step.unwrapped


# ---------------------------------------------------------------------- the steps of a run


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
    if cfg.data.val_fraction is not None and splits.test is not None:
        notes.append(
            f"data.val_fraction={cfg.data.val_fraction}: every accuracy is measured on {len(splits.test)} training "
            f"images held out of training (the same in every run), not on the test split"
        )
    if cfg.method.name == "finetune" and not cfg.run.init_from:
        notes.append("method.name=finetune without run.init_from trains from scratch (random init)")
    print_config(flatten(to_dict(cfg)), _defaults(cfg), f"sslkit pretrain — {run_dir}", str(run_dir / "config.yaml"))
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
        f"{world} process{'es' if world > 1 else ''} on {accelerator.device}{_backend(accelerator)}, "
        f"{_precision(accelerator)}, "
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
    resume_from, damaged = resolve_resume(cfg.run.resume, run_dir)
    for line in damaged if main else []:
        console.print(f"note: {line}: resuming from the checkpoint before it", markup=False, highlight=False)
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        progress = LoopState(**read_progress(resume_from))
        if main:
            finished = f"; the run had already finished (total {total_steps} steps): evaluating it again"
            console.print(
                f"resumed from {resume_from} at step {progress.step} "
                f"(epoch {progress.epoch}, batch {progress.batch_in_epoch})"
                + (finished if progress.step >= total_steps else "")
            )
    elif cfg.run.resume == "auto" and main:
        console.print(f"no checkpoint in {weights.checkpoint_dir(run_dir)}: starting fresh")
    if main and (resume_from is not None or cfg.run.resume == "auto"):
        trim_metrics(run_dir, progress.step)  # lines past the checkpoint will be logged again
    return progress, resume_from


def epoch_batches(run: Run):
    """The batches of ``run.progress.epoch`` that remain (all of them, unless resuming mid-epoch)."""
    progress, loader = run.progress, run.loader
    skip = progress.batch_in_epoch
    if isinstance(loader, shards.StreamLoader):  # it skips inside the stream, without decoding
        return loader.epoch(progress.epoch, skip)
    batches = run.accelerator.skip_first_batches(loader, skip) if skip else loader
    # Accelerate's loader counts its own iterations and passes that count to the sampler as
    # the epoch when iteration starts; after a resume the count would be wrong, so set it.
    batches.set_epoch(progress.epoch)
    run.sampler.set_epoch(progress.epoch)
    return batches


def log_step(run: Run, window: LogWindow, bar: ProgressBar) -> LogWindow:
    """After an optimizer step: every ``train.log_every_steps`` (and at the last step) a log line, which starts
    a new window; otherwise only the bar moves. Returns the window the next batches count in."""
    progress, total = run.progress, run.schedule.total_steps
    if progress.step % run.cfg.train.log_every_steps and progress.step != total:
        bar.update(completed=progress.step)
        return window
    window.finite.check(progress)  # before the line: a non-finite loss stops the run rather than being logged
    r = window.record(progress, run.step.optimizer, run.accelerator)
    run.log(r, progress.step)
    own = window.method_values(r)  # the method's figures beside the loss: a mask rate, a momentum
    bar.update(progress.step, r["epoch"], {"loss": r["loss"], "lr": r["lr"], "ips": r["images_per_s"]}, own)
    if run.main and not console.is_terminal:  # a log file gets a line, a terminal the bar
        named = "".join(f"  {name} {value:.4g}" for name, value in own.items())
        console.print(
            f"step {progress.step}/{total}  epoch {r['epoch']}  loss {r['loss']:.4f}{named}  lr {r['lr']:.3g}  "
            f"{r['images_per_s']:.0f} img/s  data wait {r['data_wait_share']:.1%}",
            soft_wrap=True,  # one line per step, however many figures the method adds
        )
    return LogWindow(window.finite)


def end_epoch(run: Run) -> None:
    """An epoch ran to its end: count it, run the kNN monitor and save when the recipe says so."""
    cfg, progress, evaluator = run.cfg, run.progress, run.evaluator
    progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
    every = cfg.train.knn_every_epochs if evaluator.classifies else 0  # no labelled evaluation set: no monitor
    if every and progress.epoch % every == 0 and progress.step < run.schedule.total_steps:  # last: final evaluation
        distributed.broadcast_buffers(run.unwrapped)  # every process evaluates rank 0's
        knn = evaluator.knn(run.unwrapped.backbone)
        run.method.train()
        run.log({"step": progress.step, "epoch": progress.epoch, **knn}, progress.step)
        if run.main:
            console.print(f"epoch {progress.epoch}: kNN top-1 {knn['knn_top1']:.4f}")
    if progress.epoch % cfg.train.checkpoint_every_epochs == 0 or progress.epoch == cfg.train.epochs:
        run.checkpoints.save(progress)


def train_epochs(run: Run, stop: StopSignals) -> bool:
    """The loop: epochs of augment -> step -> log -> checkpoint, until the schedule's last step; returns True
    when a stop signal ended it early (every process returns after the same step)."""
    cfg, progress, total = run.cfg, run.progress, run.schedule.total_steps
    with ProgressBar(progress, total, run.main) as bar:
        while progress.step < total and progress.epoch < cfg.train.epochs:
            run.unwrapped.backbone_frozen = progress.epoch < cfg.train.freeze_backbone_epochs
            run.unwrapped.epoch = progress.epoch
            window = LogWindow(run.step.finite)
            batches = run.corrupt.watch(epoch_batches(run))
            for images, labels, *indices in window.timed(batches):
                progress.batch_in_epoch += 1
                with torch.no_grad():  # the loader workers made the views already with data.augment_in_workers
                    views = images.views if isinstance(images, AugmentedViews) else run.augment(images)
                loss, metrics = run.step(views, labels, indices, run.schedule.lr(progress.step, cfg), progress)
                window.add(loss, len(labels), metrics)
                if run.accelerator.sync_gradients:
                    # Methods with state outside the optimizer (MoCo's momentum encoder) update it here.
                    window.schedules = run.unwrapped.after_optimizer_step(progress.step, total)
                    progress.step += 1
                    window = log_step(run, window, bar)
                    if cfg.train.checkpoint_every_steps and progress.step % cfg.train.checkpoint_every_steps == 0:
                        run.checkpoints.save(progress)
                    if stop.agreed():
                        return True
                if progress.step >= total:
                    break
            if progress.batch_in_epoch == run.schedule.batches_per_epoch:
                run.corrupt.end_epoch(progress.epoch)
                end_epoch(run)
                bar.update(epoch=progress.epoch)
    return False


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
    """results.json and the results table (main process)."""
    backbone_file = run_dir / "backbone.safetensors"
    summary = {"results": results, "step": progress.step, "checkpoint": str(last_good), "backbone": str(backbone_file)}
    (run_dir / "results.json").write_text(json.dumps(summary, indent=2))
    m = cfg.model
    backbone = m.backbone if models.timm_name(m.backbone) else f"{m.backbone} (width {m.width})"
    if any(results.values()):
        console.print(results_table(results, f"{cfg.run.name}: {cfg.data.name}, {backbone}"))


def _defaults(cfg: Config) -> dict:
    """sslkit's default of every setting, dotted; a ``method.*`` option's is the chosen method's own, where it
    has the option, else the default of the first method that does (as ``methods.check_config`` fills them)."""
    defaults = flatten(to_dict(Config()))
    own = {item.name: item for item in dataclasses.fields(methods.METHODS[cfg.method.name].Options)}
    for name, item in {**methods.option_fields(), **own}.items():
        missing = item.default_factory is dataclasses.MISSING
        defaults[f"method.{name}"] = item.default if missing else item.default_factory()
    for always_shown in ("data.name", "model.backbone", "method.name", "loss.name"):  # what was trained, on what
        del defaults[always_shown]
    return defaults


def _backend(accelerator) -> str:
    """`` (gloo)`` and the like for several processes; nothing for one."""
    return f" ({torch.distributed.get_backend()})" if accelerator.num_processes > 1 else ""


def _precision(accelerator) -> str:
    """The precision the steps really run in (Accelerate ignores fp16 on the CPU)."""
    mode = accelerator.mixed_precision
    if mode == "no" or (mode == "fp16" and accelerator.device.type == "cpu"):
        return "fp32"
    return f"{mode} autocast"


def prepare_run(cfg: Config) -> tuple[Run, dict | None]:
    """Everything up to the first step: the run directory, data, method, optimizer, prepared and resumed.

    Returns the run and, with ``eval.compare_random_init``, the backbone's starting weights.
    """
    # ------------------------------------------------------------------ set-up
    run_dir = make_run_dir(cfg)
    notes = check_run_directory(run_dir, cfg.run.resume, to_dict(cfg))  # one run per directory
    accelerator = make_accelerator(cfg, run_dir)
    # train.threads applies on any device (data and host work); the automatic count only matters on the CPU.
    on_cpu, main = accelerator.device.type == "cpu", accelerator.is_main_process
    threads = cpu_threads(cfg.train.threads) if cfg.train.threads or on_cpu else (None, "")
    set_seed(cfg.run.seed, device_specific=True)

    # ------------------------------------------------------------------ data
    # A resumed run reads its label subset back; supervised methods train on the labelled images only.
    needs_labels = methods.METHODS[cfg.method.name].needs_labels
    splits = build_splits(cfg, run_dir=run_dir, labelled_training=needs_labels)
    info = splits.info
    d = cfg.data
    in_workers = augmented.in_workers(d.augment_in_workers, accelerator.device, d.num_workers)
    # Where images decode and are augmented; evaluation or not.
    notes += folders.prepare_training_set(cfg, splits, accelerator.device, in_workers)
    local_batch = check_training_set(cfg, splits, accelerator.num_processes)
    augment = make_augment(cfg, info)
    train_loader, sampler = make_train_loader(cfg, splits.train, local_batch, augment if in_workers else None)
    if not in_workers:
        augment = augment.to(accelerator.device)

    # ------------------------------------------------------------------ model, loss, optimizer
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

    # ------------------------------------------------------------------ prepare
    method, optimizer, train_loader = prepare_for_training(cfg, accelerator, method, optimizer, train_loader)
    stop_workers_before_exit(train_loader)
    # The starting weights as every process now has them: DDP has just given all of them process 0's
    # (a copy taken before prepare would score a different network on each process's share of the data).
    start_state = None
    if cfg.eval.compare_random_init:
        backbone = accelerator.unwrap_model(method).backbone
        start_state = {k: v.detach().clone() for k, v in backbone.state_dict().items()}
    schedule = Schedule.from_config(cfg, len(train_loader), lr)
    evaluator = RunEvaluator(cfg, splits, preprocess.to(accelerator.device), accelerator)
    start_trackers(cfg, run_dir, accelerator)

    # ------------------------------------------------------------------ resume
    progress, last_good = resume(cfg, run_dir, accelerator, schedule.total_steps)
    checkpoints = Checkpointer(accelerator, run_dir, method, cfg.train.keep_checkpoints, last_good)
    step = TrainingStep(accelerator, method, optimizer, FiniteLoss(accelerator, checkpoints))
    corrupt = folders.CorruptCount(cfg.data.on_corrupt, len(splits.train), accelerator)
    log = MetricsLog(run_dir / "metrics.jsonl", accelerator)
    run = Run(
        cfg, run_dir, accelerator, step, train_loader, sampler, augment, schedule, evaluator, log, checkpoints,
        corrupt, progress,
    )  # fmt: skip
    return run, start_state


def train(cfg: Config, exit_after_stop: bool = False) -> dict:
    """Pretrain an encoder as ``cfg`` says; returns the final evaluation results.

    Stopped by one of ``train.stop_signals``, it saves and raises :class:`sslkit.errors.Preempted`;
    ``exit_after_stop`` (a process that then exits, as the command line) leaves those signals ignored.
    """
    run, start_state = prepare_run(cfg)

    # ------------------------------------------------------------------ loop
    run.method.train()
    with compile_failures(cfg), StopSignals(cfg.train.stop_signals, ignore_after_stop=exit_after_stop) as stop:
        if train_epochs(run, stop):  # preempted: save (a second signal meanwhile is only recorded) and stop
            saved = run.checkpoints.save_unless_saved(run.progress)
            run.accelerator.end_training()
            raise Preempted(stop.name, run.progress.step, saved)

    # ------------------------------------------------------------------ export, evaluate
    progress, unwrapped = run.progress, run.unwrapped
    last_good = run.checkpoints.save_unless_saved(progress)
    if run.main:
        weights.export_backbone(unwrapped.backbone, run.run_dir / "backbone.safetensors")
    distributed.broadcast_buffers(unwrapped)  # every process evaluates the network the checkpoint holds
    results = final_evaluation(cfg, run.evaluator, unwrapped, start_state, run.augment.out_channels)
    final = {f"final_{k}": v for k, v in results["trained"].items()}
    run.log({"step": progress.step, "epoch": progress.epoch, **final}, progress.step)
    if run.main:
        write_results(cfg, run.run_dir, results, progress, last_good)
    run.accelerator.end_training()
    return results
