"""The training loop: one readable function in Accelerate's idiom.

``train(cfg)`` runs unchanged in one CPU process, on one GPU, or under
``accelerate launch --num_processes N``: the accelerator places tensors, wraps the method in
DDP, shards the loader, and saves/loads state. Sections, in order:

    set-up -> data -> model, loss, optimizer -> prepare -> resume -> epochs -> export, evaluate

Exactness of resume: the data order of epoch ``e`` is a pure function of ``(seed, e)``
(:class:`EpochShuffleSampler`), the learning rate a pure function of the step, and
``accelerator.save_state`` stores model, optimizer, scaler and every process's RNG states
(kornia draws augmentation parameters from the torch RNG). A run resumed from a checkpoint
therefore continues with the same batches, augmentations and updates.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, set_seed
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch.utils.data import DataLoader, Sampler

from sslkit import checkpoint, data, distributed, evaluation, launch, methods, models, optim
from sslkit.augment import EvalTransform, TwoViewAugment
from sslkit.config import Config, flatten, save_config, to_dict
from sslkit.console import console, print_config, results_table
from sslkit.errors import UserError
from sslkit.report import write_report
from sslkit.sync_batchnorm import convert_sync_batchnorm


class EpochShuffleSampler(Sampler[int]):
    """A permutation of the dataset that depends only on ``(seed, epoch)``.

    Why not ``RandomSampler``: its order depends on the global RNG at the moment the epoch
    starts, so a resumed run would see different batches. Here ``set_epoch`` picks the order.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


