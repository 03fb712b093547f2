"""Folders of image files as they come: any depth, any size, any mode, labelled or not.

``data.name=imagefolder data.root=DIR`` reads every image under ``DIR``:

- ``DIR/train/<class>/...`` and ``DIR/test/<class>/...``: a labelled training and test split
  (class folders at any depth below ``<class>``), the test classes matched to the training
  classes by name;
- any other layout (flat, nested, class folders or not): one unlabelled training split of every
  image at any depth (label -1). Self-supervised methods need no labels; evaluation then uses
  ``eval.data`` if set, and is skipped otherwise.

Files are listed by extension (:data:`IMAGE_EXTENSIONS`, any case); other files and hidden
files and folders are ignored. Images keep their own size and aspect ratio (reduced to
``data.max_size`` if set): a batch is an :class:`~sslkit.datasets.batches.ImageBatch` of padded images, and
the crops are drawn on each original image (:mod:`sslkit.augment.crops`).

Decoding (:mod:`sslkit.datasets.decode`) runs in the DataLoader workers, or, when the accelerator is a
CUDA device and ``data.decode`` allows it, on the device: workers then only read bytes.

A corrupt or truncated file never stops a batch: it is replaced by the next readable file of the
folder and its name travels with the batch, where :class:`CorruptCount` counts it
(``data.on_corrupt``: ``skip`` reports the count at the end of each epoch and stops the run once
more than 1% of the folder is corrupt; ``error`` stops at the first one).

>>> dataset = image_folder("train", "/nonexistent")  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
sslkit.errors.UserError: imagefolder: data.root /nonexistent does not exist
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from torchvision.transforms.v2 import functional as TF

from sslkit.datasets.base import IMAGENET_MEAN, IMAGENET_STD, DatasetInfo, ImageDataset
from sslkit.datasets.batches import AugmentedViews, EncodedBatch, ImageBatch, pad_images
from sslkit.datasets.decode import decode_rgb
from sslkit.errors import UserError

# What torchvision.io or Pillow decodes; every other file in the folder is ignored.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff")
# More corrupt files than this share of the folder stop the run (data.on_corrupt=skip).
CORRUPT_LIMIT = 0.01
CORRUPT_POLICIES = ("skip", "error")


def list_images(folder: Path) -> list[Path]:
    """Every image file under ``folder``, at any depth, in sorted order; hidden entries skipped.

    Symbolic links to folders are followed (a folder of links to a dataset is a common layout).
    """
    found = []
    for directory, subdirs, files in os.walk(folder, followlinks=True):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        found += [Path(directory, f) for f in sorted(files) if not f.startswith(".") and _is_image(f)]
    return found


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


class ImageFiles(ImageDataset):
    """Image files decoded when a batch is fetched, at their own size (reduced to ``max_size``).

    Batches come from ``__getitems__`` (PyTorch's fetcher calls it with the batch's indices):
    ``(ImageBatch, labels)`` with the images decoded here, or ``(EncodedBatch, labels)`` of file
    bytes when :attr:`decode_on_device` is set. A file that cannot be read or decoded is replaced
    by the next good file in the folder's order (so a resumed run replaces it the same way) and
    named in the batch's ``corrupt``.

    Args:
        paths: the image files.
        labels: class index of each file, -1 for unlabelled.
        classes: class names; ``classes[k]`` names label ``k`` (empty when unlabelled).
        max_size: the longest side kept at decode; None keeps each image's size.

    Shape:
        labels: (N,) int64.
    """

    reads_files = True

    def __init__(
        self, paths: Sequence[Path], labels: torch.Tensor, classes: list[str], max_size: int | None = None
    ) -> None:
        self.paths = list(paths)
        self.labels = labels
        self.classes = list(classes)
        self.max_size = max_size
        # Statistics of the folder are unknown without decoding it all; ImageNet's are the usual stand-in.
        # image_size 0: the images keep their own sizes.
        self.info = DatasetInfo(3, 0, len(self.classes), IMAGENET_MEAN, IMAGENET_STD)

    def _read(self, index: int) -> torch.Tensor | None:
        try:
            data = self.paths[index].read_bytes()
        except OSError:
            return None
        return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None

    def _load(self, index: int) -> tuple[int, torch.Tensor, list[str]]:
        """The first good file from ``index`` on (wrapping round): its index, image or bytes, and the bad ones."""
        bad = []
        for step in range(len(self.paths)):
            i = (index + step) % len(self.paths)
            data = self._read(i)
            image = data if data is None or self.decode_on_device else decode_rgb(data, self.max_size)
            if image is not None:
                return i, image, bad
            bad.append(str(self.paths[i]))
        raise UserError(f"imagefolder: none of the {len(self.paths)} images can be decoded, e.g. {bad[0]}")

    def __getitems__(self, indices: Sequence[int]) -> tuple[ImageBatch | EncodedBatch, torch.Tensor]:
        """A batch: images (padded, or encoded) and labels ``(B,)``, with the corrupt files it met."""
        loaded = [self._load(int(i)) for i in indices]
        corrupt = tuple(dict.fromkeys(name for _, _, bad in loaded for name in bad))
        labels = self.labels[torch.tensor([i for i, _, _ in loaded], dtype=torch.int64)]
        if self.decode_on_device:
            names = [str(self.paths[i]) for i, _, _ in loaded]
            return EncodedBatch([data for _, data, _ in loaded], names, self.max_size, corrupt=corrupt), labels
        pixels, sizes = pad_images([image for _, image, _ in loaded])
        return ImageBatch(pixels, sizes, corrupt), labels

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoded image ``(3, H, W)`` uint8 (the next good one if this is corrupt) and its label."""
        i, image, _ = self._load(index)
        if self.decode_on_device:
            image = decode_rgb(image, self.max_size)
        return image, self.labels[i]

    def subset(self, indices: Sequence[int] | torch.Tensor) -> ImageFiles:
        """A new dataset of the given samples (labels and class names unchanged)."""
        index = torch.as_tensor(indices, dtype=torch.int64)
        return ImageFiles([self.paths[int(i)] for i in index], self.labels[index], self.classes, self.max_size)

    def with_labels(self, labels: torch.Tensor) -> ImageFiles:
        """The same images with other labels (-1: unlabelled)."""
        return ImageFiles(self.paths, labels, self.classes, self.max_size)


