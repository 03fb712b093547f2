"""What every dataset declares, and the pieces they share.

Every dataset returns images as uint8 tensors ``(C, H, W)`` and labels as int64 (``-1`` for
unlabelled samples). Nothing is augmented here: two-view augmentation runs later, on the
accelerator, on the whole batch at once (:mod:`sslkit.augment`). DataLoader workers therefore do
no per-sample Python work: a dataset fetches a whole batch in ``__getitems__`` (PyTorch's fetcher
calls it), and :func:`collate_batch` passes that batch through unchanged.

The declared interface, which the splits, the samplers and the training loop rely on:

- :class:`ImageSource` (a ``typing.Protocol``): what any training set has, streamed or not:
  ``labels``, ``classes``, ``info``, ``len()``, and whether it reads encoded files
  (``reads_files``; such a set can hand its bytes to the accelerator, ``decode_on_device``).
- :class:`ImageDataset` (a base class): a map-style :class:`ImageSource` that can also be
  cut (``subset``), relabelled (``with_labels``) and split by class (``select_classes``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch.utils.data import Dataset

from sslkit.datasets.batches import AugmentedViews, EncodedBatch, ImageBatch
from sslkit.errors import UserError

# ImageNet's per-channel statistics in [0, 1] units: the usual stand-in for a folder of images whose
# statistics are unknown without decoding it all.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


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


class ImageSource(Protocol):
    """What a training set provides, whether it is indexed or streamed.

    Attributes:
        labels: class index of every sample, -1 for unlabelled ones.
        classes: class names; ``classes[k]`` names label ``k`` (empty when unlabelled).
        info: channels, native size, class count and normalisation statistics.
        reads_files: whether batches come from encoded files, whose bytes can instead be handed to the
            accelerator to decode (``decode_on_device``).
        decode_on_device: set to hand over :class:`~sslkit.datasets.batches.EncodedBatch` es of file bytes.

    Shape:
        labels: (N,) int64.
    """

    labels: torch.Tensor
    classes: list[str]
    info: DatasetInfo
    reads_files: ClassVar[bool]
    decode_on_device: bool

    def __len__(self) -> int: ...


class ImageDataset(Dataset, abc.ABC):
    """A map-style :class:`ImageSource`: samples by index, and the cuts the splits make.

    A subclass sets ``labels``, ``classes`` and ``info``, returns ``(image, label)`` from
    ``__getitem__``, and makes its own :meth:`subset` and :meth:`with_labels`. It may fetch whole
    batches faster by overriding :meth:`__getitems__`.
    """

    labels: torch.Tensor
    classes: list[str]
    info: DatasetInfo
    reads_files: ClassVar[bool] = False
    decode_on_device: bool = False

    def __len__(self) -> int:
        return len(self.labels)

    @abc.abstractmethod
    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One image ``(C, H, W)`` uint8 and its label, an int64 scalar tensor."""

    def __getitems__(self, indices: Sequence[int]):
        """A batch: images ``(B, C, H, W)`` (or a batch of images of different sizes) and labels ``(B,)``."""
        return collate_batch([self[int(i)] for i in indices])

    @abc.abstractmethod
    def subset(self, indices: Sequence[int] | torch.Tensor) -> ImageDataset:
        """A new dataset of the given samples (labels and class names unchanged)."""

    @abc.abstractmethod
    def with_labels(self, labels: torch.Tensor) -> ImageDataset:
        """The same images with other labels (-1: unlabelled), e.g. only a labelled subset's."""

    def select_classes(self, classes: Iterable[int], keep: bool = True) -> ImageDataset:
        """The samples of ``classes`` (``keep=True``) or of every other class (``keep=False``).

        Labels keep their original values, so held-out classes stay distinguishable from the
        rest. Unlabelled samples (-1) belong to no class: they are kept only when ``keep=False``.
        """
        return self.subset(class_indices(self.labels, classes, self.info.num_classes, keep))


def class_indices(labels: torch.Tensor, classes: Iterable[int], num_classes: int, keep: bool) -> torch.Tensor:
    """Indices of the samples whose label is (``keep``) or is not (not ``keep``) in ``classes``."""
    classes = [int(c) for c in classes]
    for c in classes:
        if not 0 <= c < num_classes:
            raise UserError(f"class {c} does not exist: this dataset's classes are 0..{num_classes - 1}")
    chosen = torch.isin(labels, torch.tensor(classes, dtype=torch.int64))
    return torch.nonzero(chosen if keep else ~chosen).flatten()


class WithIndices(Dataset):
    """``dataset`` whose batches also carry each sample's position in it: ``(images, labels, indices)``.

    For methods that keep per-sample state (NPID's memory bank: ``needs_indices``).
    """

    def __init__(self, dataset: ImageDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        images, labels = self.dataset.__getitems__(indices)
        return images, labels, torch.as_tensor(indices, dtype=torch.int64)


def collate_batch(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """DataLoader ``collate_fn``: pass a batch from ``__getitems__`` through, else stack samples.

    Args:
        batch: ``(images, labels)`` already batched by ``__getitems__`` (images a tensor or, for
            images of different sizes or views made in the workers, a :mod:`sslkit.datasets.batches`
            batch), or a list of ``(image, label)`` samples.

    Shape:
        returns: images (B, C, H, W) uint8, labels (B,) int64.
    """
    if (
        isinstance(batch, tuple)
        and len(batch) in (2, 3)
        and (
            isinstance(batch[0], (ImageBatch, EncodedBatch, AugmentedViews))
            or isinstance(batch[0], torch.Tensor)
            and batch[0].dim() == 4
        )
    ):
        return batch
    images, labels = zip(*batch)
    return torch.stack(images), torch.stack([torch.as_tensor(label, dtype=torch.int64) for label in labels])
