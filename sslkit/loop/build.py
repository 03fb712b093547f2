"""The pieces of a training run, built as :func:`sslkit.loop.train` builds them.

Also used by ``tools/bench/``, so that the benchmarks time the loop users run, not a copy of it.
"""

from __future__ import annotations

import atexit
import functools
import signal
import weakref
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs
from torch.utils.data import DataLoader, Sampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from sslkit import distributed, methods, models, optim
from sslkit.augment import TwoViewAugment
from sslkit.config import Config
from sslkit.console import console
from sslkit.datasets import DatasetInfo, Splits, WithIndices, collate_batch, shards
from sslkit.datasets.augmented import Augment, AugmentInWorkers
from sslkit.datasets.samplers import KeyedBatchSampler
from sslkit.errors import UserError
from sslkit.loop.signals import signal_of
from sslkit.losses.partial_fc import keep_optimizer_state_in_class_order
from sslkit.models import weights
from sslkit.models.sync_batchnorm import convert_sync_batchnorm


def make_run_dir(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


def make_accelerator(cfg: Config, run_dir: Path | None = None) -> Accelerator:
    """The Accelerator of a training run; ``run_dir`` is where trackers write (none: no trackers)."""
    t = cfg.train
    return Accelerator(
        cpu=distributed.cpu_processes_launched(),
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
        raise UserError(
            f"train.batch_size {batch} must be divisible by the number of processes ({world}); launch a number of "
            f"processes that divides it (a resumed run keeps its global batch) or change train.batch_size"
        )
    if batch > len(splits.train):
        raise UserError(
            f"train.batch_size {batch} is larger than the dataset's {len(splits.train)} training images; "
            f"lower train.batch_size"
        )
    return batch // world


def make_augment(cfg: Config, info: DatasetInfo) -> TwoViewAugment:
    """The training views the method asks for (:meth:`~sslkit.methods.base.Method.training_views`)."""
    return methods.METHODS[cfg.method.name].training_views(cfg, info)


def make_train_loader(
    cfg: Config, train_set, local_batch: int, augment: Augment | None = None
) -> tuple[DataLoader, Sampler]:
    """The training loader (``local_batch`` per process) and its batch sampler, whose ``set_epoch`` orders each epoch.

    Batches are uint8 images, or with ``augment`` (``data.augment_in_workers``) their views, made
    where the batch is loaded (:mod:`sslkit.datasets.augmented`), in the order the method draws them
    (:meth:`~sslkit.methods.base.Method.training_batches`).
    """
    method = methods.METHODS[cfg.method.name]
    if isinstance(train_set, shards.ShardStream):  # tar shards: the stream splits and orders its own epochs
        if not method.can_stream_shards:
            raise UserError(
                f"method '{cfg.method.name}' draws images by index, which streamed shards cannot; "
                f"write the images to a folder (data.name=imagefolder)"
            )
        loader = shards.stream_loader(train_set, local_batch, cfg.data.num_workers, cfg.run.seed, augment)
        return loader, loader
    batches = method.training_batches(cfg, train_set.labels, local_batch)
    batches = KeyedBatchSampler(batches) if augment is not None else batches
    # Methods with per-sample state (NPID's memory bank) get each sample's index with its batch.
    dataset = WithIndices(train_set) if method.needs_indices else train_set
    if augment is not None:
        dataset = AugmentInWorkers(dataset, augment, cfg.run.seed)
    loader = DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate_batch,
        num_workers=cfg.data.num_workers,
        persistent_workers=cfg.data.num_workers > 0,
        # A preemption signal sent to every process must not kill a worker mid-epoch: the run stops at a step
        # boundary (sslkit.loop.signals) and shuts the workers down itself (stop_workers_before_exit).
        worker_init_fn=functools.partial(ignore_signals, tuple(cfg.train.stop_signals)),
        # Its own generator: otherwise starting an epoch's iterator draws from the global
        # RNG (worker base seed), and a resumed run would augment with shifted random numbers.
        generator=torch.Generator().manual_seed(cfg.run.seed),
    )
    return loader, batches


def ignore_signals(names: tuple[str, ...], worker_id: int = 0) -> None:
    """A loader worker's start: ``names`` (``train.stop_signals``) are the main process's to act on."""
    for name in names:
        signal.signal(signal_of(name), signal.SIG_IGN)


def stop_workers_before_exit(loader: DataLoader) -> None:
    """Shut ``loader``'s persistent workers down when the interpreter exits, before multiprocessing's own exit
    handler would: that one stops daemonic children with SIGTERM, which the workers ignore (:func:`ignore_signals`),
    and would then wait for them forever. atexit runs last-registered first, and multiprocessing registered its
    handler when it was imported. The shutdown is the DataLoader's own (its iterator's ``_shutdown_workers``:
    torch has no public call that stops persistent workers)."""
    reference = weakref.ref(loader)

    def shut_down() -> None:
        iterator = loader._iterator if (loader := reference()) is not None else None
        if isinstance(iterator, _MultiProcessingDataLoaderIter):
            iterator._shutdown_workers()

    atexit.register(shut_down)


def make_backbone(cfg: Config, in_channels: int, main: bool) -> torch.nn.Module:
    """The recipe's backbone, with ``run.init_from``'s weights when it names a run."""
    backbone = models.backbone_from_config(cfg.model, in_channels)
    if cfg.run.init_from:
        unused = weights.init_backbone(backbone, cfg.run.init_from)
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
    # Per-part learning rates of the network the optimizer trains: backbone x backbone_lr_scale, head x head_lr_scale
    # x what the head declares (and, with optim.layer_decay, each backbone layer below the top at layer_decay per
    # layer). Named as the method names them: the trained network may be a part of it beside the evaluated one.
    backbone, head = method.trained_backbone(), method.trained_head()
    try:
        layers = optim.layer_decay_scales(backbone, o.layer_decay)
    except ValueError as error:
        raise UserError(f"optim.layer_decay={o.layer_decay}: {error}; set optim.layer_decay=1") from None
    in_method = _names_in(method, backbone)
    lr_scales = {in_method[name]: o.backbone_lr_scale * layers.get(name, 1.0) for name in in_method}
    if head is not None:
        head_in_method = _names_in(method, head)
        head_scales = _loss_lr_scales(head)
        lr_scales.update({head_in_method[name]: scale * o.head_lr_scale for name, scale in head_scales.items()})
    no_decay = {in_method[name] for name in optim.model_no_weight_decay(backbone)}
    groups = optim.parameter_groups(method, o.weight_decay, o.exclude_bias_and_norm, lr_scales, no_decay)
    optimizer = optim.build_optimizer(o.name, groups, lr, o.momentum, o.weight_decay, o.betas, o.trust_coefficient)
    # Partial FC heads hold a block of classes per process: their optimizer state is saved whole, in class order.
    keep_optimizer_state_in_class_order(method, optimizer)
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


def _names_in(method: torch.nn.Module, part: torch.nn.Module) -> dict[str, str]:
    """``{name in part: name in method}`` of every parameter of ``part``, a submodule of ``method``."""
    in_method = {id(param): name for name, param in method.named_parameters()}
    return {name: in_method[id(param)] for name, param in part.named_parameters()}


def _loss_lr_scales(loss: torch.nn.Module) -> dict[str, float]:
    """Per-parameter lr multipliers a head declares through ``param_groups()`` (e.g. proxies at 100x)."""
    if not hasattr(loss, "param_groups"):
        return {}
    names = {id(p): n for n, p in loss.named_parameters()}
    return {names[id(p)]: float(g.get("lr_scale", 1.0)) for g in loss.param_groups() for p in g["params"]}