def has_labelled_splits(root: str | None) -> bool:
    """Whether ``root`` is laid out as ``train/<class>/`` and ``test/<class>/`` (a labelled image folder)."""
    return root is not None and (Path(root).expanduser() / "train").is_dir()


def image_folder(split: str, root: str | None, max_size: int | None = None) -> ImageFiles:
    """The ``split`` of the image folder at ``root`` (see the module docstring for the layouts).

    Raises:
        UserError: no root, a root that is not a folder, no images in it, or a test split that
            the layout does not have.
    """
    if root is None:
        raise UserError("imagefolder needs data.root: a folder of images (any layout, any depth)")
    folder = Path(root).expanduser()
    if not folder.exists():
        raise UserError(f"imagefolder: data.root {folder} does not exist")
    if not folder.is_dir():
        raise UserError(f"imagefolder: data.root {folder} is a file; give the folder that holds the images")
    if not has_labelled_splits(root):
        if split != "train":
            raise UserError(
                f"imagefolder: {folder} has no '{split}' split: without {folder / 'train'} and {folder / 'test'} "
                f"class folders it is one unlabelled training set; evaluate on a labelled set with eval.data.root"
            )
        paths = list_images(folder)
        _check_found(paths, folder)
        return ImageFiles(paths, torch.full((len(paths),), -1, dtype=torch.int64), [], max_size)
    classes = _class_folders(folder / "train")
    if not classes:
        raise UserError(f"imagefolder: {folder / 'train'} has no class folders; put the images in train/<class>/")
    split_dir = folder / split
    if not split_dir.is_dir():
        raise UserError(f"imagefolder: {split_dir} does not exist; add it with the same class folders as train/")
    unknown = sorted(set(_class_folders(split_dir)) - set(classes))
    if unknown:
        raise UserError(f"imagefolder: {split_dir} has classes that {folder / 'train'} lacks: {', '.join(unknown)}")
    paths, labels = [], []
    for label, name in enumerate(classes):
        found = list_images(split_dir / name) if (split_dir / name).is_dir() else []
        paths += found
        labels += [label] * len(found)
    _check_found(paths, split_dir)
    return ImageFiles(paths, torch.tensor(labels, dtype=torch.int64), classes, max_size)


