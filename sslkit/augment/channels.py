"""Images of one channel count as another, for an encoder trained on the other: grey <-> RGB.

Image folders and shards decode every file to RGB (grey files too), while an encoder trained on a grey
dataset (Fashion-MNIST, the digits) takes one channel; an encoder trained on RGB images takes three where a
grey dataset has one. :class:`ConvertChannels` runs before the evaluation transform, on the decoded uint8
pixels: RGB to grey by ITU-R BT.601 luma, ``(19595 R + 38470 G + 7471 B + 2^15) >> 16``, PIL's
``convert("L")`` to the bit (by hand: torchvision's ``rgb_to_grayscale`` truncates, so a grey file read as
RGB would come back one level darker); grey to RGB by repeating the channel.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from sslkit.datasets.batches import EncodedBatch, ImageBatch, as_image_batch

CONVERTIBLE = {(3, 1), (1, 3)}  # (images' channels, encoder's channels)
LUMA_WEIGHTS = (19595, 38470, 7471)  # 0.299, 0.587, 0.114 in units of 2^-16, summing to 2^16: grey stays grey


def rgb_to_grey(pixels: torch.Tensor) -> torch.Tensor:
    """ITU-R BT.601 luma, rounded, as PIL computes it.

    Shape:
        pixels: (..., 3, H, W) uint8; returns (..., 1, H, W) uint8.
    """
    weights = torch.tensor(LUMA_WEIGHTS, dtype=torch.int32, device=pixels.device).view(3, 1, 1)
    luma = (pixels.to(torch.int32) * weights).sum(dim=-3, keepdim=True)
    return ((luma + (1 << 15)) >> 16).to(torch.uint8)


class ConvertChannels(nn.Module):
    """``given``-channel images as ``takes``-channel ones.

    Shape:
        images: (B, given, H, W) uint8, or a batch of images of different sizes; returns the same with
        ``takes`` channels.
    """

    def __init__(self, given: int, takes: int) -> None:
        super().__init__()
        if (given, takes) not in CONVERTIBLE:
            raise ValueError(f"no conversion from {given}-channel images to {takes}-channel ones")
        self.given, self.takes = given, takes

    def convert(self, pixels: torch.Tensor) -> torch.Tensor:
        return rgb_to_grey(pixels) if self.takes == 1 else pixels.expand(*pixels.shape[:-3], 3, *pixels.shape[-2:])

    @torch.no_grad()
    def forward(self, images: torch.Tensor | ImageBatch | EncodedBatch) -> torch.Tensor | ImageBatch:
        if isinstance(images, (ImageBatch, EncodedBatch)):
            batch = as_image_batch(images)
            return dataclasses.replace(batch, pixels=self.convert(batch.pixels))
        return self.convert(images)