@dataclass
class LoopState:
    """Loop counters saved with every checkpoint."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch
    batch_in_epoch: int = 0  # batches of the current epoch already consumed


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


def make_run_dir(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


def eval_loaders(cfg: Config, train_set, test_set, batch_size: int) -> tuple[DataLoader, DataLoader]:
    """Unshuffled loaders over train (the kNN memory) and test, for feature extraction."""
    make = lambda ds: data.build_loader(
        ds, batch_size, shuffle=False, drop_last=False, num_workers=cfg.data.num_workers
    )
    return make(train_set), make(test_set)


def evaluate_backbone(
    backbone,
    cfg: Config,
    preprocess,
    train_loader,
    test_loader,
    num_classes: int,
    accelerator: Accelerator,
    linear: bool = True,
) -> dict[str, float]:
    """kNN (and optionally linear-probe) accuracy of ``backbone`` on frozen features."""
    train_x, train_y = evaluation.extract_features(backbone, train_loader, preprocess, accelerator)
    test_x, test_y = evaluation.extract_features(backbone, test_loader, preprocess, accelerator)
    e = cfg.eval
    results = {
        "knn_top1": evaluation.knn_accuracy(
            train_x, train_y, test_x, test_y, num_classes, k=e.knn_k, temperature=e.knn_temperature
        )
    }
    if linear and e.linear_epochs > 0:
        probe = evaluation.linear_probe(
            train_x,
            train_y,
            test_x,
            test_y,
            num_classes,
            epochs=e.linear_epochs,
            lr=e.linear_lr,
            batch_size=e.linear_batch_size,
            weight_decay=e.linear_weight_decay,
            seed=cfg.run.seed,
        )
        results.update({f"linear_{k}": v for k, v in probe.items()})
    return results


def evaluate_raw_pixels(cfg: Config, train_set, test_set, num_classes: int, linear: bool = True) -> dict[str, float]:
    """The same kNN (and optionally linear probe) on flattened pixels: what an encoder has to beat."""
    if not hasattr(train_set, "images"):
        return {}
    train_x, test_x = train_set.images.flatten(1).float() / 255, test_set.images.flatten(1).float() / 255
    e = cfg.eval
    results = {
        "knn_top1": evaluation.knn_accuracy(
            train_x, train_set.labels, test_x, test_set.labels, num_classes, k=e.knn_k, temperature=e.knn_temperature
        )
    }
    if not linear or e.linear_epochs == 0:
        return results
    probe = evaluation.linear_probe(
        train_x,
        train_set.labels,
        test_x,
        test_set.labels,
        num_classes,
        epochs=e.linear_epochs,
        lr=e.linear_lr,
        batch_size=e.linear_batch_size,
        weight_decay=e.linear_weight_decay,
        seed=cfg.run.seed,
    )
    results.update({f"linear_{k}": v for k, v in probe.items()})
    return results


def evaluate_unseen(backbone, preprocess, unseen_loader, accelerator: Accelerator) -> dict[str, float]:
    """Retrieval among classes never trained on (the CUB/Cars protocol): Recall@K, MAP@R, NMI."""
    features, labels = evaluation.extract_features(backbone, unseen_loader, preprocess, accelerator)
    return {f"unseen_{k}": v for k, v in evaluation.retrieval_metrics(features, labels).items()}


# ---------------------------------------------------------------------- builders
# The pieces a training step touches, built as train() builds them. Also used by
# tools/bench/train.py, so that the benchmark times the loop users run, not a copy of it.


def make_accelerator(cfg: Config, run_dir: Path | None = None) -> Accelerator:
    """The Accelerator of a training run; ``run_dir`` is where TensorBoard logs go (none: no trackers)."""
    return Accelerator(
        mixed_precision=cfg.train.mixed_precision,
        gradient_accumulation_steps=cfg.train.grad_accum_steps,
        log_with="tensorboard" if cfg.train.tensorboard and run_dir is not None else None,
        project_dir=str(run_dir) if run_dir is not None else None,
        # Our sampler already orders data by (seed, epoch): keep it rather than substituting Accelerate's.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=False),
        # While the backbone is frozen its parameters get no gradient; DDP must be told to expect that.
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=cfg.train.freeze_backbone_epochs > 0)],
    )


def make_train_loader(cfg: Config, train_set, local_batch: int) -> tuple[DataLoader, EpochShuffleSampler]:
    """The training loader (uint8 batches, ``local_batch`` per process) and the sampler that orders its epochs."""
    sampler = EpochShuffleSampler(len(train_set), cfg.run.seed)
    # Methods with per-sample state (NPID's memory bank) get each sample's index with its batch.
    needs_indices = getattr(methods.METHODS[cfg.method.name], "needs_indices", False)
    loader = DataLoader(
        data.WithIndices(train_set) if needs_indices else train_set,
        batch_size=local_batch,
        sampler=sampler,
        drop_last=True,
        collate_fn=data.collate_batch,
        num_workers=cfg.data.num_workers,
        persistent_workers=cfg.data.num_workers > 0,
        # Its own generator: otherwise starting an epoch's iterator draws from the global
        # RNG (worker base seed), and a resumed run would augment with shifted random numbers.
        generator=torch.Generator().manual_seed(cfg.run.seed),
    )
    return loader, sampler


def make_method(
    cfg: Config, backbone: torch.nn.Module, num_classes: int, num_samples: int, device_type: str
) -> torch.nn.Module:
    """The recipe's method around ``backbone``, with global BatchNorm and channels_last if it asks for them."""
    method = methods.build_method(cfg, backbone, num_classes, num_samples)
    if cfg.model.sync_batchnorm:  # every BatchNorm, momentum encoders included
        method = convert_sync_batchnorm(method, device_type)
    if cfg.model.channels_last:
        models.to_channels_last(method)
    return method


def make_optimizer(cfg: Config, method: torch.nn.Module) -> tuple[torch.optim.Optimizer, float]:
    """The optimizer over ``method``'s parameter groups, and the base learning rate after batch scaling."""
    lr = optim.scaled_lr(cfg.optim.lr, cfg.train.batch_size, cfg.optim.lr_scaling)
    # Per-part learning rates: backbone x backbone_lr_scale, head x head_lr_scale x what the head declares.
    lr_scales = {f"backbone.{name}": cfg.optim.backbone_lr_scale for name, _ in method.backbone.named_parameters()}
    if isinstance(getattr(method, "loss", None), torch.nn.Module):
        lr_scales.update(
            {f"loss.{name}": scale * cfg.optim.head_lr_scale for name, scale in _loss_lr_scales(method.loss).items()}
        )
    groups = optim.parameter_groups(method, cfg.optim.weight_decay, cfg.optim.exclude_bias_and_norm, lr_scales)
    optimizer = optim.build_optimizer(
        cfg.optim.name,
        groups,
        lr,
        cfg.optim.momentum,
        cfg.optim.weight_decay,
        cfg.optim.betas,
        cfg.optim.trust_coefficient,
    )
    return optimizer, lr


