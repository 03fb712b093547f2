"""Tar shards (the webdataset format) streamed across processes and loader workers, each sample once an epoch.

``data.name=webdataset data.root=PATTERN`` reads the shards the webdataset package writes
(``sslkit-write-shards`` makes them from an image folder): tar files in which the members
``<key>.jpg`` (or ``.png``, ``.webp``, ...) are the samples. ``PATTERN`` is a brace pattern
(``shards/train-{000000..000015}.tar``), several joined by ``::``, or a folder of ``.tar`` files.
The samples are unlabelled; evaluation uses ``eval.data``.

How an epoch is split (:meth:`ShardStream.plan`): the shards are put in an order drawn from
``(seed, epoch)``, and shard ``k`` of that order goes to slot ``k mod P``, one slot per loader
worker of every process (``P = processes x workers``). Each slot streams its shards through a
webdataset shuffle buffer seeded by ``(seed, epoch, slot)`` and cuts batches of the per-process
batch size; the DataLoader takes the workers' batches in turn. Every slot yields the same number
of batches, the most that the slot with the fewest samples can fill whatever the order, so every
process takes the same number of steps (DDP needs that). The samples are read once an epoch:

- all of them when the shards hold equal numbers of samples, the shard count is a multiple of ``P``
  and each slot's share is a multiple of the batch size (``sslkit-write-shards --per-shard``);
- otherwise the samples past a slot's last full batch are skipped that epoch (a different set
  each epoch, since the order changes); the run's set-up line says how many.

Resume is exact: batch ``j`` of an epoch is batch ``j // W`` of worker ``j mod W``, so a run resumed
after ``b`` batches has each worker pass over its first batches without decoding them, and
continues with the same batches, in the same order, as a run that never stopped.

The workers decode the images, or only read their bytes when they are decoded on a CUDA
accelerator (``data.decode``, :mod:`sslkit.datasets.decode`). With ``data.augment_in_workers`` they also
augment each batch, seeded by ``(seed, epoch, slot, batch of the slot)``
(:mod:`sslkit.datasets.augmented`), so a resumed run sees the same views.

The number of samples in each shard is counted from the tar headers when the dataset is built
(no image is decoded), so the shards must be local files.

>>> stream = shard_stream("/nonexistent/train-{0..3}.tar")  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
sslkit.errors.UserError: webdataset: no shard matches /nonexistent/train-{0..3}.tar
"""

from __future__ import annotations

import importlib.util
import random
import tarfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from sslkit.datasets.augmented import Augment, augment_batch, batch_seed
from sslkit.datasets.base import IMAGENET_MEAN, IMAGENET_STD, DatasetInfo, collate_batch
from sslkit.datasets.batches import EncodedBatch, ImageBatch, pad_images
from sslkit.datasets.decode import decode_rgb
from sslkit.datasets.folders import IMAGE_EXTENSIONS
from sslkit.errors import UserError, install_hint

SHUFFLE_BUFFER = 1000  # samples held by each slot's shuffle buffer (webdataset's default)
_EXTENSIONS = tuple(extension.lstrip(".") for extension in IMAGE_EXTENSIONS)


def _webdataset():
    if importlib.util.find_spec("webdataset") is None:
        raise UserError(f"data.name=webdataset needs the webdataset package: {install_hint('shards')}")
    import webdataset

    return webdataset


def expand_shards(pattern: str) -> list[str]:
    """The shard files ``pattern`` names: brace pattern(s) joined by ``::``, or a folder of ``.tar`` files."""
    if Path(pattern).expanduser().is_dir():
        return [str(path) for path in sorted(Path(pattern).expanduser().glob("*.tar"))]
    return [str(Path(url).expanduser()) for url in _webdataset().shardlists.expand_urls(pattern)]


def _key_and_extension(name: str) -> tuple[str, str]:
    """webdataset's split of a member name: the key up to the first dot of the base name, then the extension."""
    folder, _, base = name.rpartition("/")
    stem, _, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def _image_member(sample: dict) -> str | None:
    """The key of a sample's image member (``jpg``, ``PNG``, ...), None if it has none."""
    return next((key for key in sample if key.lower() in _EXTENSIONS), None)


def count_samples(path: str) -> int:
    """Samples (keys with an image member) in a tar shard, from its headers alone."""
    try:
        with tarfile.open(path) as tar:
            keys = {
                _key_and_extension(m.name)[0]
                for m in tar
                if m.isfile() and _key_and_extension(m.name)[1] in _EXTENSIONS
            }
    except (OSError, tarfile.TarError, EOFError) as error:
        raise UserError(f"webdataset: cannot read shard {path} ({error}); replace it with an intact copy") from None
    return len(keys)


