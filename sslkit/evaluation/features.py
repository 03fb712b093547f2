"""Run a frozen encoder over a loader once and keep its features on the CPU.

kNN, the linear probe and retrieval all work on these cached features, so the encoder runs
once per evaluation, whatever is computed afterwards.

Across processes every sample must count exactly once: a sharded loader pads its shards to
equal length by repeating samples, so a naive gather would count those twice and skew the
metrics.
Three kinds of loader are handled:

- prepared by ``accelerator.prepare``: ``accelerator.gather_for_metrics`` drops the padding
  of the last batch (accelerate knows how much it added);
- with a ``torch.utils.data.DistributedSampler`` (not prepared): accelerate knows nothing of
  its padding, so each batch is gathered with the dataset indices the sampler drew, and the
  repeats are dropped by index; the result comes back in dataset order;
- anything else: every process already iterates the whole dataset, so nothing is gathered.

Every process returns the same, complete features.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn
from torch.utils.data import DistributedSampler

from sslkit import distributed

# Shorter loaders finish before a progress bar would tell anyone anything.
PROGRESS_MIN_BATCHES = 20


def _is_prepared(loader: Iterable) -> bool:
    """True for a loader returned by ``accelerator.prepare`` (DataLoaderShard or DataLoaderDispatcher)."""
    if "accelerate.data_loader" not in sys.modules:
        return False  # nothing can have prepared it, and importing accelerate takes seconds
    from accelerate.data_loader import DataLoaderStateMixin

    return isinstance(loader, DataLoaderStateMixin)


def _distributed_sampler(loader: Iterable) -> DistributedSampler | None:
    """The DistributedSampler behind ``loader``, looking through accelerate's batch-sampler wrappers."""
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        return sampler
    batch_sampler = getattr(loader, "batch_sampler", None)
    while batch_sampler is not None:
        if isinstance(getattr(batch_sampler, "sampler", None), DistributedSampler):
            return batch_sampler.sampler
        batch_sampler = getattr(batch_sampler, "batch_sampler", None)
    return None


def _device_of(encoder: nn.Module, accelerator) -> torch.device:
    if accelerator is not None:
        return accelerator.device
    parameter = next(encoder.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _first_occurrences(indices: torch.Tensor) -> torch.Tensor:
    """Positions of the first occurrence of each distinct value of ``indices``, by increasing value.

    Shape:
        indices: (T,) integer; returns: (U,) positions into ``indices``, U distinct values.
    """
    distinct, inverse = torch.unique(indices, return_inverse=True)
    positions = torch.arange(indices.numel(), device=indices.device)
    first = torch.full((distinct.numel(),), indices.numel(), dtype=torch.long, device=indices.device)
    return first.scatter_reduce_(0, inverse, positions, reduce="amin")


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("extracting features"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        transient=True,  # the bar disappears when done: logs keep only the results
        disable=not enabled,
    )


@torch.no_grad()
def extract_features(
    encoder: nn.Module,
    loader: Iterable,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    accelerator=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode every sample of ``loader`` once, in eval mode, and return features and labels.

    The encoder is switched to eval mode (batch norm uses its running statistics) and every
    submodule gets its own previous mode back afterwards, so a caller that froze part of it
    keeps it frozen. ``torch.no_grad`` rather than ``inference_mode``: the linear probe trains
    on the returned features, and autograd refuses inference tensors.

    Args:
        encoder: maps a preprocessed batch to features (a backbone, or backbone + projector).
        loader: yields ``(images, labels)``; see the module docstring for sharded loaders.
        preprocess: maps a uint8 batch on the device to the encoder's float input
            (e.g. scale to [0, 1] and normalise with the dataset's mean and std).
        accelerator: an ``accelerate.Accelerator`` when running in several processes; None
            for one process (a DistributedSampler loader is still handled through
            :mod:`sslkit.distributed`).

    Shape:
        images: (B, C, H, W) uint8 (or a batch of images of different sizes, :mod:`sslkit.datasets.batches`,
        which ``preprocess`` crops); labels: (B,)
        returns: features (N, D) float32 and labels (N,) int64, both on the CPU, N the
        number of distinct samples the loader visits over all processes.
    """
    device = _device_of(encoder, accelerator)
    num_processes = accelerator.num_processes if accelerator is not None else distributed.world_size()
    is_main = accelerator.is_main_process if accelerator is not None else distributed.rank() == 0
    sampler = _distributed_sampler(loader)
    if _is_prepared(loader) and num_processes > 1:
        if accelerator is None:
            raise ValueError(
                "accelerator: a loader prepared by accelerate needs its accelerator to gather the features"
            )
        if sampler is not None:
            raise ValueError(
                "loader: prepared by accelerate and also built with a DistributedSampler, so each process sees only "
                "1/world_size of its shard; give accelerator.prepare the plain loader, or do not prepare it"
            )
    prepared = _is_prepared(loader) and accelerator is not None
    # The indices the sampler hands this process, in order (iterating it again yields the same
    # order: it depends only on its seed and epoch).
    sampled_indices = (
        torch.tensor(list(iter(sampler)), dtype=torch.long) if sampler is not None and not prepared else None
    )
    gather = accelerator.gather if accelerator is not None else distributed.gather_no_grad

    modes = {module: module.training for module in encoder.modules()}
    encoder.eval()
    features, labels, indices = [], [], []
    try:
        total = len(loader) if hasattr(loader, "__len__") else None
        with _progress(enabled=is_main and (total is None or total > PROGRESS_MIN_BATCHES)) as progress:
            task = progress.add_task("extract", total=total)
            seen = 0  # samples this process has taken from the sampler so far
            for images, batch_labels in loader:
                batch_features = encoder(preprocess(images.to(device))).float()  # (B, D)
                batch_labels = batch_labels.to(device=device, dtype=torch.long)  # (B,)
                if prepared:
                    batch_features, batch_labels = accelerator.gather_for_metrics((batch_features, batch_labels))
                elif sampled_indices is not None:
                    batch_indices = sampled_indices[seen : seen + len(batch_labels)].to(device)
                    seen += len(batch_labels)
                    batch_features, batch_labels, batch_indices = (
                        gather(t) for t in (batch_features, batch_labels, batch_indices)
                    )
                    indices.append(batch_indices.cpu())
                features.append(batch_features.cpu())
                labels.append(batch_labels.cpu())
                progress.advance(task)
    finally:
        for module, was_training in modes.items():
            module.train(was_training)

    if not features:
        raise ValueError("loader: yielded no batches, so there are no features to evaluate")
    features = torch.cat(features)  # (T, D), T >= N when a sampler repeated samples
    labels = torch.cat(labels)  # (T,)
    if indices:
        keep = _first_occurrences(torch.cat(indices))  # (N,), in dataset order
        features, labels = features[keep], labels[keep]
    return features, labels
