"""Datasets that hand uint8 image batches to the accelerator.

Every dataset here returns images as uint8 tensors ``(C, H, W)`` and labels as int64 (``-1``
for unlabelled samples). Nothing is augmented here: two-view augmentation runs later, on the
accelerator, on the whole batch at once (:mod:`sslkit.augment`). DataLoader workers therefore
do no per-sample Python work, and the in-memory datasets go further: ``__getitems__`` fetches
a whole batch with one indexing operation (PyTorch's fetcher calls it when it exists), and
:func:`collate_batch` passes that batch through unchanged.

Datasets, by ``data.name``:

- ``digits``: scikit-learn's bundled 8x8 digits, always available offline (the default).
- ``fashion_mnist``: the standard IDX files, by default from ``/usr/share/datasets/fashion-mnist``.
- ``cifar10``, ``cifar100``, ``stl10``: torchvision's on-disk formats; downloaded only when
  ``data.download`` is true.
- ``imagefolder``: every image under ``root`` at any depth, at its own size and aspect ratio,
  unlabelled, or labelled from ``root/train/<class>/`` and ``root/test/<class>/``
  (:mod:`sslkit.folders`). With ``data.image_size`` set, the older behaviour: labelled
  ``<class>/<image>`` folders, each image resized to that square.
- ``webdataset``: tar shards streamed by the webdataset package (:mod:`sslkit.shards`).

Whole in-memory datasets are small: CIFAR-10 is 150 MB as uint8, STL-10's unlabelled split
2.6 GB. Only ``imagefolder`` decodes lazily, because an image folder can be any size.

>>> train = build_dataset("digits", "train")
>>> images, labels = next(iter(build_loader(train, batch_size=64, shuffle=True, drop_last=True)))
>>> images.shape, images.dtype
(torch.Size([64, 1, 8, 8]), torch.uint8)
"""

from __future__ import annotations

import gzip
import pickle
import re
import warnings
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets.folder import find_classes, make_dataset
from torchvision.datasets.utils import download_and_extract_archive
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as TF

from sslkit.batches import EncodedBatch, ImageBatch
from sslkit.errors import UserError

if TYPE_CHECKING:  # both modules import this one
    from sslkit.folders import ImageFiles
    from sslkit.shards import ShardStream

# Where torchvision datasets live when data.root is not set.
DEFAULT_ROOT = Path("~/.cache/sslkit/datasets").expanduser()
# Where `apt-get install dataset-fashion-mnist` puts the IDX files.
FASHION_MNIST_ROOT = Path("/usr/share/datasets/fashion-mnist")

