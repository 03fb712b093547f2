"""A whole dataset held in memory as one uint8 tensor: the small standard datasets.

CIFAR-10 is 150 MB as uint8, STL-10's unlabelled split 2.6 GB: small enough to hold whole, and
``__getitems__`` then fetches a batch with one indexing operation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sslkit.datasets.base import DatasetInfo, ImageDataset


class ImageTensorDataset(ImageDataset):
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
