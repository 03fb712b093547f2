"""Augmentation on the accelerator: SimCLR's views, multi-crop's local views and the evaluation transform.

- :mod:`sslkit.augment.views`   the view pipelines (:class:`TwoViewAugment`, :class:`EvalTransform`) and
  the batched resized crop they share.
- :mod:`sslkit.augment.crops`   crop boxes drawn on each image's own size (torchvision's sampling).
- :mod:`sslkit.augment.colour`  torchvision's colour steps with one factor per image (:class:`ColorJitter`).
- :mod:`sslkit.augment.channels` grey <-> RGB for an encoder of the other kind (:class:`ConvertChannels`).
- :mod:`sslkit.augment.strong`  FixMatch's strong view: RandAugment with per-image ops, then Cutout
  (:class:`StrongAugment`).
"""

from sslkit.augment.colour import (
    ColorJitter,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
)
from sslkit.augment.crops import centre_boxes, random_resized_boxes
from sslkit.augment.strong import StrongAugment
from sslkit.augment.views import (
    SUPPORTED_CHANNELS,
    EvalTransform,
    Normalize,
    TwoViewAugment,
    ViewGroup,
    crop_padded,
    kernel_size_for,
    resized_crop,
)

__all__ = [
    "SUPPORTED_CHANNELS",
    "ColorJitter",
    "EvalTransform",
    "Normalize",
    "StrongAugment",
    "TwoViewAugment",
    "ViewGroup",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "centre_boxes",
    "crop_padded",
    "kernel_size_for",
    "random_resized_boxes",
    "resized_crop",
]
