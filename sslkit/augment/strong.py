"""FixMatch's strong augmentation on whole float batches: RandAugment with per-image ops, then Cutout.

FixMatch (Sohn et al. 2020, https://arxiv.org/abs/2001.07685, section 2.3 and table 12) makes its
strong view with a variant of RandAugment (Cubuk et al. 2020, https://arxiv.org/abs/1909.13719):
for every image, ``num_ops`` transformations drawn at random from the pool below, each with a
magnitude drawn at random from its range, then Cutout (DeVries and Taylor 2017,
https://arxiv.org/abs/1708.04552): a square of half the image side set to grey.

The pool, with the paper's ranges (the value that leaves the image as it is in brackets)::

    identity                                   autocontrast       equalize
    brightness, colour, contrast, sharpness    factor in [0.05, 0.95]  (1)     colour: RGB only
    posterize                                  bits in [4, 8]          (8)
    solarize                                   threshold in [0, 1]     (1: PIL's 256)
    rotate                                     degrees in [-30, 30]    (0)
    shear x, shear y                           [-0.3, 0.3]             (0)
    translate x, translate y                   fraction of the side in [-0.3, 0.3]  (0)

``magnitude`` in [0, 1] narrows every range towards its identity value (1: the paper's ranges;
0: only autocontrast and equalize, which have no magnitude, and Cutout change the image). Empty
corners of the geometric ops are black, as PIL's.

The ops are kornia's (``kornia.enhance``: equalize, posterize, sharpness, solarize;
``kornia.geometry.transform``: rotate, shear, translate) and sslkit's torchvision-formula colour
steps (:mod:`sslkit.augment.colour`: PIL's brightness, colour and contrast); Cutout is kornia's
``RandomErasing`` with a fixed square. Why not ``kornia.augmentation.auto.RandAugment``: it applies
the same ops, at one fixed magnitude, to the whole batch, where FixMatch draws both per image. So
each op runs on the images that drew it (gather, op, scatter), with their own magnitudes, and every
draw is made on the CPU whatever the device, as :mod:`sslkit.augment.views` does.

>>> strong = StrongAugment(channels=1)
>>> strong(torch.rand(4, 1, 16, 16)).shape
torch.Size([4, 1, 16, 16])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import kornia.augmentation as K
import torch
from kornia.enhance import equalize, posterize, sharpness, solarize
from kornia.geometry.transform import rotate, shear, translate
from torch import nn

from sslkit.augment.colour import adjust_brightness, adjust_contrast, adjust_saturation


@dataclass(frozen=True)
class Op:
    """One transformation of the pool: ``apply(images, values)``, ``values`` drawn in ``[low, high]``.

    Shape:
        images: (n, C, H, W) float in [0, 1]; values: (n,) on the images' device; returns (n, C, H, W).
    """

    name: str
    apply: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    low: float = 0.0
    high: float = 0.0
    identity: float = 0.0

    def draw(self, uniform: torch.Tensor, magnitude: float) -> torch.Tensor:
        """Values from ``uniform`` draws in [0, 1): uniform over the range narrowed to ``magnitude`` of it,
        ``identity + magnitude (low + u (high - low) - identity)``."""
        value = self.low + uniform * (self.high - self.low)
        return self.identity + magnitude * (value - self.identity)


# Each op is ``op(images, values)``, a module-level function (picklable, for loader workers that augment).


def _identity(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return images


def _autocontrast(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """PIL's autocontrast: each channel of each image stretched to [0, 1] (a flat channel stays as it is)."""
    low, high = images.amin((2, 3), keepdim=True), images.amax((2, 3), keepdim=True)
    spread = high - low
    return torch.where(spread > 0, (images - low) / spread.clamp_min(1e-12), images)


