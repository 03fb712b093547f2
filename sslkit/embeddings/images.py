"""The images ``sslkit-embed`` encodes: any dataset sslkit reads, every image of one split, in a fixed order.

By default the run's own ``data`` section (its ``train_split``); ``data`` names another:

- a dataset name (``digits``, ``fashion_mnist``, ``cub200``, ...), read from ``root`` when given, from
  where the recipe keeps it when the recipe's dataset is that one, else from its standard place;
- a folder: an image folder at any depth (``train/<class>/`` and ``test/<class>/`` give labels, any
  other layout is one unlabelled split), or a folder of ``.tar`` shards;
- tar shards: a ``.tar`` file or a brace pattern (``shards/train-{000000..000015}.tar``).

Each image is a row, named in ``items.csv`` by its path relative to the folder (image folders and
the retrieval benchmarks), ``<shard>:<key>`` (tar shards) or its index in the split (the datasets
held in memory).
"""

from __future__ import annotations

import dataclasses
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from sslkit.datasets import DATASETS, DatasetInfo, build_dataset
from sslkit.datasets.base import IMAGENET_MEAN, IMAGENET_STD
from sslkit.datasets.batches import ImageBatch, pad_images
from sslkit.datasets.decode import decode_rgb
from sslkit.datasets.folders import IMAGE_EXTENSIONS, ImageFiles, ImageFolderDataset
from sslkit.datasets.shards import expand_shards
from sslkit.errors import UserError


@dataclasses.dataclass
class Images:
    """One split of a dataset, as rows.

    Attributes:
        dataset: map-style; ``__getitems__(indices)`` returns ``(images, labels)``, images a uint8 batch
            ``(B, C, H, W)`` or an :class:`~sslkit.datasets.batches.ImageBatch` of images of different sizes.
        items: the name of every row (see the module docstring).
        labels: (N,) int64 class ids (-1: none for that image), or None when the split has no labels.
        info: the dataset's channels and statistics.
        name: the dataset's name (an image folder's or a shard folder's own name).
        split: the split.
        root: where its files are (None: the standard place, or bundled).
        is_run_data: the run's own dataset, so its statistics are the run's.
        classes: the class names, ``classes[k]`` naming label k (empty without labels).
    """

    dataset: Dataset
    items: list[str]
    labels: np.ndarray | None
    info: DatasetInfo
    name: str
    split: str
    root: str | None
    is_run_data: bool
    classes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.items)

    def describe(self) -> dict:
        """What ``meta.json`` records of the images."""
        described = {"name": self.name, "split": self.split, "root": self.root, "labelled": self.labels is not None}
        return described | ({"classes": list(self.classes)} if self.classes else {})


def images_to_embed(cfg, data: str | None = None, split: str | None = None, root: str | None = None) -> Images:
    """The images of ``data`` (default: the recipe's dataset) and ``split`` (default: the recipe's ``train_split``,
    or ``train``), read from ``root`` (see the module docstring).

    Raises:
        UserError: a ``data`` that is neither a dataset name nor an existing folder or shard pattern, a split
            the dataset does not have, or missing files.
    """
    d = cfg.data
    if data is None or (data == d.name and root in (None, d.root)):
        name, root, image_size, max_size = d.name, d.root, d.image_size, d.max_size
        split = split or (d.train_split if data is None else "train")
        is_run_data = True
    elif data in DATASETS:
        name, image_size, max_size, is_run_data = data, None, None, False
        split = split or "train"
    else:
        # An absolute path in meta.json: the same folder whichever directory the command runs from.
        name, root = _files_at(data), "::".join(os.path.abspath(os.path.expanduser(p)) for p in data.split("::"))
        image_size, max_size, is_run_data = None, d.max_size, False
        split = split or "train"
    if name == "webdataset":
        if split != "train":
            raise UserError(f"tar shards are one unlabelled split, 'train'; drop --split {split}")
        dataset = IndexedShards(expand_shards(root), max_size)
        return Images(dataset, dataset.items, None, dataset.info, _shown_name(root), split, root, is_run_data)
    dataset = build_dataset(name, split, root, d.download, image_size, max_size)
    labels = dataset.labels.numpy()
    shown = _shown_name(root) if name == "imagefolder" else name
    labelled = bool((labels >= 0).any())
    return Images(
        dataset, _items(dataset, root), labels if labelled else None, dataset.info, shown, split, root,
        is_run_data, tuple(dataset.classes) if labelled else (),
    )  # fmt: skip


