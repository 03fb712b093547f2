"""data.val_fraction: training images held out of every stream, in the test split's place; its bad input."""

from __future__ import annotations

import json

import pytest
import torch

from sslkit.config import load_config
from sslkit.datasets import build_splits
from sslkit.datasets.validation import validation_rows, without
from sslkit.errors import UserError


def digits(*overrides: str):
    return load_config("quickstart", list(overrides))


def test_every_class_gives_its_share_the_same_images_whatever_the_seed():
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate([40, 60, 25])])
    labels = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(3))]
    held = validation_rows(labels, 0.2)
    assert torch.bincount(labels[held]).tolist() == [8, 12, 5]
    assert bool((held[1:] > held[:-1]).all())
    torch.manual_seed(123)  # the global generator plays no part
    assert torch.equal(validation_rows(labels, 0.2), held)
    kept = without(torch.arange(len(labels)), held)
    assert len(kept) + len(held) == len(labels) and not bool(torch.isin(kept, held).any())


def test_the_held_out_images_replace_the_test_split_and_leave_every_training_stream():
    full, cfg = build_splits(digits()), digits("data.val_fraction=0.1", "run.seed=5")
    splits = build_splits(cfg)
    held = validation_rows(full.memory.labels, 0.1)
    rows = without(torch.arange(1437), held)
    assert (
        len(splits.test) == len(held) == 142 and len(splits.train) == len(splits.memory) == 1437 - 142
    )  # round(0.1 n_c) of every class
    assert torch.equal(splits.test.images, full.memory.images[held])  # training images, not the test split's
    assert torch.equal(splits.test.labels, full.memory.labels[held])
    assert torch.equal(splits.train.images, full.memory.images[rows])
    assert torch.equal(splits.memory.images, full.memory.images[rows])
    assert torch.equal(build_splits(digits("data.val_fraction=0.1", "run.seed=9")).test.images, splits.test.images)


def test_a_labelled_subset_leaves_out_the_held_out_images_and_counts_the_whole_split():
    cfg = digits("data.val_fraction=0.3", "data.label_fraction=0.1")
    splits = build_splits(cfg)
    held = validation_rows(build_splits(digits()).memory.labels, 0.3)
    assert len(splits.subset) == 140  # round(0.1 * 1437 / 10) of every class, as without a validation split
    assert not bool(torch.isin(splits.subset, held).any())
    assert len(splits.train) == 1437 - len(held) and int((splits.train.labels >= 0).sum()) == 140
    finetune = load_config("quickstart_finetune", ["data.val_fraction=0.3", "data.label_fraction=0.1"])
    supervised = build_splits(finetune, labelled_training=True)
    assert len(supervised.train) == len(supervised.memory) == 140 and len(supervised.test) == len(held)


def test_a_label_file_naming_a_held_out_image_is_refused(tmp_path):
    held = validation_rows(build_splits(digits()).memory.labels, 0.1)
    chosen = tmp_path / "chosen.json"
    chosen.write_text(json.dumps({"indices": [int(held[0]), *without(torch.arange(5), held).tolist()]}))
    with pytest.raises(UserError, match="labels images of the validation split data.val_fraction=0.1 holds out"):
        build_splits(digits("data.val_fraction=0.1", f"data.label_subset={chosen}"))


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["data.val_fraction=1"], ["'data.val_fraction' must be in (0, 1)", "got 1"]),
        (["data.val_fraction=0"], ["must be in (0, 1)"]),
        (["data.val_fraction=0.1", "data.holdout_classes=[9]"], ["data.holdout_classes", "drop one"]),
        (["data.val_fraction=0.1", "eval.data.name=digits"], ["eval.data"]),
    ],
)
def test_bad_validation_settings_are_one_line_each(overrides, words):
    with pytest.raises(UserError) as error:
        digits(*overrides)
    for word in words:
        assert word in str(error.value), str(error.value)


def test_a_fraction_that_empties_a_class_is_refused():
    with pytest.raises(UserError, match="holds out 0 of the 4 training images of class 1"):
        validation_rows(torch.tensor([0] * 100 + [1] * 4), 0.1)


def test_an_unlabelled_folder_has_nothing_to_hold_out(tmp_path):
    from PIL import Image

    for i in range(4):
        Image.new("RGB", (20, 16), (i * 40, 0, 0)).save(tmp_path / f"{i}.png")
    with pytest.raises(UserError, match="data.val_fraction holds out labelled training images, and imagefolder at"):
        build_splits(
            load_config("simclr", ["data.name=imagefolder", f"data.root={tmp_path}", "data.val_fraction=0.1"])
        )


def test_stl10_holds_out_train_images_and_refuses_to_train_on_them(tmp_path):
    from test_data import write_stl10

    write_stl10(tmp_path, n_train=40, n_unlabeled=6)  # 40 labelled images, 4 of each class
    stl = ["data.name=stl10", f"data.root={tmp_path}", "data.val_fraction=0.25", "augment.image_size=32"]
    unlabelled = build_splits(load_config("simclr", [*stl, "data.train_split=unlabeled"]))
    assert len(unlabelled.train) == 6 and len(unlabelled.test) == 10 and len(unlabelled.memory) == 30
    with pytest.raises(UserError, match="data.train_split=train\\+unlabeled trains on them"):
        build_splits(load_config("simclr", [*stl, "data.train_split=train+unlabeled"]))