def prepare_for_training(accelerator: Accelerator, method: torch.nn.Module, optimizer, loader: DataLoader):
    """``accelerator.prepare`` of the three, after telling DDP which buffers it need not re-send."""
    distributed.skip_broadcast_of_replicated_buffers(
        method
    )  # MoCo's queue, NPID's bank: equal on every process already
    return accelerator.prepare(method, optimizer, loader)


def train(cfg: Config) -> dict:
    """Pretrain an encoder as ``cfg`` says; returns the final evaluation results."""
    # ------------------------------------------------------------------ set-up
    run_dir = make_run_dir(cfg)
    run_notes = checkpoint.check_run_directory(run_dir, cfg.run.resume, to_dict(cfg))  # one run per directory
    accelerator = make_accelerator(cfg, run_dir)
    # train.threads applies on any device (data and host work); the automatic count only matters on the CPU.
    on_cpu = accelerator.device.type == "cpu"
    threads, threads_source = launch.cpu_threads(cfg.train.threads) if cfg.train.threads or on_cpu else (None, "")
    set_seed(cfg.run.seed, device_specific=True)
    main = accelerator.is_main_process

    # ------------------------------------------------------------------ data
    d = cfg.data
    train_set = data.build_dataset(d.name, d.train_split, d.root, d.download, d.image_size)
    test_set = data.build_dataset(d.name, "test", d.root, d.download, d.image_size)
    info = train_set.info
    # The kNN memory and the linear probe need labels: the labelled "train" split (STL-10 may train on "unlabeled").
    memory_set = (
        train_set
        if d.train_split == "train"
        else data.build_dataset(d.name, "train", d.root, d.download, d.image_size)
    )
    unseen_set = None
    if d.holdout_classes:
        if len(set(d.holdout_classes)) >= info.num_classes:
            raise UserError(
                f"data.holdout_classes holds out all {info.num_classes} classes of {d.name}, leaving none to train on; "
                f"keep at least one class out of the list (the README's road holds out 5 of 10)"
            )
        # Train (and measure kNN / linear accuracy) on the seen classes; retrieve among the unseen ones.
        unseen_set = test_set.select_classes(d.holdout_classes, keep=True)
        train_set = train_set.select_classes(d.holdout_classes, keep=False)
        memory_set = memory_set.select_classes(d.holdout_classes, keep=False)
        test_set = test_set.select_classes(d.holdout_classes, keep=False)
    if methods.METHODS[cfg.method.name].needs_labels and bool((train_set.labels < 0).any()):
        raise UserError(
            f"method '{cfg.method.name}' needs labels but dataset '{d.name}' split '{d.train_split}' has unlabelled images; "
            f"use data.train_split=train or a self-supervised method (simclr, moco, ...)"
        )
    world = accelerator.num_processes
    if cfg.train.batch_size % world:
        raise UserError(
            f"train.batch_size {cfg.train.batch_size} must be divisible by the number of processes ({world})"
        )
    if cfg.train.batch_size > len(train_set):
        raise UserError(
            f"train.batch_size {cfg.train.batch_size} is larger than the dataset's {len(train_set)} training images; lower train.batch_size"
        )
    local_batch = cfg.train.batch_size // world
    train_loader, sampler = make_train_loader(cfg, train_set, local_batch)

    # ------------------------------------------------------------------ model, loss, optimizer
    augment = TwoViewAugment(cfg.augment, info.channels, info.mean, info.std).to(accelerator.device)
    preprocess = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize).to(
        accelerator.device
    )
    backbone = models.build_backbone(cfg.model.backbone, cfg.model.width, cfg.model.cifar_stem, augment.out_channels)
    # Before the method: MoCo copies the backbone into its momentum encoder when it is built.
    if cfg.run.init_from:
        unused = checkpoint.init_backbone(backbone, cfg.run.init_from)
        if main:
            console.print(
                f"backbone initialised from {cfg.run.init_from}"
                + (f"; keys not used: {', '.join(unused)}" if unused else "")
            )
    method = make_method(cfg, backbone, info.num_classes, len(train_set), accelerator.device.type)

    optimizer, lr = make_optimizer(cfg, method)
    if main and cfg.optim.lr_scaling != "none":
        console.print(
            f"learning rate: {cfg.optim.lr} x {cfg.optim.lr_scaling}(batch {cfg.train.batch_size} / 256) = {lr:.5g}"
        )

    # Only now, with the recipe, data, model and init_from known to be good, does the run directory appear.
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
        print_config(to_dict(cfg), f"sslkit pretrain — {run_dir}")
        if cfg.train.freeze_backbone_epochs >= cfg.train.epochs:
            run_notes.append(
                f"train.freeze_backbone_epochs={cfg.train.freeze_backbone_epochs} covers all "
                f"{cfg.train.epochs} epochs: the backbone is never trained, only what sits on it"
            )
        if on_cpu and cfg.train.mixed_precision == "fp16":
            run_notes.append(
                "train.mixed_precision=fp16 has no effect on the CPU (Accelerate runs fp32 there); "
                "train.mixed_precision=bf16 autocasts on CPUs that support it"
            )
        run_notes += [note for note in (methods.unused_options(cfg), *methods.notes(cfg, len(train_set))) if note]
        for note in run_notes:
            console.print(f"note: {note}", markup=False, highlight=False)
        console.print(
            f"{world} process{'es' if world > 1 else ''} on {accelerator.device} ({accelerator.distributed_type.value}), "
            f"{local_batch} images per process per batch, global batch {cfg.train.batch_size}"
            + (
                f", {cfg.train.grad_accum_steps} batches accumulated per step"
                if cfg.train.grad_accum_steps > 1
                else ""
            )
            + (f", {threads} CPU thread{'s' if threads > 1 else ''} per process ({threads_source})" if threads else "")
            + (
                ", BatchNorm over the global batch (model.sync_batchnorm)"
                if cfg.model.sync_batchnorm and world > 1
                else ""
            )
        )
    log = MetricsLog(run_dir / "metrics.jsonl", accelerator)

    # ------------------------------------------------------------------ prepare
    method, optimizer, train_loader = prepare_for_training(accelerator, method, optimizer, train_loader)
    # The starting weights as every process now has them: DDP has just given all of them process 0's
    # (each process built its own from a process-specific seed; a copy taken before prepare would
    # make the "random init" row score a different network on each process's share of the data).
    initial_backbone = None
    if cfg.eval.compare_random_init:
        initial_backbone = {
            k: v.detach().clone() for k, v in accelerator.unwrap_model(method).backbone.state_dict().items()
        }
    batches_per_epoch = len(train_loader)
    # Accelerate syncs at the end of the loader too, so a short last window still makes a step.
    steps_per_epoch = math.ceil(batches_per_epoch / cfg.train.grad_accum_steps)
    total_steps = cfg.train.epochs * steps_per_epoch
    if cfg.train.max_steps is not None:
        total_steps = min(total_steps, cfg.train.max_steps)
    warmup_steps = min(int(cfg.optim.warmup_epochs * steps_per_epoch), total_steps // 2)
    knn_train_loader, knn_test_loader = accelerator.prepare(
        *eval_loaders(cfg, memory_set, test_set, cfg.eval.batch_size)
    )
    unseen_loader = (
        accelerator.prepare(eval_loaders(cfg, unseen_set, unseen_set, cfg.eval.batch_size)[0]) if unseen_set else None
    )
    if cfg.train.tensorboard:
        accelerator.init_trackers(
            cfg.run.name,
            config={k: v for k, v in flatten(to_dict(cfg)).items() if isinstance(v, (int, float, str, bool))},
        )

    # ------------------------------------------------------------------ resume
    progress = LoopState()
    resume_from = checkpoint.resolve_resume(cfg.run.resume, run_dir)
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        progress = LoopState(**checkpoint.read_progress(resume_from))
        if main:
            console.print(
                f"resumed from {resume_from} at step {progress.step} (epoch {progress.epoch}, batch {progress.batch_in_epoch})"
                + (
                    f"; the run had already finished (total {total_steps} steps): evaluating it again"
                    if progress.step >= total_steps
                    else ""
                )
            )
    elif cfg.run.resume == "auto" and main:
        console.print(f"no checkpoint in {checkpoint.checkpoint_dir(run_dir)}: starting fresh")
    if main and (resume_from is not None or cfg.run.resume == "auto"):
        checkpoint.trim_metrics(run_dir, progress.step)  # lines past the checkpoint will be logged again
    last_good = resume_from

    def save() -> Path:
        # A finite loss can still be followed by an update that overflows the weights: never save those.
        if not all(bool(torch.isfinite(p).all()) for p in method.parameters()):
            where = f"last good checkpoint: {last_good}" if last_good else "no checkpoint was written yet"
            raise UserError(
                f"the weights became non-finite at step {progress.step} (epoch {progress.epoch}); training stopped, {where}; "
                f"try a lower optim.lr or train.mixed_precision=no"
            )
        return checkpoint.save_checkpoint(accelerator, run_dir, vars(progress), cfg.train.keep_checkpoints)

    # ------------------------------------------------------------------ epochs
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
    task = bar.add_task(
        "train", total=total_steps, completed=progress.step, epoch=progress.epoch, loss=float("nan"), lr=0.0, ips=0.0
    )
    method.train()
    unwrapped = accelerator.unwrap_model(method)
    with bar:
        while progress.step < total_steps and progress.epoch < cfg.train.epochs:
            loader = (
                accelerator.skip_first_batches(train_loader, progress.batch_in_epoch)
                if progress.batch_in_epoch
                else train_loader
            )
            # Accelerate's loader counts its own iterations and passes that count to the sampler as
            # the epoch when iteration starts; after a resume the count would be wrong, so set it.
            loader.set_epoch(progress.epoch)
            sampler.set_epoch(progress.epoch)
            unwrapped.backbone_frozen = progress.epoch < cfg.train.freeze_backbone_epochs
            # A window's loss and speed count its batches, not steps x grad_accum_steps: the last step of
            # an epoch may accumulate fewer batches than that (Accelerate steps at the loader's end).
            window_start, data_wait, window_steps, window_batches, window_loss = time.perf_counter(), 0.0, 0, 0, 0.0
            fetch_start = time.perf_counter()
            for images, labels, *indices in loader:
                data_wait += time.perf_counter() - fetch_start
                progress.batch_in_epoch += 1
                with accelerator.accumulate(method):
                    with torch.no_grad():
                        view1, view2 = augment(images)
                    with accelerator.autocast():
                        loss = method(view1, view2, labels, *indices)
                    # One host sync per step: the price of never stepping on a NaN (all processes agree).
                    loss_value = accelerator.reduce(loss.detach().float(), reduction="mean").item()
                    if not math.isfinite(loss_value):
                        where = f"last good checkpoint: {last_good}" if last_good else "no checkpoint was written yet"
                        raise UserError(
                            f"loss became {loss_value} at step {progress.step} (epoch {progress.epoch}); training stopped, {where}; "
                            f"try a lower optim.lr, a higher loss temperature, or train.mixed_precision=no"
                        )
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        optim.set_learning_rate(
                            optimizer,
                            optim.cosine_lr(progress.step, total_steps, lr, warmup_steps, cfg.optim.min_lr_ratio),
                        )
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                window_loss += loss_value
                window_batches += 1
                if not accelerator.sync_gradients:
                    fetch_start = time.perf_counter()
                    continue
                # Methods with state outside the optimizer (MoCo's momentum encoder) update it here.
                if hasattr(unwrapped, "after_optimizer_step"):
                    unwrapped.after_optimizer_step(progress.step, total_steps)
                progress.step += 1
                window_steps += 1
                if progress.step % cfg.train.log_every_steps == 0 or progress.step == total_steps:
                    elapsed = time.perf_counter() - window_start
                    record = {
                        "step": progress.step,
                        "epoch": progress.epoch,
                        "loss": window_loss / window_batches,
                        "lr": optimizer.param_groups[0]["lr"] / optimizer.param_groups[0].get("lr_scale", 1.0),
                        "images_per_s": window_batches * cfg.train.batch_size / elapsed,
                        "data_wait_share": data_wait / elapsed,
                    }
                    log(record, progress.step)
                    bar.update(
                        task,
                        completed=progress.step,
                        epoch=progress.epoch,
                        loss=record["loss"],
                        lr=record["lr"],
                        ips=record["images_per_s"],
                    )
                    if main and not console.is_terminal:  # a log file gets a line where a terminal gets the live bar
                        console.print(
                            f"step {progress.step}/{total_steps}  epoch {progress.epoch}  loss {record['loss']:.4f}  "
                            f"lr {record['lr']:.3g}  {record['images_per_s']:.0f} img/s  data wait {record['data_wait_share']:.1%}"
                        )
                    window_start, data_wait, window_steps, window_batches, window_loss = (
                        time.perf_counter(),
                        0.0,
                        0,
                        0,
                        0.0,
                    )
                else:
                    bar.update(task, completed=progress.step)
                if cfg.train.checkpoint_every_steps and progress.step % cfg.train.checkpoint_every_steps == 0:
                    last_good = save()
                if progress.step >= total_steps:
                    if progress.batch_in_epoch == batches_per_epoch:  # the last step also ended its epoch: count it
                        progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
                    break
                fetch_start = time.perf_counter()
            else:
                # The epoch ran to its end: the next one starts at its first batch.
                progress.epoch += 1
                progress.batch_in_epoch = 0
                bar.update(task, epoch=progress.epoch)
                if (
                    cfg.train.knn_every_epochs
                    and progress.epoch % cfg.train.knn_every_epochs == 0
                    and progress.epoch < cfg.train.epochs
                ):
                    knn = evaluate_backbone(
                        unwrapped.backbone,
                        cfg,
                        preprocess,
                        knn_train_loader,
                        knn_test_loader,
                        info.num_classes,
                        accelerator,
                        linear=False,
                    )
                    method.train()
                    log({"step": progress.step, "epoch": progress.epoch, **knn}, progress.step)
                    if main:
                        bar.console.print(f"epoch {progress.epoch}: kNN top-1 {knn['knn_top1']:.4f}")
                if progress.epoch % cfg.train.checkpoint_every_epochs == 0 or progress.epoch == cfg.train.epochs:
                    last_good = save()
                continue
            break  # max_steps reached mid-epoch

    # ------------------------------------------------------------------ export, evaluate
    if last_good is None or checkpoint.read_progress(last_good)["step"] != progress.step:
        last_good = save()
    if main:
        checkpoint.export_backbone(unwrapped.backbone, run_dir / "backbone.safetensors")
    results = {
        "trained": evaluate_backbone(
            unwrapped.backbone, cfg, preprocess, knn_train_loader, knn_test_loader, info.num_classes, accelerator
        )
    }
    if unseen_loader is not None:
        results["trained"].update(evaluate_unseen(unwrapped.backbone, preprocess, unseen_loader, accelerator))
    if initial_backbone is not None:
        random_init = models.build_backbone(
            cfg.model.backbone, cfg.model.width, cfg.model.cifar_stem, augment.out_channels
        )
        random_init.load_state_dict(initial_backbone)
        start_row = "start (init_from)" if cfg.run.init_from else "random init"
        results[start_row] = evaluate_backbone(
            random_init.to(accelerator.device),
            cfg,
            preprocess,
            knn_train_loader,
            knn_test_loader,
            info.num_classes,
            accelerator,
        )
        if unseen_loader is not None:
            results[start_row].update(evaluate_unseen(random_init, preprocess, unseen_loader, accelerator))
    if cfg.eval.compare_raw_pixels:
        results["raw pixels"] = evaluate_raw_pixels(cfg, memory_set, test_set, info.num_classes)
    log(
        {"step": progress.step, "epoch": progress.epoch, **{f"final_{k}": v for k, v in results["trained"].items()}},
        progress.step,
    )
    if main:
        (run_dir / "results.json").write_text(
            json.dumps(
                {
                    "results": results,
                    "step": progress.step,
                    "checkpoint": str(last_good),
                    "backbone": str(run_dir / "backbone.safetensors"),
                },
                indent=2,
            )
        )
        console.print(
            results_table(results, f"{cfg.run.name}: {d.name}, {cfg.model.backbone} (width {cfg.model.width})")
        )
        report = write_report(run_dir)
        console.print(
            f"run directory: {run_dir}  (report: {report.name}; backbone.safetensors, checkpoints/, metrics.jsonl, config.yaml, results.json)"
        )
    accelerator.end_training()
    return results


def _loss_lr_scales(loss: torch.nn.Module) -> dict[str, float]:
    """Per-parameter lr multipliers a head declares through ``param_groups()`` (e.g. proxies at 100x)."""
    if not hasattr(loss, "param_groups"):
        return {}
    names = {id(p): n for n, p in loss.named_parameters()}
    return {names[id(p)]: float(g.get("lr_scale", 1.0)) for g in loss.param_groups() for p in g["params"]}