def _equalize(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return equalize(images)


def _posterize(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return posterize(images, values.round().to(torch.int32))


def _rotate(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return rotate(images, values)


def _sharpness(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return sharpness(images, values)


def _solarize(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    # PIL's threshold runs to 256, which inverts nothing; in [0, 1] units that is 256 / 255.
    return solarize(images, values * (256 / 255))


def _per_axis(values: torch.Tensor, axis: int, images: torch.Tensor) -> torch.Tensor:
    """(n, 2) pairs (x, y) with ``values`` on ``axis`` (0: x, 1: y) and 0 on the other."""
    pairs = torch.zeros(len(values), 2, device=images.device, dtype=images.dtype)
    pairs[:, axis] = values
    return pairs


def _shear_x(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return shear(images, _per_axis(values, 0, images))


def _shear_y(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return shear(images, _per_axis(values, 1, images))


def _translate_x(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return translate(images, _per_axis(values * images.shape[-1], 0, images))


def _translate_y(images: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return translate(images, _per_axis(values * images.shape[-2], 1, images))


def fixmatch_pool(channels: int) -> list[Op]:
    """The paper's pool (table 12) for images of ``channels`` channels: colour only for RGB."""
    pool = [
        Op("identity", _identity),
        Op("autocontrast", _autocontrast),
        Op("brightness", adjust_brightness, 0.05, 0.95, 1.0),
        Op("contrast", adjust_contrast, 0.05, 0.95, 1.0),
        Op("equalize", _equalize),
        Op("posterize", _posterize, 4.0, 8.0, 8.0),
        Op("rotate", _rotate, -30.0, 30.0),
        Op("sharpness", _sharpness, 0.05, 0.95, 1.0),
        Op("shear_x", _shear_x, -0.3, 0.3),
        Op("shear_y", _shear_y, -0.3, 0.3),
        Op("solarize", _solarize, 0.0, 1.0, 1.0),
        Op("translate_x", _translate_x, -0.3, 0.3),
        Op("translate_y", _translate_y, -0.3, 0.3),
    ]
    if channels == 3:
        pool.insert(3, Op("colour", adjust_saturation, 0.05, 0.95, 1.0))
    return pool


class StrongAugment(nn.Module):
    """RandAugment as FixMatch draws it (per image: ``num_ops`` ops of the pool, each at a random magnitude),
    then Cutout of a grey square ``cutout`` x the side.

    Args:
        channels: 1 (grey) or 3 (RGB); grey images get no colour op.
        num_ops: ops drawn for each image, with replacement (FixMatch: 2); 0: Cutout alone.
        magnitude: the share of each op's range the draws span, in [0, 1] (1: the paper's ranges).
        cutout: the side of the grey square as a fraction of the image side, in [0, 1) (FixMatch: 0.5; 0: none).

    Shape:
        images: (N, C, H, W) float in [0, 1]; returns the same shape, in [0, 1].
    """

    def __init__(self, channels: int, num_ops: int = 2, magnitude: float = 1.0, cutout: float = 0.5) -> None:
        super().__init__()
        if num_ops < 0 or not 0.0 <= magnitude <= 1.0 or not 0.0 <= cutout < 1.0:
            raise ValueError(
                f"num_ops must be >= 0, magnitude in [0, 1] and cutout in [0, 1), got {num_ops}, {magnitude}, {cutout}"
            )
        self.pool = fixmatch_pool(channels)
        self.num_ops, self.magnitude, self.cutout = num_ops, magnitude, cutout
        area = cutout * cutout
        self.erase = K.RandomErasing(scale=(area, area), ratio=(1.0, 1.0), value=0.5, p=1.0) if cutout > 0 else None

    @torch.no_grad()
    def forward(self, images: torch.Tensor, first: int = 0) -> torch.Tensor:
        """The strong view of ``images[first:]``; the rows before ``first`` get none (FixMatch's labelled images).

        Every random number is drawn for all of ``images``, the rows before ``first`` included: the draws depend on
        the batch's size alone, so a row's strong view is the same whichever rows before it are left out.

        Shape:
            images: (N, C, H, W) float in [0, 1]; returns (N - first, C, H, W), in [0, 1].
        """
        x, count = images[first:].clone(), images.shape[0]
        for _ in range(self.num_ops):
            # Every draw is made whatever ops are picked, so the random stream does not depend on the images.
            choice = torch.randint(len(self.pool), (count,))[first:]  # (N - first,) on the CPU
            uniform = torch.rand(count)[first:]  # (N - first,)
            for number, op in enumerate(self.pool):
                chosen = (choice == number).nonzero().squeeze(1)  # (n,)
                if chosen.numel() == 0 or op.name == "identity":
                    continue
                values = op.draw(uniform[chosen], self.magnitude).to(x.device, x.dtype, non_blocking=True)
                index = chosen.to(x.device, non_blocking=True)
                x.index_copy_(0, index, op.apply(x.index_select(0, index), values).clamp_(0.0, 1.0))
        if self.erase is None:
            return x
        drawn = self.erase.forward_parameters(images.shape)  # kornia's parameters of Cutout for every row
        return self.erase(x, params=_rows_from(drawn, first, x.shape))

    def extra_repr(self) -> str:
        ops = ", ".join(op.name for op in self.pool)
        return f"num_ops={self.num_ops}, magnitude={self.magnitude}, cutout={self.cutout}, pool: {ops}"


def _rows_from(params: dict[str, torch.Tensor], first: int, shape: torch.Size) -> dict[str, torch.Tensor]:
    """Kornia's per-row ``params`` of a batch, for its rows from ``first`` on (a batch of ``shape``)."""
    rows = {name: value[first:] for name, value in params.items() if name != "forward_input_shape"}
    return {**rows, "forward_input_shape": torch.tensor(shape)}