def _files_at(data: str) -> str:
    """``imagefolder`` or ``webdataset``: what the files at ``data`` are read as."""
    path = Path(data).expanduser()
    if path.is_dir():
        # Only the folder's own files are looked at: listing a large image folder twice would take a while.
        suffixes = {entry.suffix.lower() for entry in path.iterdir() if entry.is_file()}
        return "webdataset" if ".tar" in suffixes and not suffixes & set(IMAGE_EXTENSIONS) else "imagefolder"
    if (path.is_file() and path.suffix == ".tar") or "{" in data or "::" in data:
        return "webdataset"
    what = "an image; give the folder that holds it" if path.is_file() else "not found"
    raise UserError(
        f"--data '{data}' is {what}; give a dataset ({', '.join(DATASETS)}), a folder of images, or tar shards"
    )


def _shown_name(root: str) -> str:
    """An image folder's or a shard pattern's own name, for the default output folder."""
    path = Path(root.split("::")[0]).expanduser()
    return (path if path.is_dir() else path.parent).resolve().name or "images"


def _items(dataset, root: str | None) -> list[str]:
    """The name of every row: a path relative to ``root`` for files, the index in the split otherwise."""
    if isinstance(dataset, ImageFiles):
        base = Path(root).expanduser() if root is not None else None
        if base is not None and base.is_dir():
            return [os.path.relpath(path, base) for path in dataset.paths]
        return [str(path) for path in dataset.paths]
    if isinstance(dataset, ImageFolderDataset):
        return [os.path.relpath(path, Path(root).expanduser()) for path, _ in dataset.samples]
    return [str(index) for index in range(len(dataset))]


class IndexedShards(Dataset):
    """The images of tar shards by row, in the shards' order and each shard's member order.

    :class:`~sslkit.datasets.shards.ShardStream` streams shards shuffled, for training; embeddings need
    every image once, in a fixed order, and any range of rows (a resumed run, another process's share).
    Uncompressed tar members are contiguous bytes, so the headers are read once, here, and each image is
    then read at its offset. A sample is webdataset's: the members sharing a key (the name up to the first
    dot of its base name); its first image member is the image.

    Args:
        shards: the tar files.
        max_size: the longest side kept at decode; None keeps each image's size.
    """

    def __init__(self, shards: Sequence[str], max_size: int | None = None) -> None:
        missing = [shard for shard in shards if not Path(shard).is_file()]
        if not shards or missing:
            raise UserError(f"webdataset: no shard file {missing[0] if missing else ''}; check the pattern")
        self.max_size = max_size
        self.members: list[tuple[str, int, int]] = []  # shard, offset of the image's bytes, their length
        self.items: list[str] = []
        for shard in shards:
            self._index(shard)
        if not self.members:
            raise UserError(f"webdataset: the shards {shards[0]}, ... hold no images ({', '.join(IMAGE_EXTENSIONS)})")
        self.labels = torch.full((len(self.members),), -1, dtype=torch.int64)
        self.info = DatasetInfo(3, 0, 0, IMAGENET_MEAN, IMAGENET_STD)

    def _index(self, shard: str) -> None:
        seen = set()
        try:
            with tarfile.open(shard) as tar:
                for member in tar:
                    folder, _, base = member.name.rpartition("/")
                    stem, _, extension = base.partition(".")
                    key = f"{folder}/{stem}" if folder else stem
                    if member.isfile() and f".{extension.lower()}" in IMAGE_EXTENSIONS and key not in seen:
                        seen.add(key)
                        self.members.append((shard, member.offset_data, member.size))
                        self.items.append(f"{Path(shard).name}:{key}")
        except (OSError, tarfile.TarError, EOFError) as error:
            raise UserError(f"webdataset: cannot read shard {shard} ({error}); replace it with a good copy") from None

    def __len__(self) -> int:
        return len(self.members)

    def __getitems__(self, indices: Sequence[int]) -> tuple[ImageBatch, torch.Tensor]:
        images = []
        for index in indices:
            shard, offset, size = self.members[int(index)]
            with open(shard, "rb") as f:
                f.seek(offset)
                data = torch.frombuffer(bytearray(f.read(size)), dtype=torch.uint8)
            image = decode_rgb(data, self.max_size) if size else None
            if image is None:
                raise UserError(f"cannot decode image {self.items[int(index)]}; remove or fix it, then run again")
            images.append(image)
        pixels, sizes = pad_images(images)
        return ImageBatch(pixels, sizes), self.labels[torch.as_tensor(list(indices), dtype=torch.int64)]
