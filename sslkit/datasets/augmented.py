"""Augmentation in the loader workers (``data.augment_in_workers``): each batch leaves a worker as its views.

Otherwise a batch reaches the accelerator as uint8 and the training process augments it there
(:mod:`sslkit.augment`), which is right for a GPU. When the device is the CPU, that puts the crops
and the colour steps on the training process's threads while the loader workers only decode;
with the workers augmenting too, the decode and the augmentation of every batch run in parallel
with the training step, one worker per batch.

The views must not depend on the number of workers nor on where a run was interrupted, so a
worker does not draw from its own RNG stream. Each batch is augmented under a generator seeded by
``(run seed, epoch, the batch's place in the epoch)`` (:func:`batch_seed`): the place is the
position of the batch's first sample in the epoch's order, which every process draws alike
(:mod:`sslkit.datasets.samplers`), so it names the batch among all processes' batches. The
batch sampler tells the workers that place: :class:`~sslkit.datasets.samplers.KeyedBatchSampler`
yields a :class:`SampleKey` per sample instead of a bare index, and :class:`AugmentInWorkers` reads
the keys of a batch, fetches its images from the dataset it wraps and augments them. A resumed run skips whole batches
(Accelerate's ``skip_first_batches``), so the batches after the resume point get the keys, and
the views, of an uninterrupted run. Tar shards name their batches themselves
(:mod:`sslkit.datasets.shards`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch.utils.data import Dataset

from sslkit.datasets.batches import AugmentedViews, EncodedBatch, ImageBatch

Augment = Callable[[torch.Tensor | ImageBatch], tuple[torch.Tensor, ...]]


def in_workers(setting: bool | str, device: torch.device, num_workers: int) -> bool:
    """Whether the loader augments: ``data.augment_in_workers``, with ``auto`` resolved for ``device``.

    ``auto`` augments in the workers on a CPU device when there are workers (``data.num_workers``
    > 0). With none, the training process augments either way, so ``auto`` leaves it drawing from
    its own RNG, as ``false`` does.
    """
    if setting == "auto":
        return device.type == "cpu" and num_workers > 0
    return bool(setting)


def batch_seed(seed: int, epoch: int, place: int) -> int:
    """The seed that augments batch ``place`` of ``epoch``: a hash, so nearby triples draw unrelated streams."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{place}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def augment_batch(augment: Augment, images: torch.Tensor | ImageBatch | EncodedBatch, seed: int) -> AugmentedViews:
    """``augment(images)`` with every random draw from a generator seeded by ``seed``.

    The process's own RNG is left as it was: with ``data.num_workers=0`` this runs in the training process.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        views = augment(images)
    corrupt = images.corrupt if isinstance(images, (ImageBatch, EncodedBatch)) else ()
    return AugmentedViews(tuple(views), corrupt)


class SampleKey(NamedTuple):
    """A sample as :class:`~sslkit.datasets.samplers.KeyedBatchSampler` hands it to the loader: its index and
    its place in the epoch."""

    index: int
    epoch: int
    position: int  # in the epoch's order, counted over every process's samples


class AugmentInWorkers(Dataset):
    """``dataset``'s batches, augmented where they are fetched (a loader worker) from :class:`SampleKey` s.

    Args:
        dataset: what the batches come from; its ``__getitems__`` returns ``(images, labels, ...)``.
        augment: the run's augmentation on the CPU (:class:`sslkit.augment.TwoViewAugment`).
        seed: the run's seed (:func:`batch_seed`).

    Shape:
        returns: ``(AugmentedViews, labels, ...)``, the views (B, C, S, S) float32.
    """

    def __init__(self, dataset: Dataset, augment: Augment, seed: int) -> None:
        self.dataset, self.augment, self.seed = dataset, augment, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, keys: Sequence[SampleKey]):
        images, *rest = self.dataset.__getitems__([key.index for key in keys])
        first = keys[0]
        return (augment_batch(self.augment, images, batch_seed(self.seed, first.epoch, first.position)), *rest)
