"""Datasets by name: ``build_dataset`` picks the reader ``data.name`` names, ``build_loader`` a plain loader.

Datasets, by ``data.name`` (one reader module each):

- ``digits``: scikit-learn's bundled 8x8 digits, always available offline (the default; :mod:`.digits`).
- ``fashion_mnist``: the standard IDX files, by default from ``/usr/share/datasets/fashion-mnist``
  (:mod:`.idx`).
- ``cifar10``, ``cifar100``, ``stl10``: torchvision's on-disk formats; downloaded only when
  ``data.download`` is true (:mod:`.cifar_stl`).
- ``imagefolder``: every image under ``root`` at any depth, at its own size and aspect ratio,
  unlabelled, or labelled from ``root/train/<class>/`` and ``root/test/<class>/``
  (:mod:`.folders`). With ``data.image_size`` set, the older behaviour: labelled
  ``<class>/<image>`` folders, each image resized to that square.
- ``webdataset``: tar shards streamed by the webdataset package (:mod:`.shards`).
- ``cub200``, ``cars196``, ``sop``, ``inshop``: the metric-learning retrieval benchmarks in their own
  layouts, split by class (:mod:`.retrieval`).

Whole in-memory datasets are small (:mod:`.memory`). Only ``imagefolder`` and ``webdataset``
decode lazily, because an image folder can be any size.

>>> train = build_dataset("digits", "train")
>>> images, labels = next(iter(build_loader(train, batch_size=64, shuffle=True, drop_last=True)))
>>> images.shape, images.dtype
(torch.Size([64, 1, 8, 8]), torch.uint8)
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from sslkit.datasets.base import ImageSource, collate_batch
from sslkit.datasets.cifar_stl import cifar10, cifar100, stl10
from sslkit.datasets.digits import digits
from sslkit.datasets.folders import image_folder, resized_image_folder
from sslkit.datasets.idx import fashion_mnist
from sslkit.datasets.retrieval import READERS as RETRIEVAL_READERS
from sslkit.datasets.retrieval import SPLITS as RETRIEVAL_SPLITS
from sslkit.datasets.shards import shard_stream
from sslkit.errors import UserError

_BUILDERS = {
    "digits": digits,
    "fashion_mnist": fashion_mnist,
    "cifar10": cifar10,
    "cifar100": cifar100,
    "stl10": stl10,
    "imagefolder": lambda split, root, download, image_size: resized_image_folder(split, root, image_size),
}
DATASETS: tuple[str, ...] = (*_BUILDERS, "webdataset", *RETRIEVAL_READERS)
_SPLITS = {name: ("train", "test") for name in DATASETS} | {"stl10": ("train", "test", "unlabeled", "train+unlabeled")}
_SPLITS["webdataset"] = ("train",)  # unlabelled shards; evaluation uses eval.data
_SPLITS |= RETRIEVAL_SPLITS
# Read as image files at their own size: data.max_size applies.
_FILE_DATASETS = ("imagefolder", "webdataset", *RETRIEVAL_READERS)


def build_dataset(
    name: str,
    split: str = "train",
    root: str | None = None,
    download: bool = False,
    image_size: int | None = None,
    max_size: int | None = None,
) -> ImageSource:
    """Load a dataset by name.

    Args:
        name: one of :data:`DATASETS`.
        split: ``"train"`` or ``"test"``; STL-10 also ``"unlabeled"`` and ``"train+unlabeled"``
            (unlabelled samples have label -1); In-shop ``"train"``, ``"query"`` and ``"gallery"``.
        root: where the files are; None for the dataset's standard place
            (:data:`.idx.FASHION_MNIST_ROOT`, :data:`.cifar_stl.DEFAULT_ROOT`). ``digits`` is bundled and ignores it.
        download: let torchvision download CIFAR-10/100 or STL-10 when missing. Nothing else downloads.
        image_size: ``imagefolder`` only: resize every image to this square (labelled ``<class>/``
            folders). None: images keep their size and aspect (:mod:`.folders`).
        max_size: datasets read as image files (``imagefolder``, ``webdataset`` and the retrieval
            benchmarks): the longest side kept at decode (None: all of it).

    Raises:
        UserError: an unknown name or split, missing or damaged files, or a misplaced ``image_size``.
    """
    if name not in DATASETS:
        raise UserError(f"unknown dataset '{name}'; choose one of: {', '.join(DATASETS)}")
    if split not in _SPLITS[name]:
        raise UserError(f"{name} has no split '{split}'; choose one of: {', '.join(_SPLITS[name])}")
    if image_size is not None and name != "imagefolder":
        raise UserError(
            f"data.image_size applies to imagefolder only, not {name} (its images are used at their native size; "
            f"augment.image_size sets the training crop)"
        )
    if max_size is not None and (name not in _FILE_DATASETS or image_size is not None):
        raise UserError(
            f"data.max_size applies to {', '.join(_FILE_DATASETS)} only (imagefolder with data.image_size null); "
            f"{name} images are used at their native size"
        )
    if name == "imagefolder" and image_size is None:
        return image_folder(split, root, max_size)
    if name == "webdataset":
        return shard_stream(root, max_size)
    if name in RETRIEVAL_READERS:
        return RETRIEVAL_READERS[name](split, root, max_size)
    return _BUILDERS[name](split, root, download, image_size)


def build_loader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool,
    drop_last: bool,
    num_workers: int = 0,
    seed: int = 0,
    pin_memory: bool = False,
) -> DataLoader:
    """A plain DataLoader of ``(images, labels)`` batches; Accelerate's ``prepare`` shards it later.

    The shuffle order comes from a generator seeded with ``seed``, so a run's batches are
    reproducible. With :class:`~sslkit.datasets.memory.ImageTensorDataset` each batch is one ``__getitems__`` call.

    Shape:
        yields: images (B, C, H, W) uint8, labels (B,) int64.
    """
    if drop_last and batch_size > len(dataset):
        raise UserError(
            f"train.batch_size {batch_size} is larger than the dataset's {len(dataset)} training images; "
            f"lower train.batch_size"
        )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=num_workers,
        collate_fn=collate_batch,
        generator=torch.Generator().manual_seed(seed),
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
