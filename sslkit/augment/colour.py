"""Colour jitter on whole float batches, torchvision's four colour steps with per-sample factors.

Each step matches ``torchvision.transforms.functional`` (brightness, contrast, saturation, hue)
to rounding, but takes a vector of factors, one per image, so one call jitters a batch.
:class:`ColorJitter` draws the factors and the order of the steps with kornia's generator.
"""

from __future__ import annotations

import torch
from kornia.augmentation.random_generator import ColorJitterGenerator
from torch import nn

# torchvision's luma weights (``rgb_to_grayscale``), so the colour steps match it to rounding.
_LUMA = (0.2989, 0.587, 0.114)


def _luma(images: torch.Tensor) -> torch.Tensor:
    red, green, blue = images.unbind(1)
    return (_LUMA[0] * red + _LUMA[1] * green + _LUMA[2] * blue).unsqueeze(1)  # (N, 1, H, W)


def _per_sample(factor: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    return factor.to(images.device, images.dtype, non_blocking=True).view(-1, 1, 1, 1)  # (N, 1, 1, 1)


def adjust_brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's brightness: ``clamp(x * f)``. Shape: images (N, C, H, W); factor (N,)."""
    return (images * _per_sample(factor, images)).clamp_(0.0, 1.0)


def adjust_contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's contrast: blend with the mean luma of each image. Shape: images (N, C, H, W); factor (N,)."""
    grey = _luma(images) if images.shape[1] == 3 else images
    mean = grey.mean(dim=(1, 2, 3), keepdim=True)  # (N, 1, 1, 1)
    return torch.lerp(mean, images, _per_sample(factor, images)).clamp_(0.0, 1.0)


def adjust_saturation(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's saturation: blend with the luma image. Shape: images (N, 3, H, W); factor (N,)."""
    return torch.lerp(_luma(images), images, _per_sample(factor, images)).clamp_(0.0, 1.0)


def adjust_hue(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's hue: rotate the HSV hue of image i by ``factor[i]`` turns of the colour circle.

    A hue rotation keeps each pixel's max ``M`` and min ``m``. With ``C = M - m`` and the hue
    ``h`` in sextants, HSV -> RGB is ``channel_n = M - C * clamp(min(k, 4 - k), 0, 1)`` with
    ``k = (n + h) mod 6`` and n = 5, 3, 1 for R, G, B, so no HSV image is built.

    Shape:
        images: (N, 3, H, W) in [0, 1]; factor: (N,) in [-0.5, 0.5]; returns (N, 3, H, W).
    """
    red, green, blue = images.unbind(1)  # (N, H, W) each
    top = images.amax(1)
    chroma = top - images.amin(1)
    # Hue in sextants, in [-1, 5]: the channel holding the max picks the sector, red first on
    # ties, as in torchvision's RGB -> HSV. The sectors are blended with 0/1 masks because
    # torch.where measured 3.5x slower than a cast and a lerp on a CPU.
    hue = torch.lerp(
        torch.add(red - green, chroma, alpha=4),
        torch.add(blue - red, chroma, alpha=2),
        (top == green).to(images.dtype),
    )
    hue = torch.lerp(hue, green - blue, (top == red).to(images.dtype))
    # A grey pixel has chroma 0 and numerator 0: the clamp turns 0/0 into hue 0 (it comes out as M).
    hue = hue.div_(chroma.clamp_min(1e-12)).add_(6 * _per_sample(factor, images).view(-1, 1, 1))
    out = torch.empty_like(images)
    for channel, offset in enumerate((5.0, 3.0, 1.0)):
        k = torch.remainder(hue + offset, 6.0)
        weight = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
        torch.addcmul(top, chroma, weight, value=-1, out=out[:, channel])
    return out


class ColorJitter(nn.Module):
    """torchvision's ColorJitter on a batch, with per-sample factors.

    kornia's ``ColorJitterGenerator`` draws the factors (brightness, contrast and saturation in
    ``[max(0, 1 - x), 1 + x]``, hue in ``[-x, x]`` turns) and the order of the four steps; the
    steps are torchvision's formulas (:func:`adjust_brightness`, :func:`adjust_contrast`,
    :func:`adjust_saturation`, :func:`adjust_hue`), tested against
    ``torchvision.transforms.v2.functional`` image by image. As in kornia, the order is drawn
    once per call (torchvision draws it per image): each image still sees every order with the
    same probability. A step whose strength is 0 is not run, so brightness and contrast alone
    work on one-channel images.

    Why the steps are written here rather than taken from ``kornia.augmentation.ColorJitter``:
    colour jitter is most of the augmentation's time on a CPU, and kornia's (same draw, same
    formulas) measured 2.8x slower on 512 32x32 images: its hue step converts to HSV and back
    through a dozen full-size intermediates, and it clamps and copies the batch between steps.

    Shape:
        images: (N, C, H, W) in [0, 1], C = 3 when saturation or hue is set; returns the same shape.
    """

    def __init__(
        self, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0, hue: float = 0.0
    ) -> None:
        super().__init__()
        self.draw = ColorJitterGenerator(brightness, contrast, saturation, hue)
        self.draw.set_rng_device_and_dtype(torch.device("cpu"), torch.float32)
        steps = (
            ("brightness_factor", brightness, adjust_brightness),
            ("contrast_factor", contrast, adjust_contrast),
            ("saturation_factor", saturation, adjust_saturation),
            ("hue_factor", hue, adjust_hue),
        )
        # Indexed as kornia's ``order``: 0 brightness, 1 contrast, 2 saturation, 3 hue; None: not run.
        self.steps = [(key, adjust) if strength > 0 else None for key, strength, adjust in steps]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        params = self.draw(images.shape)
        for index in params["order"].tolist():
            if self.steps[index] is not None:
                key, adjust = self.steps[index]
                images = adjust(images, params[key])
        return images

    def extra_repr(self) -> str:
        return repr(self.draw)
