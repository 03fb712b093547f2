"""Augmentation in the loader workers (``data.augment_in_workers``): the views of a batch depend on the
run's seed, the epoch and the batch, not on the number of workers nor on where a run resumed; the
training process's RNG is left alone; the setting resolves and is checked as documented.

A tiny folder of JPEGs of different sizes (24 images, batches of 8) and the bundled digits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from PIL import Image

from sslkit.augment import TwoViewAugment
from sslkit.config import Config, config_from_dict
from sslkit.datasets import augmented, build_dataset, folders
from sslkit.datasets.base import IMAGENET_MEAN, IMAGENET_STD
from sslkit.datasets.batches import AugmentedViews
from sslkit.errors import UserError
from sslkit.loop.build import make_train_loader

BATCH = 8


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    for i in range(3 * BATCH):
        height, width = (int(v) for v in rng.integers(20, 41, size=2))
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i:02d}.jpg", quality=90)
    return folders.image_folder("train", str(root))


def _setup(dataset, workers: int, channels: int = 3):
    cfg = Config()
    cfg.data.num_workers, cfg.augment.image_size = workers, 16
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.3,), (0.3,))
    augment = TwoViewAugment(cfg.augment, channels, mean, std)
    return make_train_loader(cfg, dataset, BATCH, augment)


def _epoch(loader, sampler, epoch: int, skip: int = 0) -> list[torch.Tensor]:
    """Each batch's views stacked (V, B, C, S, S), as the training loop iterates a prepared loader."""
    prepared = Accelerator(cpu=True).prepare(loader)
    batches = Accelerator(cpu=True).skip_first_batches(prepared, skip) if skip else prepared
    batches.set_epoch(epoch)
    sampler.set_epoch(epoch)
    out = []
    for images, labels in batches:
        assert isinstance(images, AugmentedViews) and len(images) == len(labels) == BATCH
        out.append(torch.stack(images.views))
    return out


def test_the_views_do_not_depend_on_the_number_of_workers_and_the_process_rng_is_untouched(photos):
    torch.manual_seed(1)
    before = torch.get_rng_state()
    runs = [_epoch(*_setup(photos, workers), epoch=1) for workers in (0, 1, 2)]
    assert torch.equal(torch.get_rng_state(), before)  # with 0 workers the training process augments
    assert len(runs[0]) == 3 and runs[0][0].shape == (2, BATCH, 3, 16, 16)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    # Every batch, and the same place in another epoch, has views of its own.
    assert not torch.equal(runs[0][0][0], runs[0][0][1])
    loader, sampler = _setup(photos, 0)
    epoch_zero = _epoch(loader, sampler, epoch=0)
    assert not any(torch.equal(a, b) for a, b in zip(epoch_zero, runs[0]))


@pytest.mark.parametrize("source", ["folder", "digits"])
def test_a_resumed_epoch_sees_the_views_of_an_uninterrupted_one(photos, source):
    dataset = photos if source == "folder" else build_dataset("digits", "train").subset(range(3 * BATCH))
    loader, sampler = _setup(dataset, 1, channels=3 if source == "folder" else 1)
    whole = _epoch(loader, sampler, epoch=2)
    resumed = _epoch(loader, sampler, epoch=2, skip=2)
    assert len(resumed) == 1 and torch.equal(resumed[0], whole[2])


def test_the_setting_resolves_for_the_device_and_a_wrong_value_is_one_line():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert augmented.in_workers("auto", cpu, 2) and not augmented.in_workers("auto", cpu, 0)
    assert not augmented.in_workers("auto", cuda, 8) and augmented.in_workers(True, cuda, 8)
    assert not augmented.in_workers(False, cpu, 2)
    assert config_from_dict({"data": {"augment_in_workers": True}}).data.augment_in_workers is True
    with pytest.raises(UserError, match="data.augment_in_workers 'yes'; choose one of: auto, true, false") as error:
        config_from_dict({"data": {"augment_in_workers": "yes"}})
    assert "\n" not in str(error.value)
