"""CIFAR-10, CIFAR-100 and STL-10 in torchvision's on-disk formats, downloaded only when asked.

Each is read whole into an :class:`~sslkit.datasets.memory.ImageTensorDataset`.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torchvision
from torchvision.datasets.utils import download_and_extract_archive

from sslkit.datasets.base import DatasetInfo
from sslkit.datasets.memory import ImageTensorDataset
from sslkit.errors import UserError

# Where torchvision datasets live when data.root is not set.
DEFAULT_ROOT = Path("~/.cache/sslkit/datasets").expanduser()
# Published per-channel statistics of the training sets, in [0, 1] units.
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
STL10_MEAN, STL10_STD = (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713)
# STL-10's class_names.txt, for an install that lacks the file.
STL10_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]

# torchvision checks the md5 sum of every file each time a dataset is built. With md5 None its
# check_integrity only tests that the file exists, and these subclasses change nothing else.
# Why skip the sums: STL-10's check reads all 2.7 GB (the unlabelled file too) even to load
# the 8000 test images; tests must run the real loading code on small files written in the real
# format, which cannot match the published sums; and a download is still verified, because
# torchvision checks the archive's md5 before extracting it. A damaged file still fails to load
# (a pickle or size error), which _load_torchvision reports naming the folder.


def _without_md5(files: list[list[str]]) -> list[list[str | None]]:
    return [[name, None] for name, _ in files]


class _CIFAR10(torchvision.datasets.CIFAR10):
    train_list = _without_md5(torchvision.datasets.CIFAR10.train_list)
    test_list = _without_md5(torchvision.datasets.CIFAR10.test_list)
    meta = {**torchvision.datasets.CIFAR10.meta, "md5": None}


class _CIFAR100(torchvision.datasets.CIFAR100):
    train_list = _without_md5(torchvision.datasets.CIFAR100.train_list)
    test_list = _without_md5(torchvision.datasets.CIFAR100.test_list)
    meta = {**torchvision.datasets.CIFAR100.meta, "md5": None}


class _STL10(torchvision.datasets.STL10):
    train_list = _without_md5(torchvision.datasets.STL10.train_list)
    test_list = _without_md5(torchvision.datasets.STL10.test_list)


def _load_torchvision(dataset_class, name: str, root: str | None, download: bool, **kwargs):
    """Build a torchvision dataset, turning missing, undownloadable or damaged files into a UserError."""
    root_path = Path(root).expanduser() if root else DEFAULT_ROOT
    folder = root_path / dataset_class.base_folder
    needed = [file for file, _ in dataset_class.train_list + dataset_class.test_list]
    needed += [dataset_class.meta["filename"]] if hasattr(dataset_class, "meta") else []
    missing = [file for file in needed if not (folder / file).is_file()]
    if missing and not download:
        raise UserError(
            f"{name}: {', '.join(missing)} not found in {folder}; set data.download=true to download it, "
            f"or data.root to the directory that holds {dataset_class.base_folder}/"
        )
    if missing:
        try:  # the step torchvision's download() takes, called directly so its errors are told apart from reading's
            download_and_extract_archive(
                dataset_class.url, str(root_path), filename=dataset_class.filename, md5=dataset_class.tgz_md5
            )
        except (OSError, RuntimeError) as error:  # URLError is an OSError; RuntimeError: the archive's md5 is wrong
            raise UserError(
                f"{name}: could not download {dataset_class.url} into {root_path} ({error}); download and "
                f"extract it there by hand, or set data.root to where it already is"
            ) from None
    try:
        return dataset_class(str(root_path), **kwargs)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, KeyError, RuntimeError) as error:
        raise UserError(
            f"{name}: the files in {folder} are damaged ({type(error).__name__}: {error}); "
            f"delete the folder and set data.download=true"
        ) from None


def _cifar(split: str, root: str | None, download: bool, image_size: int | None, hundred: bool) -> ImageTensorDataset:
    name, dataset_class = ("cifar100", _CIFAR100) if hundred else ("cifar10", _CIFAR10)
    dataset = _load_torchvision(dataset_class, name, root, download, train=split == "train")
    images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()  # (N, 32, 32, 3) -> (N, 3, 32, 32)
    labels = torch.tensor(dataset.targets, dtype=torch.int64)
    mean, std = (CIFAR100_MEAN, CIFAR100_STD) if hundred else (CIFAR10_MEAN, CIFAR10_STD)
    info = DatasetInfo(3, 32, len(dataset.classes), mean, std)
    return ImageTensorDataset(images, labels, dataset.classes, info)


def cifar10(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """CIFAR-10 (50k + 10k RGB 32x32 images, 10 classes), torchvision's python batches."""
    return _cifar(split, root, download, image_size, hundred=False)


def cifar100(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """CIFAR-100 (50k + 10k RGB 32x32 images, 100 fine classes), torchvision's python batches."""
    return _cifar(split, root, download, image_size, hundred=True)


def stl10(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """STL-10 (5k train, 8k test, 100k unlabelled RGB 96x96 images, 10 classes), binary format."""
    dataset = _load_torchvision(_STL10, "stl10", root, download, split=split)
    if dataset.labels is None or len(dataset.labels) != len(dataset.data):
        raise UserError(
            f"stl10: {Path(dataset.root) / dataset.base_folder} has {len(dataset.data)} images for split "
            f"'{split}' but a different number of labels; delete the folder and set data.download=true"
        )
    images = torch.from_numpy(np.ascontiguousarray(dataset.data))  # torchvision's (N, 3, 96, 96) is a transposed view
    labels = torch.from_numpy(dataset.labels.astype(np.int64))
    classes = getattr(dataset, "classes", STL10_CLASSES)
    return ImageTensorDataset(images, labels, classes, DatasetInfo(3, 96, 10, STL10_MEAN, STL10_STD))
