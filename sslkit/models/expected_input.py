"""The images a trained backbone expects, as sslkit's evaluation transform makes them, written into every export
(:mod:`sslkit.models.export`) and applied when one is loaded back.

sslkit's evaluation transform (``sslkit.augment.EvalTransform``) scales uint8 pixels to [0, 1],
resizes the image to the training crop's side S (bilinear, antialiased when shrinking; images of
their own sizes: the shorter side to S, then the central S x S) and normalises with the training
data's mean and std. :class:`ExpectedInput` holds those numbers, as text key/values and as timm's
``pretrained_cfg`` words; :class:`Preprocess` applies them, and on square images gives what the
evaluation transform gives, value for value (written here rather than imported: the augmentation
reads the recipe, and the models must not).

>>> expected = ExpectedInput(channels=1, image_size=16, mean=(0.3,), std=(0.4,))
>>> Preprocess(expected)(torch.zeros(2, 1, 8, 8, dtype=torch.uint8)).shape
torch.Size([2, 1, 16, 16])
>>> ExpectedInput.from_metadata(expected.to_metadata()) == expected
True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ExpectedInput:
    """The images a backbone expects, as sslkit's evaluation transform (``sslkit.augment.EvalTransform``)
    makes them: pixels scaled to [0, 1], the central square of each image resized to ``image_size`` (bilinear,
    antialiased when shrinking; timm's ``crop_pct=1.0, crop_mode="center"``), then
    ``(x - mean) / std`` per channel when ``normalize``.

    Attributes:
        channels: 1 (grey) or 3 (RGB).
        image_size: the side S of the square the network sees.
        mean: per-channel mean of the training data in [0, 1] units (the dataset's own statistics).
        std: per-channel standard deviation in [0, 1] units.
        normalize: whether the run normalised with ``mean`` and ``std`` (``augment.normalize``).
        interpolation: how images are resized (timm's and torchvision's name).
        crop_pct: the fraction of the resized shorter side that is kept (1: all of it).
        crop_mode: which part is kept (timm's name): the centre.
    """

    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    normalize: bool = True
    interpolation: str = "bilinear"
    crop_pct: float = 1.0
    crop_mode: str = "center"

    def normalisation(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The mean and std the images are normalised with: the data's, or 0 and 1 when ``normalize`` is off."""
        if self.normalize:
            return tuple(self.mean), tuple(self.std)
        return (0.0,) * self.channels, (1.0,) * self.channels

    def to_metadata(self) -> dict[str, str]:
        """``input.<field>``: words as they are, numbers, switches and lists as JSON (``0.3``, ``true``, ``[0.3]``)."""
        return {
            f"input.{key}": value if isinstance(value, str) else json.dumps(value)
            for key, value in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_metadata(cls, metadata: dict[str, str]) -> ExpectedInput:
        values = {}
        for item in dataclasses.fields(cls):
            text = metadata[f"input.{item.name}"]
            values[item.name] = text if item.type == "str" else json.loads(text)
        return cls(**{**values, "mean": tuple(values["mean"]), "std": tuple(values["std"])})

    def timm_data_config(self) -> dict:
        """These images in timm's words: what ``timm.data.resolve_data_config`` reads from ``pretrained_cfg``."""
        mean, std = self.normalisation()
        size = (self.channels, self.image_size, self.image_size)
        data = {"input_size": size, "interpolation": self.interpolation, "crop_pct": self.crop_pct}
        return {**data, "crop_mode": self.crop_mode, "mean": mean, "std": std}


class Preprocess(nn.Module):
    """Images as an export expects them (:class:`ExpectedInput`): scaled to [0, 1], the central square resized
    to S, normalised. On square images this is sslkit's evaluation transform, value for value; of others it
    keeps the central square, as that transform does for images of their own sizes (to rounding).

    Shape:
        images: (N, C, H, W) uint8 (0 to 255) or float (0 to 1); returns (N, C, S, S) float32.
    """

    def __init__(self, expected: ExpectedInput) -> None:
        super().__init__()
        self.expected = expected
        mean, std = expected.normalisation()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] != self.expected.channels:
            raise ValueError(
                f"expected images of shape (N, {self.expected.channels}, H, W), got {tuple(images.shape)}"
            )
        x = images.to(torch.float32).div_(255.0) if images.dtype == torch.uint8 else images.to(torch.float32)
        height, width = x.shape[-2:]
        side = min(height, width)
        # Python's round (half to even), as torchvision's CenterCrop and sslkit's centre boxes round.
        top, left = round((height - side) / 2), round((width - side) / 2)
        x = x[..., top : top + side, left : left + side]
        size = self.expected.image_size
        if side != size:
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=side > size)
        return (x - self.mean).div_(self.std) if self.expected.normalize else x