# Published per-channel statistics of the training sets, in [0, 1] units.
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
STL10_MEAN, STL10_STD = (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# From the Fashion-MNIST README (zalandoresearch/fashion-mnist), in label order.
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
# STL-10's class_names.txt, for an install that lacks the file.
STL10_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
# The formats torchvision.io.decode_image reads; other files in an image folder are not listed.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".webp")


@dataclass(frozen=True)
class DatasetInfo:
    """What the model and the augmentation need to know about a dataset's images.

    Attributes:
        channels: 1 (grey) or 3 (RGB).
        image_size: native height = width of the stored images.
        num_classes: number of classes (labels are ``0 .. num_classes - 1``, or -1 when unlabelled).
        mean: per-channel mean in [0, 1] units, used to normalise.
        std: per-channel standard deviation in [0, 1] units.
    """

    channels: int
    image_size: int
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


# --------------------------------------------------------------------------- datasets


def _class_indices(labels: torch.Tensor, classes: Iterable[int], num_classes: int, keep: bool) -> torch.Tensor:
    """Indices of the samples whose label is (``keep``) or is not (not ``keep``) in ``classes``."""
    classes = [int(c) for c in classes]
    for c in classes:
        if not 0 <= c < num_classes:
            raise UserError(f"class {c} does not exist: this dataset's classes are 0..{num_classes - 1}")
    chosen = torch.isin(labels, torch.tensor(classes, dtype=torch.int64))
    return torch.nonzero(chosen if keep else ~chosen).flatten()


class ImageTensorDataset(Dataset):
    """A whole dataset held in memory as one uint8 image tensor and one label tensor.

    Args:
        images: uint8 images.
        labels: int64 class indices, -1 for unlabelled samples.
        classes: class names; ``classes[k]`` names label ``k``.
        info: channels, native size, class count and normalisation statistics.

    Shape:
        images: (N, C, H, W), uint8.
        labels: (N,), int64.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: list[str], info: DatasetInfo) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != info.channels:
            raise ValueError(
                f"images must be uint8 (N, {info.channels}, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        if labels.dtype != torch.int64 or labels.shape != (len(images),):
            raise ValueError(f"labels must be int64 ({len(images)},), got {labels.dtype} {tuple(labels.shape)}")
        self.images = images
        self.labels = labels
        self.classes = list(classes)
        self.info = info

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One image ``(C, H, W)`` uint8 and its label, an int64 scalar tensor."""
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole batch with one indexing operation: images ``(B, C, H, W)``, labels ``(B,)``."""
        index = torch.as_tensor(indices, dtype=torch.int64)
        return self.images[index], self.labels[index]

    def subset(self, indices: Sequence[int] | torch.Tensor) -> ImageTensorDataset:
        """A new dataset of the given samples (labels and class names unchanged)."""
        index = torch.as_tensor(indices, dtype=torch.int64)
        return ImageTensorDataset(self.images[index], self.labels[index], self.classes, self.info)

    def with_labels(self, labels: torch.Tensor) -> ImageTensorDataset:
        """The same images with other labels (-1: unlabelled), e.g. only a labelled subset's."""
        return ImageTensorDataset(self.images, labels, self.classes, self.info)

    def select_classes(self, classes: Iterable[int], keep: bool = True) -> ImageTensorDataset:
        """The samples of ``classes`` (``keep=True``) or of every other class (``keep=False``).

        Labels keep their original values, so held-out classes stay distinguishable from the
        rest. Unlabelled samples (-1) belong to no class: they are kept only when ``keep=False``.
        """
        return self.subset(_class_indices(self.labels, classes, self.info.num_classes, keep))


class ImageFolderDataset(Dataset):
    """Images in ``<class>/<image>`` folders, decoded when fetched and resized to a square.

    Decoding is lazy: building the dataset only lists the files, so a corrupt image is found
    when a batch first needs it. It then raises :class:`UserError` naming the file (with
    ``num_workers > 0`` PyTorch re-raises it in the main process with the worker's traceback
    in the message; the file name is on its last line). Checking every file up front would
    mean decoding the whole folder before training starts.

    Args:
        samples: ``(path, label)`` pairs, as torchvision's ``make_dataset`` lists them.
        classes: class names; ``classes[k]`` names label ``k``.
        image_size: every image is resized to ``image_size x image_size``.
    """

    def __init__(self, samples: list[tuple[str, int]], classes: list[str], image_size: int) -> None:
        self.samples = list(samples)
        self.labels = torch.tensor([label for _, label in self.samples], dtype=torch.int64)
        self.classes = list(classes)
        self.image_size = image_size
        # Statistics of the folder are unknown without decoding it all; ImageNet's are the usual stand-in.
        self.info = DatasetInfo(3, image_size, len(self.classes), IMAGENET_MEAN, IMAGENET_STD)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One image ``(3, image_size, image_size)`` uint8 and its label, an int64 scalar tensor."""
        return decode_and_resize(self.samples[index][0], self.image_size), self.labels[index]

    def subset(self, indices: Sequence[int] | torch.Tensor) -> ImageFolderDataset:
        """A new dataset of the given samples (labels and class names unchanged)."""
        return ImageFolderDataset([self.samples[int(i)] for i in indices], self.classes, self.image_size)

    def with_labels(self, labels: torch.Tensor) -> ImageFolderDataset:
        """The same images with other labels (-1: unlabelled), e.g. only a labelled subset's."""
        samples = [(path, int(label)) for (path, _), label in zip(self.samples, labels)]
        return ImageFolderDataset(samples, self.classes, self.image_size)

    def select_classes(self, classes: Iterable[int], keep: bool = True) -> ImageFolderDataset:
        """The samples of ``classes`` (``keep=True``) or of every other class; labels unchanged."""
        return self.subset(_class_indices(self.labels, classes, self.info.num_classes, keep))


def decode_and_resize(path: str, image_size: int) -> torch.Tensor:
    """Decode an image file to RGB uint8 and resize it to a square.

    Resizing every image to one size is loading, not augmentation: it is what lets a folder of
    differently sized images form a batch. The aspect ratio is not kept.

    Shape:
        returns: (3, image_size, image_size), uint8.
    """
    try:
        with warnings.catch_warnings():
            # torchvision 0.29 deprecates its decoders in favour of TorchCodec, which is not a
            # dependency here; the warning would repeat once per image.
            warnings.filterwarnings(
                "ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning
            )
            image = decode_image(path, mode=ImageReadMode.RGB)
    except RuntimeError as error:
        # The C++ message starts with "decode_png, /path/to/decode_png.cpp:66, ": keep the reason.
        reason = re.sub(r"^\w+, \S+:\d+, ", "", str(error).splitlines()[0])
        raise UserError(f"cannot decode image {path} ({reason}); remove or fix this file") from None
    if image.dim() == 4:  # an animated GIF: (frames, C, H, W); use the first frame
        image = image[0]
    if image.dtype != torch.uint8:  # 16-bit PNGs decode to uint16
        image = TF.to_dtype(image, torch.uint8, scale=True)
    if image.shape[-2:] != (image_size, image_size):
        image = TF.resize(image, [image_size, image_size], antialias=True)
    return image


class WithIndices(Dataset):
    """``dataset`` whose batches also carry each sample's position in it: ``(images, labels, indices)``.

    For methods that keep per-sample state (NPID's memory bank: ``needs_indices``).
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if hasattr(self.dataset, "__getitems__"):
            images, labels = self.dataset.__getitems__(indices)
        else:
            images, labels = collate_batch([self.dataset[i] for i in indices])
        return images, labels, torch.as_tensor(indices, dtype=torch.int64)


def collate_batch(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """DataLoader ``collate_fn``: pass a batch from ``__getitems__`` through, else stack samples.

    Args:
        batch: ``(images, labels)`` already batched by ``__getitems__`` (images a tensor or, for
            images of different sizes, a :mod:`sslkit.batches` batch), or a list of
            ``(image, label)`` samples.

    Shape:
        returns: images (B, C, H, W) uint8, labels (B,) int64.
    """
    if (
        isinstance(batch, tuple)
        and len(batch) in (2, 3)
        and (
            isinstance(batch[0], (ImageBatch, EncodedBatch))
            or isinstance(batch[0], torch.Tensor)
            and batch[0].dim() == 4
        )
    ):
        return batch
    images, labels = zip(*batch)
    return torch.stack(images), torch.stack([torch.as_tensor(label, dtype=torch.int64) for label in labels])


# --------------------------------------------------------------------------- digits


def _digits(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """scikit-learn's 1797 8x8 digits, split 80/20, stratified, with a fixed seed."""
    # Imported here: scikit-learn takes a second to import and only this dataset needs it.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    pixels, targets = load_digits(return_X_y=True)  # (1797, 64) in 0..16, (1797,)
    images = torch.from_numpy(np.round(pixels * (255 / 16)).astype(np.uint8).reshape(-1, 1, 8, 8))
    labels = torch.from_numpy(targets.astype(np.int64))
    train_index, test_index = train_test_split(np.arange(len(labels)), test_size=0.2, stratify=targets, random_state=0)
    # Statistics of the training split only, so that the test split does not inform normalisation.
    train_pixels = images[train_index].double() / 255
    info = DatasetInfo(1, 8, 10, (train_pixels.mean().item(),), (train_pixels.std().item(),))
    index = train_index if split == "train" else test_index
    return ImageTensorDataset(images[index], labels[index], [str(d) for d in range(10)], info)


# --------------------------------------------------------------------------- Fashion-MNIST
# Hand-written IDX reading: the format is a few bytes of header then raw pixels, and
# torchvision's FashionMNIST class insists on its own directory layout (root/FashionMNIST/raw)
# and on md5-checked downloads, while the system package installs the bare .gz files.

_FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file of unsigned bytes (MNIST's format), gzipped or not.

    Format: two zero bytes, a type code (0x08 for unsigned bytes), the number of dimensions,
    then each dimension as a big-endian int32, then the data in C order.
    """
    path = Path(path)
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:  # unreadable, not gzip, truncated, corrupt
        raise UserError(f"cannot read {path} ({error}); replace it with an intact copy") from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise UserError(
            f"{path} is not an IDX file of unsigned bytes (bad header {data[:4].hex()}); "
            "replace it with an intact copy"
        )
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    if len(data) != header + int(np.prod(shape)):
        raise UserError(
            f"{path} holds {len(data) - header} bytes of data but its header says {shape}; "
            "replace it with an intact copy"
        )
    # bytes are read-only; copy into a writable array that torch can own
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape).copy()


def _find_idx(root: Path, stem: str) -> Path | None:
    """The IDX file ``stem`` under ``root`` or torchvision's ``root/FashionMNIST/raw``; raw before .gz."""
    for folder in (root, root / "FashionMNIST" / "raw"):
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    return None


def _fashion_mnist(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """Fashion-MNIST from its four IDX files (70k grey 28x28 images, 10 classes)."""
    root_path = Path(root).expanduser() if root else FASHION_MNIST_ROOT
    paths = [_find_idx(root_path, stem) for stem in _FASHION_MNIST_FILES[split]]
    if None in paths:
        missing = [stem for stem, path in zip(_FASHION_MNIST_FILES[split], paths) if path is None]
        raise UserError(
            f"fashion_mnist: {', '.join(missing)}(.gz) not found in {root_path} "
            f"or {root_path / 'FashionMNIST' / 'raw'}; "
            "install them with 'apt-get install dataset-fashion-mnist' "
            "or set data.root to a directory holding the four IDX files"
            + (" (sslkit does not download Fashion-MNIST)" if download else "")
        )
    images, labels = (read_idx(path) for path in paths)
    if images.ndim != 3 or labels.shape != (len(images),):
        raise UserError(
            f"fashion_mnist: {paths[0]} holds images {images.shape} but {paths[1]} labels {labels.shape}; "
            f"they must be (N, 28, 28) and (N,)"
        )
    info = DatasetInfo(1, images.shape[1], 10, FASHION_MNIST_MEAN, FASHION_MNIST_STD)
    return ImageTensorDataset(
        torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels.astype(np.int64)), FASHION_MNIST_CLASSES, info
    )


# --------------------------------------------------------------------------- torchvision datasets
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


def _cifar10(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """CIFAR-10 (50k + 10k RGB 32x32 images, 10 classes), torchvision's python batches."""
    return _cifar(split, root, download, image_size, hundred=False)


def _cifar100(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """CIFAR-100 (50k + 10k RGB 32x32 images, 100 fine classes), torchvision's python batches."""
    return _cifar(split, root, download, image_size, hundred=True)


def _stl10(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
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


# --------------------------------------------------------------------------- image folders


def _imagefolder(split: str, root: str | None, download: bool, image_size: int) -> ImageFolderDataset:
    """Images in ``root/<class>/<image>``, or ``root/train/<class>/...`` and ``root/test/<class>/...``,
    resized to ``image_size`` squares (with ``image_size`` None, :func:`sslkit.folders.image_folder` reads the folder).

    When ``root/train`` exists the splits are ``root/train`` and ``root/test``; otherwise ``root``
    itself is the training split and there is no test split. Test classes are matched to the
    training classes by name, so a class missing from the test folder does not shift the labels.
    """
    if root is None:
        raise UserError(
            "imagefolder needs data.root: a directory laid out as root/train/<class>/<image> "
            "and root/test/<class>/<image>"
        )
    root_path = Path(root).expanduser()
    if not root_path.is_dir():
        raise UserError(f"imagefolder: data.root {root_path} is not a directory")
    has_splits = (root_path / "train").is_dir()
    train_dir = root_path / "train" if has_splits else root_path
    if split == "test" and not (root_path / "test").is_dir():
        raise UserError(
            f"imagefolder: no test split: {root_path / 'test'} does not exist; training evaluates on one, "
            f"so lay the folder out as root/train/<class>/... and root/test/<class>/... (a few images a class will do)"
        )
    folder = train_dir if split == "train" else root_path / "test"
    try:
        classes, class_to_idx = find_classes(train_dir)
        if split == "test":
            unknown = sorted(set(find_classes(folder)[0]) - set(classes))
            if unknown:
                raise UserError(f"imagefolder: {folder} has classes that {train_dir} lacks: {', '.join(unknown)}")
        samples = make_dataset(folder, class_to_idx, extensions=IMAGE_EXTENSIONS, allow_empty=split == "test")
    except FileNotFoundError as error:  # no class folders, or a training class without images
        raise UserError(f"imagefolder: {folder}: {error}") from None
    if not samples:
        raise UserError(f"imagefolder: no images ({', '.join(IMAGE_EXTENSIONS)}) under {folder}")
    return ImageFolderDataset(samples, classes, image_size)


# --------------------------------------------------------------------------- building

_BUILDERS = {
    "digits": _digits,
    "fashion_mnist": _fashion_mnist,
    "cifar10": _cifar10,
    "cifar100": _cifar100,
    "stl10": _stl10,
    "imagefolder": _imagefolder,
}
DATASETS: tuple[str, ...] = (*_BUILDERS, "webdataset")
_SPLITS = {name: ("train", "test") for name in DATASETS} | {"stl10": ("train", "test", "unlabeled", "train+unlabeled")}
_SPLITS["webdataset"] = ("train",)  # unlabelled shards; evaluation uses eval.data


def build_dataset(
    name: str,
    split: str = "train",
    root: str | None = None,
    download: bool = False,
    image_size: int | None = None,
    max_size: int | None = None,
) -> ImageTensorDataset | ImageFolderDataset | ImageFiles | ShardStream:
    """Load a dataset by name.

    Args:
        name: one of :data:`DATASETS`.
        split: ``"train"`` or ``"test"``; STL-10 also ``"unlabeled"`` and ``"train+unlabeled"``
            (unlabelled samples have label -1).
        root: where the files are; None for the dataset's standard place
            (:data:`FASHION_MNIST_ROOT`, :data:`DEFAULT_ROOT`). ``digits`` is bundled and ignores it.
        download: let torchvision download CIFAR-10/100 or STL-10 when missing. Nothing else downloads.
        image_size: ``imagefolder`` only: resize every image to this square (labelled ``<class>/``
            folders). None: images keep their size and aspect (:mod:`sslkit.folders`).
        max_size: ``imagefolder`` and ``webdataset``: the longest side kept at decode (None: all of it).

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
    if max_size is not None and (name not in ("imagefolder", "webdataset") or image_size is not None):
        raise UserError(
            "data.max_size applies to imagefolder (with data.image_size null) and webdataset only; "
            f"{name} images are used at their native size"
        )
    if name == "imagefolder" and image_size is None:
        from sslkit import folders  # imports this module

        return folders.image_folder(split, root, max_size)
    if name == "webdataset":
        from sslkit import shards  # imports this module

        return shards.shard_stream(root, max_size)
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
    reproducible. With :class:`ImageTensorDataset` each batch is one ``__getitems__`` call.

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