def labelled_folder(root: str | None, max_size: int | None = None) -> ImageFiles:
    """Every image of the class folders of ``root`` (``root/train`` when the folder has one), labelled by class.

    For ``data.class_split``, which splits the classes rather than the images.

    Raises:
        UserError: no root, or no class folders with images in it.
    """
    if root is None:
        raise UserError("data.class_split needs data.root: a folder of <class>/ folders of images")
    base = Path(root).expanduser()
    folder = base / "train" if has_labelled_splits(root) else base
    if not folder.is_dir():
        raise UserError(f"data.class_split: data.root {folder} is not a folder")
    found = {name: list_images(folder / name) for name in _class_folders(folder)}
    classes = [name for name, images in found.items() if images]  # sorted, as _class_folders lists them
    if not classes:
        raise UserError(f"data.class_split: {folder} has no <class>/ folders of images")
    paths, labels = [], []
    for label, name in enumerate(classes):
        paths += found[name]
        labels += [label] * len(found[name])
    return ImageFiles(paths, torch.tensor(labels, dtype=torch.int64), classes, max_size)


def _check_found(paths: list[Path], folder: Path) -> None:
    if not paths:
        others = sum(1 for _ in folder.rglob("*") if _.is_file())
        raise UserError(
            f"imagefolder: no images ({', '.join(IMAGE_EXTENSIONS)}) under {folder}"
            + (f" ({others} other files were ignored)" if others else "")
        )


def prepare_training_set(cfg, splits, device: torch.device, augment_in_workers: bool = False) -> list[str]:
    """Decode the training images on ``device`` when it is a CUDA device (``data.decode=auto``) and the
    loader workers do not augment (``augment_in_workers``: they need decoded images); returns notes.

    The notes say where the images are decoded and augmented and, with no labelled evaluation set,
    that the kNN monitor and the final evaluation are skipped.
    """
    notes = []
    train = splits.train
    if train.reads_files and cfg.data.decode == "auto" and device.type == "cuda" and not augment_in_workers:
        train.decode_on_device = True
        notes.append(f"JPEGs are decoded on {device} (nvJPEG) in batches; other formats in the loader workers")
    if augment_in_workers:
        workers = cfg.data.num_workers
        where = f"the {workers} loader worker{'s' if workers > 1 else ''}" if workers else "the loader (no workers)"
        notes.append(f"augmentation: in {where}, seeded by (run.seed, epoch, batch) (data.augment_in_workers)")
    if splits.test is None and splits.unseen is not None:
        queries = f"{len(splits.unseen)} queries against a gallery of {len(splits.gallery)}" if splits.gallery else ""
        notes.append(
            f"evaluation: retrieval (Recall@K, MAP@R, NMI) among the {len(splits.unseen.classes)} classes kept out of "
            f"training{', ' + queries if queries else ''}; no kNN monitor (its classes are not the training classes)"
        )
    elif splits.test is None:
        notes.append(
            f"{cfg.data.name} at {cfg.data.root} has no labels and eval.data is not set: the kNN monitor and the "
            f"final evaluation are skipped (the backbone is still exported); set eval.data.root to a folder with "
            f"train/<class>/ and test/<class>/ to evaluate"
        )
    return notes


