"""Crop boxes drawn on each image's own size follow torchvision's ``RandomResizedCrop`` exactly in
distribution: box area and aspect relative to the original image, position, and the centred
fallback, on non-square images and on a batch of mixed sizes."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms import RandomResizedCrop

from sslkit.augment import TwoViewAugment
from sslkit.augment.crops import centre_boxes, random_resized_boxes
from sslkit.config import AugmentConfig
from sslkit.datasets.batches import ImageBatch, pad_images

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
DRAWS = 10_000


def _box_statistics(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Per box: area fraction, log aspect (w / h), centre x and y as fractions of the image. Shape: (N, 4)."""
    w, h = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
    centre_x, centre_y = (boxes[:, 0] + boxes[:, 2] + 1) / 2, (boxes[:, 1] + boxes[:, 3] + 1) / 2
    return torch.stack([w * h / (height * width), torch.log(w / h), centre_x / width, centre_y / height], dim=1)


def _torchvision_boxes(height: int, width: int, count: int) -> torch.Tensor:
    image = torch.empty(1, height, width)
    rows = []
    for _ in range(count):
        top, left, h, w = RandomResizedCrop.get_params(image, list(SCALE), list(RATIO))
        rows.append([left, top, left + w - 1, top + h - 1])
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("height, width", [(120, 300), (300, 120), (50, 400)])
def test_box_statistics_match_torchvision_on_non_square_images(height, width):
    torch.manual_seed(0)
    ours = random_resized_boxes(torch.tensor([[height, width]]).repeat(DRAWS, 1), SCALE, RATIO)
    theirs = _torchvision_boxes(height, width, DRAWS)
    assert (ours[:, :2] >= 0).all() and (ours[:, 2] <= width - 1).all() and (ours[:, 3] <= height - 1).all()
    a, b = _box_statistics(ours, height, width), _box_statistics(theirs, height, width)
    quantiles = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9])
    for column, name in enumerate(("area fraction", "log aspect", "centre x", "centre y")):
        # 10k draws: a quantile's standard error is under 0.01 of these ranges; 0.03 is 3+ of them.
        spread = (b[:, column].max() - b[:, column].min()).clamp_min(1e-6)
        gap = (a[:, column].quantile(quantiles) - b[:, column].quantile(quantiles)).abs().max() / spread
        assert gap < 0.03, (name, gap)
        assert abs(a[:, column].mean() - b[:, column].mean()) / spread < 0.02, name
    # The centred fallback (no attempt fits): the same box, as often.
    whole = lambda boxes: ((boxes[:, 3] - boxes[:, 1] + 1) == height).float().mean()  # noqa: E731
    assert abs(whole(ours) - whole(theirs)) < 0.02


def test_the_fallback_is_torchvisions_centred_box():
    # 10 x 1000: no attempt at a 3/4..4/3 aspect can fit, so every box is the fallback.
    boxes = random_resized_boxes(torch.tensor([[10, 1000], [1000, 10]]), SCALE, RATIO)
    top, left, h, w = RandomResizedCrop.get_params(torch.empty(1, 10, 1000), list(SCALE), list(RATIO))
    assert boxes[0].tolist() == [left, top, left + w - 1, top + h - 1]
    top, left, h, w = RandomResizedCrop.get_params(torch.empty(1, 1000, 10), list(SCALE), list(RATIO))
    assert boxes[1].tolist() == [left, top, left + w - 1, top + h - 1]


def test_every_box_of_a_mixed_batch_lies_in_its_own_image():
    torch.manual_seed(1)
    sizes = torch.tensor([[20, 300], [300, 20], [64, 64], [7, 9]]).repeat(500, 1)
    boxes = random_resized_boxes(sizes, SCALE, RATIO)
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2:] >= boxes[:, :2]).all()
    assert (boxes[:, 2] < sizes[:, 1]).all() and (boxes[:, 3] < sizes[:, 0]).all()
    assert torch.equal(boxes, boxes.round())  # whole pixels, as torchvision's integer boxes
    squares = centre_boxes(sizes[:4])
    assert squares.tolist() == [[140, 0, 159, 19], [0, 140, 19, 159], [0, 0, 63, 63], [1, 0, 7, 6]]


def test_two_views_of_images_of_different_sizes_are_reproducible():
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in ((30, 90), (90, 30), (16, 16))]
    batch = ImageBatch(*pad_images(images))
    augment = TwoViewAugment(AugmentConfig(image_size=12), 3, (0.5,) * 3, (0.25,) * 3)
    torch.manual_seed(3)
    first = augment(batch)
    torch.manual_seed(3)
    again = augment(batch)
    assert [v.shape for v in first] == [(3, 3, 12, 12)] * 2
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not math.isclose(float((first[0] - first[1]).abs().mean()), 0.0)
