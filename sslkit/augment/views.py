"""SimCLR's two views, and multi-crop's local views, of whole uint8 batches, on the device the batch is on.

Images reach the accelerator as uint8 and are augmented there with per-sample random
parameters, so data-loader workers only decode and collate. Per view, in order (SimCLR [0]
appendix A; BYOL [1] table 6 for the asymmetric blur and solarize)::

    uint8 -> float in [0, 1]
    RandomResizedCrop(S, scale, ratio)        may upsample small images (8x8 digits -> 16)
                                              (view 2: crop_scale_view2)
    horizontal flip                           p = hflip_p
    ColorJitter(brightness, contrast,
                saturation, hue)              p = jitter_p, the four steps in random order
                                              (view 2: jitter_p_view2)
    RandomGrayscale                           p = grayscale_p
    GaussianBlur(kernel, sigma)               p = blur_p      (view 2: blur_p_view2)
    Solarize(threshold 0.5)                   p = solarize_p  (view 2: solarize_p_view2)
    Normalize(mean, std)                      if normalize

kornia draws every random parameter (crop boxes with torchvision's RandomResizedCrop sampling,
jitter factors and order, blur sigmas) and does the grayscale, blur and solarize. Images of
different sizes (a padded :class:`~sslkit.datasets.batches.ImageBatch` from an image folder or tar shards)
get their crop boxes from :mod:`sslkit.augment.crops` instead, each drawn on its own image's size and
aspect ratio and cut from its original pixels (:func:`crop_padded`). Three
pieces are written here, each for a reason measured and given in its docstring and each tested
against a reference: the crop (:func:`resized_crop`, one ``F.grid_sample`` or antialiased
``torchvision.ops.roi_align`` call), the colour jitter (:class:`ColorJitter`, torchvision's formulas) and
:class:`Normalize`.

Views come in groups (:class:`ViewGroup`), each one pipeline over its (count B, ...) batch: the two
global views at ``image_size``, then, with ``local_views`` (multi-crop, SwAV [2] and DINO [3]), the
local views at ``local_size`` with their own crop scale, drawn after the global views so that these
do not change.

Why it is fast (``tools/bench/augment.py`` measures it against per-image torchvision and a
plain ``nn.Sequential`` of kornia modules):

- The V views of a group are one pipeline over the (VB, ...) batch: a probability that differs
  between the views (``*_view2``) is a per-sample probability, so no op runs twice for the two
  views, and every view of every group crops from the one float copy of the batch.
- The horizontal flip is folded into the crop (see ``ViewGroup._crop_and_flip``).
- Each other random op runs only on the samples its coin selects (gather, op, scatter). kornia
  computes a gated op on the whole batch and blends with ``torch.where``: at
  ``grayscale_p=0.2`` five times the work. The coins are drawn on the CPU, so selecting samples
  never waits for the device. Ops with probability 0 are not built.
- Everything runs under ``torch.no_grad`` (not ``inference_mode``: inference tensors cannot be
  saved for the encoder's backward pass).

Differences from torchvision's per-image pipeline, on purpose:

- The random order of the four jitter steps is drawn once per call, so the images of a batch
  share it; each image still sees every order with the same probability, and the factors are
  drawn per image.
- Near the edge of a crop, bilinear samples blend with the pixels just outside it (the crop is
  a window on the image, see :func:`resized_crop`); torchvision repeats the crop's edge pixels.
- Grayscale data (C = 1) stays one channel (``out_channels == 1``): saturation, hue and
  grayscale are the identity on a grey image, so they are skipped rather than computed on three
  copies of it; brightness and contrast apply as usual. The encoder is built with
  ``out_channels`` input channels.

References:
    [0] SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709 (appendix A)
    [1] BYOL, Grill et al. 2020, https://arxiv.org/abs/2006.07733 (table 6)
    [2] SwAV, Caron et al. 2020, https://arxiv.org/abs/2006.09882 (section 3.2, multi-crop)
    [3] DINO, Caron et al. 2021, https://arxiv.org/abs/2104.14294 (section 3.1, appendix: 96 px local views)

>>> augment = TwoViewAugment(AugmentConfig(image_size=16), channels=1, mean=(0.3,), std=(0.3,))
>>> view1, view2 = augment(torch.zeros(4, 1, 8, 8, dtype=torch.uint8))
>>> view1.shape, view2.dtype
(torch.Size([4, 1, 16, 16]), torch.float32)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import kornia.augmentation as K
import torch
import torch.nn.functional as F
from kornia.augmentation.random_generator import ResizedCropGenerator
from torch import nn
from torchvision.ops import roi_align

from sslkit.augment.colour import ColorJitter
from sslkit.augment.crops import centre_boxes, random_resized_boxes
from sslkit.datasets.batches import EncodedBatch, ImageBatch, as_image_batch
from sslkit.schema import AugmentConfig

SUPPORTED_CHANNELS = (1, 3)


def kernel_size_for(image_size: int) -> int:
    """SimCLR's blur kernel: the odd integer nearest to 10% of the image side, at least 3.

    224 -> 23 (as in SimCLR), 96 -> 9, 64 -> 7, 32 -> 3, 16 -> 3.
    """
    nearest_odd = 2 * math.floor((0.1 * image_size - 1) / 2 + 0.5) + 1
    return max(3, nearest_odd)


def _check_channels(channels: int, mean: Sequence[float], std: Sequence[float], normalize: bool) -> None:
    if channels not in SUPPORTED_CHANNELS:
        raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
    if normalize:
        if len(mean) != channels or len(std) != channels:
            raise ValueError(
                f"mean and std need one value per channel ({channels}), got mean={tuple(mean)}, std={tuple(std)}"
            )
        if min(std) <= 0:
            raise ValueError(f"std must be > 0 in every channel, got {tuple(std)}")


def _check_images(images: torch.Tensor, channels: int) -> None:
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != channels:
        raise ValueError(
            f"expected a uint8 batch of shape (B, {channels}, H, W), got {images.dtype} of shape {tuple(images.shape)}"
        )


def _to_unit_float(images: torch.Tensor) -> torch.Tensor:
    return images.to(torch.float32).div_(255.0)


def resized_crop(images: torch.Tensor, boxes: torch.Tensor, image_index: torch.Tensor, size: int) -> torch.Tensor:
    """Crop ``boxes`` out of ``images`` and resize each crop to ``size x size``, in one call.

    Both paths sample bilinearly at pixel centres (as ``F.interpolate(..., align_corners=False)``):

    * every crop at most ``size`` wide and high (CIFAR and Fashion-MNIST at their own size:
      the crop only ever upsamples) -- one ``F.grid_sample`` over affine grids, one sample per
      output pixel. Measured on a CPU, 512 crops 32 -> 32: 3x faster than ``roi_align``, same
      values to 3e-6;
    * otherwise ``torchvision.ops.roi_align`` with ``aligned=True`` and ``sampling_ratio=-1``,
      which averages ``ceil(crop side / size)`` samples per output pixel along each axis, so a
      crop larger than ``size`` is shrunk without aliasing (for a crop up to ``size`` it takes
      the one sample the grid path takes).

    Either is one kernel for the whole batch, where kornia's RandomResizedCrop resizes crop by
    crop in a Python loop (``cropping_mode="slice"``) or warps (``"resample"``), both without
    antialiasing. Measured on a CPU, 512 crops 96 -> 32 through ``roi_align``: 2.7x slower
    than kornia's resample, the price of averaging up to 9 samples per pixel instead of aliasing.

    The box is a window on the image: output pixels within half a source pixel of its edge
    blend with the pixels just outside it, where torchvision's crop-then-resize repeats the
    crop's edge pixels. Inside that band the two agree; a box covering the whole image gives
    exactly ``F.interpolate(images, size, mode="bilinear", align_corners=False)``.

    Args:
        images: float images.
        boxes: inclusive pixel corners ``x0, y0, x1, y1`` of each crop (the crop is
            ``images[..., y0:y1 + 1, x0:x1 + 1]``), on the CPU or on ``images``' device.
        image_index: which image each box crops.
        size: output side.

    Shape:
        images: (B, C, H, W); boxes: (N, 4); image_index: (N,); returns (N, C, size, size).
    """
    # Inclusive pixel indices -> continuous coordinates: pixel x covers [x, x + 1).
    start, extent = boxes[:, :2], boxes[:, 2:] + 1 - boxes[:, :2]  # (N, 2) x, y and width, height
    if bool((extent <= size).all()):
        return _upsampling_crop(images, start, extent, image_index, size)
    regions = torch.cat([image_index[:, None].to(boxes.dtype), start, start + extent], dim=1)  # (N, 5)
    regions = regions.to(images.device, images.dtype, non_blocking=True)
    return roi_align(images, regions, (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)


def _upsampling_crop(
    images: torch.Tensor, start: torch.Tensor, extent: torch.Tensor, image_index: torch.Tensor, size: int
) -> torch.Tensor:
    """:func:`resized_crop` by ``F.grid_sample`` for crops no larger than ``size``.

    Output pixel ``j`` samples the source at ``x0 + (j + 1/2) w / size - 1/2`` (roi_align's
    ``aligned=True`` point); in ``grid_sample``'s normalised coordinates
    (``align_corners=False``) that is the affine map ``u -> (w / W) u + (2 x0 + w) / W - 1``
    of the output coordinate ``u``. ``padding_mode="border"`` clamps the half pixel past the
    image edge as ``roi_align`` does.

    Shape:
        images: (B, C, H, W); start, extent: (N, 2) as (x, y); image_index: (N,); returns (N, C, size, size).
    """
    height, width = images.shape[-2:]
    frame = torch.tensor([width, height], dtype=torch.float32)
    theta = torch.zeros(len(start), 2, 3)  # (N, 2, 3), built on the CPU where the boxes were drawn
    theta[:, [0, 1], [0, 1]] = extent.float() / frame
    theta[:, :, 2] = (2 * start.float() + extent.float()) / frame - 1
    theta = theta.to(images.device, images.dtype, non_blocking=True)
    grid = F.affine_grid(theta, [len(start), images.shape[1], size, size], align_corners=False)  # (N, size, size, 2)
    sources = images.index_select(0, image_index.to(images.device, non_blocking=True))
    return F.grid_sample(sources, grid, mode="bilinear", padding_mode="border", align_corners=False)


def crop_padded(
    batch: ImageBatch, boxes: torch.Tensor, image_index: torch.Tensor, size: int, chunk: int = 64
) -> torch.Tensor:
    """:func:`resized_crop` of boxes on a padded batch of images of different sizes.

    The boxes lie inside each image's valid region, and :func:`sslkit.datasets.batches.pad_images`
    repeats the edge row and column, so each crop reads exactly what it would read from its
    image alone. The uint8 pixels become float ``chunk`` images at a time, trimmed to the
    chunk's largest image: a whole batch of 256 images of 600 x 600 would be 1.1 GB as float.

    Shape:
        batch.pixels: (B, C, H, W) uint8; boxes: (N, 4) inclusive ``x0, y0, x1, y1``; image_index: (N,);
        returns (N, C, size, size) float32 in [0, 1].
    """
    pixels, sizes = batch.pixels, batch.sizes
    out = torch.empty(len(boxes), pixels.shape[1], size, size, device=pixels.device)  # (N, C, S, S)
    for start in range(0, len(pixels), chunk):
        chosen = ((image_index >= start) & (image_index < start + chunk)).nonzero().squeeze(1)  # (n,)
        if chosen.numel() == 0:
            continue
        height, width = (sizes[start : start + chunk] + 1).amax(0).tolist()  # + the repeated edge
        part = _to_unit_float(pixels[start : start + chunk, :, :height, :width])
        crops_ = resized_crop(part, boxes[chosen], image_index[chosen] - start, size)
        out.index_copy_(0, chosen.to(out.device, non_blocking=True), crops_)
    return out


def _apply_to_some(
    op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, probability: torch.Tensor
) -> torch.Tensor:
    """Apply ``op`` to the samples a coin with per-sample ``probability`` selects; keep the rest.

    The coins and indices live on the CPU and travel to ``x``'s device without a sync.

    Shape:
        x: (N, C, H, W); probability: (N,) on the CPU; returns (N, C, H, W).
    """
    chosen = (torch.rand(probability.shape) < probability).nonzero().squeeze(1)  # (n,)
    if chosen.numel() == 0:
        return x
    if chosen.numel() == x.shape[0]:
        return op(x)
    index = chosen.to(x.device, non_blocking=True)
    # In place: x is always this pipeline's own intermediate, never the caller's tensor.
    return x.index_copy_(0, index, op(x.index_select(0, index)))


class Normalize(nn.Module):
    """``(x - mean) / std`` per channel, with the statistics kept on the images' device.

    Why not ``kornia.augmentation.Normalize``: it moves its statistics to the device on every
    call and measured 2.3x slower than this on a CPU.

    Shape:
        images: (N, C, H, W) float; returns the same shape.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        # Not persistent: derived from the dataset, not learned, and kept out of checkpoints.
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.mean).div_(self.std)

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