class CorruptCount:
    """Counts the corrupt files the training batches met, and stops the run when they are too many.

    Args:
        policy: ``data.on_corrupt``: ``skip`` (count, report at the end of the epoch, stop once more
            than :data:`CORRUPT_LIMIT` of the training set is corrupt) or ``error`` (stop at the first).
        size: images in the training set.
        accelerator: sums the counts of every process at the end of the epoch.
    """

    def __init__(self, policy: str, size: int, accelerator) -> None:
        self.policy, self.size, self.accelerator = policy, size, accelerator
        self.names: dict[str, None] = {}  # this process's corrupt files this epoch, in the order met

    def watch(self, batches: Iterable) -> Iterator:
        """``batches``, counting the corrupt files each one names."""
        for batch in batches:
            images = batch[0]
            self.add(images.corrupt if isinstance(images, (ImageBatch, EncodedBatch, AugmentedViews)) else ())
            yield batch

    def add(self, names: Sequence[str]) -> None:
        if not names:
            return
        if self.policy == "error":
            raise UserError(f"cannot decode image {names[0]}; remove or fix this file (or set data.on_corrupt=skip)")
        self.names.update(dict.fromkeys(names))
        # Each process sees 1/world of the folder: its share of the limit decides without waiting for the others.
        if len(self.names) > CORRUPT_LIMIT * self.size / self.accelerator.num_processes:
            shown = list(self.names)[:3]
            raise UserError(
                f"more than {CORRUPT_LIMIT:.0%} of the {self.size} images are corrupt "
                f"({len(self.names)} found so far, e.g. {', '.join(shown)}); remove or fix them"
            )

    def end_epoch(self, epoch: int) -> int:
        """The epoch's corrupt files over every process, printed by the main process; resets the count."""
        local = torch.tensor([len(self.names)], device=self.accelerator.device)
        total = int(self.accelerator.reduce(local, reduction="sum").item())
        if total and self.accelerator.is_main_process:
            from sslkit.console import console

            console.print(
                f"epoch {epoch}: skipped {total} corrupt image{'s' if total > 1 else ''} "
                f"(e.g. {', '.join(list(self.names)[:3])}), each replaced by another image",
                markup=False,
                highlight=False,
            )
        self.names = {}
        return total


# --------------------------------------------------------------------------- images resized to a square
# data.image_size set: the older reader, labelled <class>/<image> folders, every image resized to one square.
# It lists and decodes files as image_folder does; only the labels' layout and the square differ.


def _class_folders(folder: Path) -> list[str]:
    """The class folders directly under ``folder``, sorted; hidden ones skipped."""
    return sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))


class ImageFolderDataset(ImageDataset):
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


def decode_and_resize(path: str, image_size: int) -> torch.Tensor:
    """Decode an image file to RGB uint8 (:func:`sslkit.datasets.decode.decode_rgb`) and resize it to a square.

    Resizing every image to one size is loading, not augmentation: it is what lets a folder of
    differently sized images form a batch. The aspect ratio is not kept.

    Raises:
        UserError: a file that cannot be read or decoded, named.

    Shape:
        returns: (3, image_size, image_size), uint8.
    """
    try:
        image = decode_rgb(torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8))
    except (OSError, ValueError) as error:  # unreadable, or an empty file (frombuffer of no bytes)
        raise UserError(f"cannot read image {path} ({error}); remove or fix this file") from None
    if image is None:
        raise UserError(f"cannot decode image {path}; remove or fix this file")
    if image.shape[-2:] != (image_size, image_size):
        image = TF.resize(image, [image_size, image_size], antialias=True)
    return image


def resized_image_folder(split: str, root: str | None, image_size: int) -> ImageFolderDataset:
    """Images in ``root/<class>/<image>``, or ``root/train/<class>/...`` and ``root/test/<class>/...``,
    resized to ``image_size`` squares (with ``image_size`` None, :func:`image_folder` reads the folder).

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
    classes = _class_folders(train_dir)
    if not classes:
        raise UserError(f"imagefolder: {train_dir} has no class folders; put the images in <class>/ folders")
    if split == "test":
        unknown = sorted(set(_class_folders(folder)) - set(classes))
        if unknown:
            raise UserError(f"imagefolder: {folder} has classes that {train_dir} lacks: {', '.join(unknown)}")
    samples = []
    for label, name in enumerate(classes):
        found = list_images(folder / name) if (folder / name).is_dir() else []
        if not found and split == "train":
            raise UserError(
                f"imagefolder: the class folder {folder / name} holds no images ({', '.join(IMAGE_EXTENSIONS)})"
            )
        samples += [(str(path), label) for path in found]
    if not samples:
        raise UserError(f"imagefolder: no images ({', '.join(IMAGE_EXTENSIONS)}) under {folder}")
    return ImageFolderDataset(samples, classes, image_size)
