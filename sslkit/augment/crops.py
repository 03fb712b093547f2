"""Crop boxes on images of different sizes: torchvision's random resized crop, and the centre crop.

Each box is drawn on its own image's full size and aspect ratio, so a 600 x 200 panorama gets
the same distribution of crops that ``torchvision.transforms.RandomResizedCrop`` would give it,
not the crops of a squashed square. The boxes are then cut out of the original pixels by
:func:`sslkit.augment.resized_crop` (one ``roi_align`` / ``grid_sample`` call for the batch).

:func:`random_resized_boxes` follows ``RandomResizedCrop.get_params`` [0] exactly, vectorised
over the batch: for an ``H x W`` image, up to 10 attempts draw

.. math::

    a \\sim U(s_0, s_1) \\cdot HW, \\quad r = \\exp(U(\\log r_0, \\log r_1)),
    \\quad w = \\mathrm{round}(\\sqrt{a r}), \\quad h = \\mathrm{round}(\\sqrt{a / r})

and the first attempt with ``0 < w <= W`` and ``0 < h <= H`` is kept, its top-left corner
uniform over the positions where it fits. When all 10 fail, the box is the largest centred
one whose aspect ratio is clamped to ``[r_0, r_1]``. All draws come from the torch CPU RNG,
so a resumed run (whose RNG state is restored) draws the same boxes.

References:
    [0] torchvision ``transforms.RandomResizedCrop.get_params`` (v0.29).

>>> boxes = random_resized_boxes(torch.tensor([[100, 300], [40, 40]]), (0.08, 1.0), (3 / 4, 4 / 3))
>>> boxes.shape
torch.Size([2, 4])
"""

from __future__ import annotations

import math

import torch

ATTEMPTS = 10  # torchvision's


def random_resized_boxes(
    sizes: torch.Tensor, scale: tuple[float, float], ratio: tuple[float, float], attempts: int = ATTEMPTS
) -> torch.Tensor:
    """One random resized crop box per image, drawn as torchvision's ``RandomResizedCrop`` draws it.

    Args:
        sizes: each image's ``(height, width)``.
        scale: ``[low, high]`` of the box's area as a fraction of the image's.
        ratio: ``[low, high]`` of the box's aspect ratio (width / height).
        attempts: draws before the centred fallback (torchvision: 10).

    Shape:
        sizes: (N, 2) int64 on the CPU; returns (N, 4) float32 inclusive corners ``x0, y0, x1, y1``
        (the box is ``image[y0:y1 + 1, x0:x1 + 1]``).
    """
    height, width = sizes[:, :1].double(), sizes[:, 1:].double()  # (N, 1) each
    area = height * width
    target = area * torch.empty(len(sizes), attempts, dtype=torch.float64).uniform_(*scale)  # (N, A)
    log_ratio = torch.empty_like(target).uniform_(math.log(ratio[0]), math.log(ratio[1]))
    aspect = torch.exp(log_ratio)
    box_w = torch.round(torch.sqrt(target * aspect))  # (N, A)
    box_h = torch.round(torch.sqrt(target / aspect))
    fits = (box_w > 0) & (box_w <= width) & (box_h > 0) & (box_h <= height)  # (N, A)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)  # (N, 1): the first attempt that fits
    box_w, box_h = box_w.gather(1, first), box_h.gather(1, first)  # (N, 1)
    # Top-left corner: uniform over the H - h + 1 rows and W - w + 1 columns where the box fits.
    top = torch.floor(torch.rand(len(sizes), 1, dtype=torch.float64) * (height - box_h + 1))
    left = torch.floor(torch.rand(len(sizes), 1, dtype=torch.float64) * (width - box_w + 1))
    found = fits.any(dim=1, keepdim=True)  # (N, 1)
    fallback = _central_fallback(height, width, ratio)
    left, top, box_w, box_h = (
        torch.where(found, drawn, kept) for drawn, kept in zip((left, top, box_w, box_h), fallback)
    )
    return torch.cat([left, top, left + box_w - 1, top + box_h - 1], dim=1).float()  # (N, 4)


def _central_fallback(height: torch.Tensor, width: torch.Tensor, ratio: tuple[float, float]):
    """torchvision's box when no attempt fits: the whole image, its aspect clamped to ``ratio``, centred.

    Shape:
        height, width: (N, 1) float64; returns left, top, w, h, each (N, 1).
    """
    in_ratio = width / height
    box_w = torch.where(
        in_ratio < ratio[0], width, torch.where(in_ratio > ratio[1], torch.round(height * ratio[1]), width)
    )
    box_h = torch.where(in_ratio < ratio[0], torch.round(width / ratio[0]), height)
    # int((H - h) / 2) in torchvision: truncation, equal to floor for the non-negative values here.
    return torch.floor((width - box_w) / 2), torch.floor((height - box_h) / 2), box_w, box_h


def centre_boxes(sizes: torch.Tensor) -> torch.Tensor:
    """The central square of each image: resize-shorter-side-to-S then centre-crop-S, as one box.

    Resizing the shorter side to ``S`` and cutting the central ``S x S`` keeps the central
    ``min(H, W)`` square of the original, so cropping that square and resizing it to ``S``
    gives the same view up to rounding (the standard evaluation transform at crop fraction 1).

    Shape:
        sizes: (N, 2) int64 (height, width); returns (N, 4) float32 inclusive corners ``x0, y0, x1, y1``.
    """
    height, width = sizes[:, 0].double(), sizes[:, 1].double()
    side = torch.minimum(height, width)
    left, top = torch.round((width - side) / 2), torch.round((height - side) / 2)
    return torch.stack([left, top, left + side - 1, top + side - 1], dim=1).float()