class ShardStream(IterableDataset):
    """Unlabelled images streamed from tar shards, split over processes and workers (see the module doc).

    Call :meth:`configure` before iterating (the loader built by :func:`stream_loader` does).

    Args:
        shards: the tar files.
        counts: samples in each shard.
        max_size: the longest side kept at decode; None keeps each image's size.
    """

    reads_files = True

    def __init__(self, shards: list[str], counts: list[int], max_size: int | None = None) -> None:
        self.shards, self.counts, self.max_size = list(shards), list(counts), max_size
        self.labels = torch.full((sum(counts),), -1, dtype=torch.int64)
        self.info = DatasetInfo(3, 0, 0, IMAGENET_MEAN, IMAGENET_STD)
        self.classes: list[str] = []
        self.batch_size, self.rank, self.world, self.workers, self.seed = 1, 0, 1, 1, 0
        self.epoch, self.skip = 0, 0
        self.decode_on_device = False  # set by sslkit.datasets.folders.prepare_training_set on a CUDA device
        self.augment: Augment | None = None  # data.augment_in_workers: the readers augment each batch

    def __len__(self) -> int:
        return len(self.labels)

    def configure(self, batch_size: int, rank: int, world: int, workers: int, seed: int) -> None:
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.world, self.workers = rank, world, max(1, workers)  # 0 workers: the process reads
        if self.batches_per_worker() < 1:
            raise UserError(
                f"webdataset: {len(self.shards)} shards of {min(self.counts)} to {max(self.counts)} samples cannot "
                f"give each of the {self.world * self.workers} readers (processes x data.num_workers) a batch of "
                f"{batch_size}; write more or larger shards, or lower train.batch_size or data.num_workers"
            )

    @property
    def slots(self) -> int:
        return self.world * self.workers

    def batches_per_worker(self) -> int:
        """Batches every slot yields an epoch: what the slot with the fewest samples fills, for any order."""
        fewest_shards = len(self.shards) // self.slots
        smallest = sum(sorted(self.counts)[:fewest_shards])
        return smallest // self.batch_size

    def plan(self, epoch: int, slot: int) -> list[str]:
        """The shards ``slot`` reads in ``epoch``: every P-th of an order drawn from ``(seed, epoch)``."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(len(self.shards), generator=generator).tolist()
        return [self.shards[k] for k in order[slot :: self.slots]]

    def _samples(self, slot: int) -> Iterator[dict]:
        wds = _webdataset()
        sources = [{"url": url} for url in self.plan(self.epoch, slot)]
        samples = wds.tarfile_to_samples()(iter(sources))
        samples = (sample for sample in samples if _image_member(sample) is not None)  # as count_samples counts
        rng = random.Random(f"{self.seed}-{self.epoch}-{slot}")
        return wds.shuffle(bufsize=SHUFFLE_BUFFER, initial=SHUFFLE_BUFFER, rng=rng)(samples)

    @staticmethod
    def _encoded(sample: dict) -> tuple[torch.Tensor, str]:
        """A sample's image bytes and its name, ``shard:key``."""
        name = f"{sample.get('__url__', '?')}:{sample['__key__']}"
        return torch.frombuffer(bytearray(sample[_image_member(sample)]), dtype=torch.uint8), name

    def _batch(self, samples: list[dict]) -> tuple[ImageBatch | EncodedBatch, torch.Tensor]:
        labels = torch.full((len(samples),), -1, dtype=torch.int64)
        encoded = [self._encoded(sample) for sample in samples]
        if self.decode_on_device:
            return EncodedBatch([data for data, _ in encoded], [name for _, name in encoded], self.max_size), labels
        decoded = [(decode_rgb(data, self.max_size), name) for data, name in encoded]
        good = [image for image, _ in decoded if image is not None]
        if not good:
            raise UserError(f"webdataset: no image of a batch could be decoded, e.g. {decoded[0][1]}")
        corrupt = tuple(name for image, name in decoded if image is None)
        # A corrupt sample is replaced by the batch's previous good image (its first, at the start).
        images, last = [], good[0]
        for image, _ in decoded:
            last = image if image is not None else last
            images.append(last)
        pixels, sizes = pad_images(images)
        return ImageBatch(pixels, sizes, corrupt), labels

    def _augmented(self, batch: tuple[ImageBatch | EncodedBatch, torch.Tensor], place: int):
        """``batch``, or with :attr:`augment` its views, seeded by the batch's place among the epoch's batches."""
        if self.augment is None:
            return batch
        images, labels = batch
        return augment_batch(self.augment, images, batch_seed(self.seed, self.epoch, place)), labels

    def __iter__(self):
        info = get_worker_info()
        worker = info.id if info is not None else 0
        # Batch j of an epoch comes from reader j mod W. The DataLoader asks its workers in turn from worker 0,
        # so after `skip` batches worker w plays reader (skip + w) mod W, which made ceil((skip - reader) / W) of them.
        reader = (self.skip + worker) % self.workers
        slot = self.rank * self.workers + reader
        done = max(0, -(-(self.skip - reader) // self.workers))
        batch: list[dict] = []
        made = 0
        for sample in self._samples(slot):
            batch.append(sample)
            if len(batch) < self.batch_size:
                continue
            if made >= done:  # the batches before a resume point are read, not decoded
                yield self._augmented(self._batch(batch), slot * self.batches_per_worker() + made)
            batch, made = [], made + 1
            if made == self.batches_per_worker():
                return
        raise UserError(
            f"webdataset: the shards of reader {slot} ended after {made} batches, before the "
            f"{self.batches_per_worker()} their headers promised; a shard changed while reading: rerun"
        )


class StreamLoader:
    """The training loader over a :class:`ShardStream`: ``len`` batches an epoch, on the accelerator's device.

    Not prepared by Accelerate: the stream already splits the shards between processes (Accelerate
    would instead read every batch in process 0 and dispatch it). :meth:`epoch` starts an epoch,
    optionally after its first ``skip`` batches (resume).
    """

    def __init__(self, stream: ShardStream, num_workers: int, device: torch.device) -> None:
        self.stream, self.device = stream, device
        self.loader = DataLoader(
            stream, batch_size=None, num_workers=num_workers, collate_fn=collate_batch, persistent_workers=False
        )

    def __len__(self) -> int:
        return self.stream.workers * self.stream.batches_per_worker()

    def epoch(self, epoch: int, skip: int = 0) -> Iterator:
        """The batches of ``epoch`` after its first ``skip``, moved to the device."""
        self.stream.epoch, self.stream.skip = epoch, skip  # copied into the workers when iteration starts
        for images, labels in self.loader:
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def set_epoch(self, epoch: int) -> None:
        self.stream.epoch = epoch


def stream_loader(
    stream: ShardStream, batch_size: int, num_workers: int, seed: int, augment: Augment | None = None
) -> StreamLoader:
    """The loader of this process's share of ``stream`` (rank, world and device from Accelerate's state);
    with ``augment``, its readers augment each batch (:mod:`sslkit.datasets.augmented`)."""
    from accelerate import PartialState

    state = PartialState()
    stream.configure(batch_size, state.process_index, state.num_processes, num_workers, seed)
    stream.augment = augment
    loader = StreamLoader(stream, num_workers, state.device)
    skipped = len(stream) - state.num_processes * len(loader) * batch_size
    if skipped and state.is_main_process:
        from sslkit.console import console

        console.print(
            f"note: {skipped} of the {len(stream)} samples are skipped each epoch: each of the {stream.slots} readers "
            f"(processes x data.num_workers) yields the same number of full batches of {batch_size}; shards of equal "
            f"size, a multiple of {stream.slots} of them, each reader's share a multiple of {batch_size}, read "
            f"every sample (sslkit-write-shards --help)",
            markup=False,
            highlight=False,
        )
    return loader


def shard_stream(pattern: str | None, max_size: int | None = None) -> ShardStream:
    """The shards ``pattern`` names (see :func:`expand_shards`), with their sample counts.

    Raises:
        UserError: no pattern, no shard matching it, or a shard that is not a readable tar file.
    """
    if not pattern:
        raise UserError(
            "webdataset needs data.root: the tar shards, e.g. data.root='shards/train-{000000..000015}.tar' "
            "(sslkit-write-shards writes them from an image folder)"
        )
    shards = expand_shards(pattern)
    missing = [shard for shard in shards if not Path(shard).is_file()]
    if not shards or len(missing) == len(shards):
        raise UserError(f"webdataset: no shard matches {pattern}")
    if missing:
        raise UserError(
            f"webdataset: {len(missing)} of the {len(shards)} shards of {pattern} do not exist, e.g. {missing[0]}"
        )
    counts = [count_samples(shard) for shard in shards]
    if not sum(counts):
        raise UserError(f"webdataset: the shards of {pattern} hold no images ({', '.join(_EXTENSIONS)})")
    return ShardStream(shards, counts, max_size)