class ViewGroup(nn.Module):
    """``count`` views of every image at ``size`` x ``size``: one pipeline over the (count B, ...) batch.

    The views of a group share every op; a probability may differ between them (per-sample coins),
    as may the crop scale (one box generator per scale, each drawing an equal share of the views).

    Args:
        cfg: the recipe's augmentation section (jitter strengths, blur kernel and sigma, crop ratio, flip).
        channels: input channels, 1 (grey) or 3 (RGB).
        count: views of each image in this group.
        size: the views' side in pixels.
        crop_scales: one ``(low, high)`` for every view, or one per view.
        probabilities: ``{step: per-view probabilities}`` for ``jitter``, ``grayscale``, ``blur`` and
            ``solarize``. A step is built when any probability given is above 0, and view v uses
            entry v: a group of fewer views than entries draws the same coins as the full group would
            for its first views (one view of the two-view set, for fine-tuning).

    Shape:
        images: (B, C, H, W) float in [0, 1], or a padded :class:`ImageBatch` of B uint8 images;
        returns (count B, C, size, size) float32, view 1 of every image first.
    """

    def __init__(
        self,
        cfg: AugmentConfig,
        channels: int,
        count: int,
        size: int,
        crop_scales: Sequence[tuple[float, float]],
        probabilities: dict[str, Sequence[float]],
    ) -> None:
        super().__init__()
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        if count % len(crop_scales):
            raise ValueError(f"crop_scales must give one scale or one per view ({count}), got {len(crop_scales)}")
        self.cfg, self.count, self.size = cfg, count, size
        self.crop_scales = [tuple(scale) for scale in crop_scales]
        self.crop_boxes = nn.ModuleList(
            ResizedCropGenerator((size, size), scale=scale, ratio=tuple(cfg.crop_ratio)) for scale in self.crop_scales
        )
        for generator in self.crop_boxes:
            generator.set_rng_device_and_dtype(torch.device("cpu"), torch.float32)

        rgb = channels == 3
        # Each step: (name, op applied to every sample it gets, per-view probabilities).
        steps: list[tuple[str, nn.Module, tuple[float, ...]]] = []

        def add(name: str, op: nn.Module) -> None:
            if any(p > 0 for p in probabilities[name]):
                steps.append((name, op, tuple(probabilities[name])))

        saturation, hue = (cfg.saturation, cfg.hue) if rgb else (0.0, 0.0)
        if any(f > 0 for f in (cfg.brightness, cfg.contrast, saturation, hue)):
            add("jitter", ColorJitter(cfg.brightness, cfg.contrast, saturation, hue))
        if rgb:
            add("grayscale", K.RandomGrayscale(p=1.0))
        if cfg.blur_kernel and (cfg.blur_kernel < 3 or cfg.blur_kernel % 2 == 0):
            raise ValueError(
                f"blur_kernel must be 0 (10% of image_size) or an odd integer >= 3, got {cfg.blur_kernel}"
            )
        kernel = cfg.blur_kernel or kernel_size_for(size)
        add("blur", K.RandomGaussianBlur(kernel, tuple(cfg.blur_sigma), p=1.0))
        # thresholds=0, additions=0: a fixed threshold at 0.5 and nothing added, as in BYOL.
        add("solarize", K.RandomSolarize(thresholds=0.0, additions=0.0, p=1.0))

        self.step_names = [name for name, *_ in steps]
        self.steps = nn.ModuleList(op for _, op, _ in steps)
        self.step_probabilities = [p for *_, p in steps]

    def _crop_and_flip(self, x: torch.Tensor) -> torch.Tensor:
        """The group's random resized crops, horizontally flipped where the flip coin says so.

        Every view crops from the one float copy of the batch. The flip is folded into the crop:
        the crop of the mirrored box in the mirrored image is the mirrored crop, so flipping
        costs one flip of the source batch instead of a gather, flip and scatter of the views.

        Shape:
            x: (B, C, H, W) float; returns (VB, C, S, S) for V views.
        """
        batch, width, views = x.shape[0], x.shape[-1], self.count
        per_call = views * batch // len(self.crop_boxes)  # every view in one draw unless views have their own scale
        corners = torch.cat([boxes((per_call, *x.shape[1:]))["src"] for boxes in self.crop_boxes])  # (VB, 4, 2)
        boxes = torch.cat([corners[:, 0], corners[:, 2]], dim=1)  # (VB, 4): x0, y0, x1, y1
        image_index = torch.arange(batch).repeat(views)  # (VB,): view 1 of every image, then view 2, ...
        flip = torch.rand(views * batch) < self.cfg.hflip_p  # (VB,)
        if flip.any():
            x = torch.cat([x, x.flip(-1)])  # (2B, C, H, W): image i mirrored at i + B
            image_index = torch.where(flip, image_index + batch, image_index)
            mirrored = torch.stack([width - 1 - boxes[:, 2], boxes[:, 1], width - 1 - boxes[:, 0], boxes[:, 3]], dim=1)
            boxes = torch.where(flip[:, None], mirrored, boxes)
        return resized_crop(x, boxes, image_index, self.size)

    def _crop_and_flip_sized(self, images: ImageBatch) -> torch.Tensor:
        """:meth:`_crop_and_flip` for images of different sizes: each box drawn on its image's own size.

        The boxes follow torchvision's ``RandomResizedCrop`` on each original image
        (:func:`sslkit.augment.crops.random_resized_boxes`) and are cut from its original pixels; the
        flip then mirrors the chosen views (the folded flip needs one image width).

        Shape:
            images: B padded images; returns (VB, 3, S, S) float for V views.
        """
        views, count = self.count, len(images)
        sizes = images.sizes.repeat(views // len(self.crop_scales), 1)  # (VB, 2), or one share per scale
        ratio = tuple(self.cfg.crop_ratio)
        boxes = torch.cat([random_resized_boxes(sizes, scale, ratio) for scale in self.crop_scales])
        image_index = torch.arange(count).repeat(views)  # (VB,): view 1 of every image, then view 2, ...
        x = crop_padded(images, boxes, image_index, self.size)
        flip = (torch.rand(views * count) < self.cfg.hflip_p).nonzero().squeeze(1)  # (n,)
        if flip.numel():
            index = flip.to(x.device, non_blocking=True)
            x.index_copy_(0, index, x.index_select(0, index).flip(-1))
        return x

    def forward(self, images: torch.Tensor | ImageBatch) -> torch.Tensor:
        if isinstance(images, ImageBatch):
            batch, x = len(images), self._crop_and_flip_sized(images)  # (VB, C, S, S), view 1 first
        else:
            batch, x = images.shape[0], self._crop_and_flip(images)
        for op, probabilities in zip(self.steps, self.step_probabilities):
            probability = torch.cat([torch.full((batch,), p) for p in probabilities[: self.count]])  # (VB,)
            x = _apply_to_some(op, x, probability)
        return x

    def extra_repr(self) -> str:
        probabilities = ", ".join(
            f"{name} {'/'.join(map(str, dict.fromkeys(p[: self.count])))}"
            for name, p in zip(self.step_names, self.step_probabilities)
        )
        return f"count={self.count}, size={self.size}, crop_scales={self.crop_scales}, p: {probabilities or 'none'}"


class TwoViewAugment(nn.Module):
    """Two independently augmented global views of a uint8 batch (the SimCLR set, see the module doc),
    then ``cfg.local_views`` smaller local views (multi-crop).

    Two :class:`ViewGroup` pipelines, each one batched call: the global views at ``cfg.image_size``
    (view 2 with its ``*_view2`` settings) and, with ``cfg.local_views``, the local views at
    ``cfg.local_size`` with ``cfg.local_crop_scale`` and view 1's photometric settings (blur and
    solarize: ``cfg.local_blur_p``, ``cfg.local_solarize_p`` where set). The local group draws its
    random numbers after the global group, so the global views are the same tensors with and
    without local views, and a two-view recipe trains step for step as before multi-crop existed.

    Args:
        cfg: the recipe's augmentation section.
        channels: input channels, 1 (grey) or 3 (RGB).
        mean, std: the dataset's per-channel statistics in [0, 1] units (used if
            ``cfg.normalize``).
        num_views: global views, 2, or 1 for methods that train on one view (fine-tuning: view 1's
            probabilities, and no local views).
        view2_ops: what view 2 becomes after its crop, flip and colour steps, before normalisation; it may keep
            fewer rows. FixMatch's strong view (:class:`~sslkit.augment.strong.StrongAugment`) of the unlabelled
            rows of a second weak view.

    Attributes:
        out_channels: channels of each view, equal to ``channels`` (see the module doc).
        groups: the global group, then the local group where ``cfg.local_views`` > 0.

    Shape:
        images: (B, C, H, W) uint8 on any device.
        returns: ``num_views`` (B, C, S, S) float32 tensors on the same device, S = ``cfg.image_size`` (view 2 with
        the rows ``view2_ops`` keeps), then ``cfg.local_views`` (B, C, L, L) ones, L = ``cfg.local_size``.
    """

    def __init__(
        self,
        cfg: AugmentConfig,
        channels: int,
        mean: Sequence[float],
        std: Sequence[float],
        num_views: int = 2,
        view2_ops: nn.Module | None = None,
    ) -> None:
        super().__init__()
        _check_channels(channels, mean, std, cfg.normalize)
        if num_views not in (1, 2):
            raise ValueError(f"num_views must be 1 or 2, got {num_views}")
        if view2_ops is not None and num_views != 2:
            raise ValueError("view2_ops needs a second view (num_views=2)")
        if cfg.local_views < 0 or (cfg.local_views and num_views != 2):
            raise ValueError(f"local_views must be >= 0, and 0 with one global view, got {cfg.local_views}")
        if cfg.local_views and not 0 < cfg.local_size <= cfg.image_size:
            raise ValueError(f"local_size must be in [1, image_size={cfg.image_size}], got {cfg.local_size}")
        self.cfg, self.num_views = cfg, num_views
        self.channels = channels
        self.out_channels = channels
        # View 2 has a box generator of its own only with crop_scale_view2.
        scales = [cfg.crop_scale] + ([cfg.crop_scale_view2] if num_views == 2 and cfg.crop_scale_view2 else [])
        second = lambda p1, p2: (p1, p1 if p2 is None else p2)  # noqa: E731
        global_p = {
            "jitter": second(cfg.jitter_p, cfg.jitter_p_view2),
            "grayscale": (cfg.grayscale_p,) * 2,
            "blur": second(cfg.blur_p, cfg.blur_p_view2),
            "solarize": second(cfg.solarize_p, cfg.solarize_p_view2),
        }
        self.groups = nn.ModuleList([ViewGroup(cfg, channels, num_views, cfg.image_size, scales, global_p)])
        if cfg.local_views:
            either = lambda p, default: default if p is None else p  # noqa: E731
            local_p = {
                "jitter": (cfg.jitter_p,),
                "grayscale": (cfg.grayscale_p,),
                "blur": (either(cfg.local_blur_p, cfg.blur_p),),
                "solarize": (either(cfg.local_solarize_p, cfg.solarize_p),),
            }
            local_p = {name: p * cfg.local_views for name, p in local_p.items()}
            local = ViewGroup(cfg, channels, cfg.local_views, cfg.local_size, [cfg.local_crop_scale], local_p)
            self.groups.append(local)
        self.view2_ops = view2_ops
        self.normalize = Normalize(mean, std) if cfg.normalize else None

    def _apply(self, fn, *args, **kwargs):
        # Keep every random draw on the CPU when the module moves to an accelerator (kornia's
        # modules would otherwise draw there): one RNG stream whatever the device, so runs
        # reproduce across devices and resume exactly, and reading drawn values in Python (the
        # jitter order, the coins of _apply_to_some) never waits for the device. The draws are a
        # few small tensors a step; the images stay on the device.
        module = super()._apply(fn, *args, **kwargs)
        for child in self.modules():
            if child is not self and hasattr(child, "set_rng_device_and_dtype"):
                child.set_rng_device_and_dtype(torch.device("cpu"), torch.float32)
        return module

    @torch.no_grad()
    def forward(self, images: torch.Tensor | ImageBatch | EncodedBatch) -> tuple[torch.Tensor, ...]:
        if isinstance(images, (ImageBatch, EncodedBatch)):
            images = as_image_batch(images)
            _check_images(images.pixels, self.channels)
        else:
            _check_images(images, self.channels)
            images = _to_unit_float(images)  # one float copy that every group crops from
        views: list[torch.Tensor] = []
        for group in self.groups:
            x = group(images)  # (VB, C, S, S), view 1 first
            if group is self.groups[0] and self.view2_ops is not None:
                view1, view2 = x.chunk(2)
                views += [self._normalized(view1), self._normalized(self.view2_ops(view2))]
            else:
                views += self._normalized(x).chunk(group.count)  # a group's views normalised in one call
        return tuple(views)

    def _normalized(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x) if self.normalize is not None else x

    def extra_repr(self) -> str:
        return f"out_channels={self.out_channels}, hflip p={self.cfg.hflip_p}"


class EvalTransform(nn.Module):
    """Deterministic counterpart of :class:`TwoViewAugment` for kNN and linear evaluation.

    Resizes the whole image to S x S (bilinear, antialiased when shrinking), keeps the channel
    count as :class:`TwoViewAugment` does, and normalises. Images of different sizes
    (:class:`~sslkit.datasets.batches.ImageBatch`) get the standard resize-shorter-side-to-S and
    centre-crop-S instead (:func:`sslkit.augment.crops.centre_boxes`), keeping their aspect ratio.

    Shape:
        images: (B, C, H, W) uint8, or a batch of B images of different sizes;
        returns (B, C, S, S) float32 on the same device.
    """

    def __init__(
        self, image_size: int, channels: int, mean: Sequence[float], std: Sequence[float], normalize: bool = True
    ) -> None:
        super().__init__()
        _check_channels(channels, mean, std, normalize)
        self.image_size = image_size
        self.channels = channels
        self.out_channels = channels
        self.normalize = Normalize(mean, std) if normalize else None

    @torch.no_grad()
    def forward(self, images: torch.Tensor | ImageBatch | EncodedBatch) -> torch.Tensor:
        if isinstance(images, (ImageBatch, EncodedBatch)):
            images = as_image_batch(images)
            _check_images(images.pixels, self.channels)
            boxes = centre_boxes(images.sizes)
            x = crop_padded(images, boxes, torch.arange(len(images)), self.image_size)
            return self.normalize(x) if self.normalize is not None else x
        _check_images(images, self.channels)
        x = _to_unit_float(images)
        size = self.image_size
        if x.shape[-2:] != (size, size):
            shrinking = size < max(x.shape[-2:])
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=shrinking)
        if self.normalize is not None:
            x = self.normalize(x)
        return x
