"""Grey <-> RGB for an encoder of the other kind: PIL's luma to the bit, grey kept grey, batches of any size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from sslkit.augment.channels import ConvertChannels, rgb_to_grey
from sslkit.datasets.batches import ImageBatch, pad_images


def test_luma_is_pils_convert_l_to_the_bit():
    pixels = np.random.default_rng(0).integers(0, 256, size=(40, 50, 3), dtype=np.uint8)
    expected = np.asarray(Image.fromarray(pixels).convert("L"))
    assert np.array_equal(rgb_to_grey(torch.from_numpy(pixels).permute(2, 0, 1))[0].numpy(), expected)


def test_a_grey_image_read_as_rgb_comes_back_unchanged():
    grey = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16)
    assert torch.equal(ConvertChannels(3, 1)(grey.expand(1, 3, 16, 16)), grey)
    assert torch.equal(ConvertChannels(1, 3)(grey), grey.expand(1, 3, 16, 16))


def test_images_of_different_sizes_keep_their_sizes():
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in ((5, 7), (9, 4))]
    batch = ImageBatch(*pad_images(images))
    grey = ConvertChannels(3, 1)(batch)
    assert grey.pixels.shape == (2, 1, *batch.pixels.shape[-2:]) and torch.equal(grey.sizes, batch.sizes)
    assert torch.equal(grey.pixels[1, :, :9, :4], rgb_to_grey(images[1]))


def test_only_grey_and_rgb_convert():
    with pytest.raises(ValueError, match="no conversion from 4-channel"):
        ConvertChannels(4, 1)
