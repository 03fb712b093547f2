"""Batches of images of different sizes: padded pixels with each image's own size, or still encoded.

The in-memory datasets hand the accelerator one uint8 tensor ``(B, C, H, W)``. Images read from
files (:mod:`sslkit.datasets.folders`, :mod:`sslkit.datasets.shards`) keep their own size and aspect ratio, so a
batch of them is an :class:`ImageBatch`: the images pasted into the top-left corner of one
zero tensor as large as the largest, with each image's valid ``(height, width)``. The random
resized crops (:mod:`sslkit.augment.crops`) are then drawn on each image's valid region and cut from
its original pixels. When the accelerator decodes (a CUDA device), the loader hands over an
:class:`EncodedBatch` of file bytes instead, and :meth:`EncodedBatch.decode` turns it into an
:class:`ImageBatch` on the device.

Both carry the names of the files found corrupt while the batch was made (``corrupt``), which
:class:`sslkit.datasets.folders.CorruptCount` adds up; each corrupt file was replaced by another image,
so a batch always holds the batch size.

When the loader workers augment (``data.augment_in_workers``, :mod:`sslkit.datasets.augmented`), a
batch leaves them as :class:`AugmentedViews`: the views, ready for the method, and the corrupt names.

All three have ``to(device)``, so Accelerate's loader moves them like a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sslkit.datasets.decode import decode_on_device


def pad_images(images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Paste images of different sizes into one tensor, each in the top-left corner.

    One row and one column past each image's edge repeat its last row and column: a bilinear
    sample in the image's last half pixel (``roi_align``, ``grid_sample``) then reads what it
    would read at the edge of the image alone, never the zero padding.

    Shape:
        images: B tensors (C, H_i, W_i) uint8 on one device.
        returns: pixels (B, C, max H_i, max W_i) uint8, sizes (B, 2) int64 as (H_i, W_i), on the CPU.
    """
    channels = images[0].shape[0]
    height = max(image.shape[-2] for image in images)
    width = max(image.shape[-1] for image in images)
    pixels = images[0].new_zeros(len(images), channels, height, width)
    for out, image in zip(pixels, images):
        h, w = image.shape[-2:]
        out[:, :h, :w] = image
        if w < width:
            out[:, :h, w] = image[:, :, -1]
        if h < height:
            out[:, h, : min(w + 1, width)] = out[:, h - 1, : min(w + 1, width)]
    sizes = torch.tensor([image.shape[-2:] for image in images], dtype=torch.int64)
    return pixels, sizes


@dataclass
class ImageBatch:
    """Decoded images of different sizes, padded to one tensor (:func:`pad_images`).

    Attributes:
        pixels: uint8 images, each in the top-left corner of its slot.
        sizes: each image's valid ``(height, width)``, on the CPU (crop boxes are drawn there).
        corrupt: names of files found corrupt while making this batch (each replaced by another image).

    Shape:
        pixels: (B, 3, H, W) uint8; sizes: (B, 2) int64.
    """

    pixels: torch.Tensor
    sizes: torch.Tensor
    corrupt: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.pixels)

    @property
    def device(self) -> torch.device:
        return self.pixels.device

    def to(self, device, non_blocking: bool = False) -> ImageBatch:
        return ImageBatch(self.pixels.to(device, non_blocking=non_blocking), self.sizes, self.corrupt)

    def pin_memory(self) -> ImageBatch:
        return ImageBatch(self.pixels.pin_memory(), self.sizes, self.corrupt)


@dataclass
class EncodedBatch:
    """File bytes of a batch, to be decoded on the accelerator (:func:`sslkit.datasets.decode.decode_on_device`).

    ``to(device)`` only records where to decode: nvJPEG reads the bytes from host memory.

    Attributes:
        data: each file's bytes, on the CPU.
        names: each file's name, for the corrupt count.
        max_size: the longest side kept at decode (``data.max_size``).
        target: the device to decode on.
        corrupt: names of files found corrupt while reading this batch.
    """

    data: list[torch.Tensor]
    names: list[str]
    max_size: int | None = None
    target: torch.device = torch.device("cpu")
    corrupt: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.data)

    @property
    def device(self) -> torch.device:
        return self.target

    def to(self, device, non_blocking: bool = False) -> EncodedBatch:
        return EncodedBatch(self.data, self.names, self.max_size, torch.device(device), self.corrupt)

    def decode(self) -> ImageBatch:
        """The decoded batch on ``target``; a corrupt file is replaced by the batch's previous good image."""
        images = decode_on_device(self.data, self.target, self.max_size)
        good = [i for i, image in enumerate(images) if image is not None]
        if not good:
            raise ValueError(f"no image of this batch could be decoded: {', '.join(self.names[:3])}")
        corrupt = tuple(name for name, image in zip(self.names, images) if image is None)
        # Why the previous good image: the batch must keep its size (every process steps together);
        # the loader's replacement (the next file) would need another read.
        images = [images[max([g for g in good if g <= i], default=good[0])] for i in range(len(images))]
        pixels, sizes = pad_images(images)
        return ImageBatch(pixels, sizes, self.corrupt + corrupt)


@dataclass
class AugmentedViews:
    """A batch already augmented in a loader worker: its views, and the files found corrupt while making it.

    Attributes:
        views: one float tensor per view, as :class:`sslkit.augment.TwoViewAugment` returns them.
        corrupt: names of files found corrupt while making this batch (each replaced by another image).

    Shape:
        views: V tensors (B, C, S, S) float32.
    """

    views: tuple[torch.Tensor, ...]
    corrupt: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.views[0])

    def to(self, device, non_blocking: bool = False) -> AugmentedViews:
        return AugmentedViews(tuple(view.to(device, non_blocking=non_blocking) for view in self.views), self.corrupt)

    def pin_memory(self) -> AugmentedViews:
        return AugmentedViews(tuple(view.pin_memory() for view in self.views), self.corrupt)


def as_image_batch(images: ImageBatch | EncodedBatch) -> ImageBatch:
    """An :class:`ImageBatch`, decoding an :class:`EncodedBatch` on its device first."""
    return images.decode() if isinstance(images, EncodedBatch) else images
