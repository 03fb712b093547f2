"""Labelled subsets: class-balanced, seeded, saved and read back; where they apply; their bad input."""

from __future__ import annotations

import json

import pytest
import torch

from sslkit.config import load_config
from sslkit.datasets import build_splits, label_subset
from sslkit.datasets.label_subset import LabelSpec, choose
from sslkit.errors import UserError


def labels_of(counts: list[int]) -> torch.Tensor:
    """Labels of a dataset with ``counts[c]`` images of class c, interleaved."""
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(1))]


def test_a_fraction_keeps_the_same_number_of_every_class():
    labels = labels_of([100, 120, 80, 100])
    chosen = choose(labels, LabelSpec(fraction=0.1, per_class=None, seed=0))
    assert torch.bincount(labels[chosen]).tolist() == [10, 10, 10, 10]  # round(0.1 * 400 / 4)
    assert chosen.unique().numel() == len(chosen) and bool((chosen[1:] > chosen[:-1]).all())


def test_labels_per_class_and_candidates():
    labels = labels_of([30, 30, 30])
    candidates = (labels != 2).nonzero().flatten()  # class 2 held out
    chosen = choose(labels, LabelSpec(fraction=None, per_class=7, seed=3), candidates)
    assert torch.bincount(labels[chosen], minlength=3).tolist() == [7, 7, 0]
    assert bool(torch.isin(chosen, candidates).all())


def test_the_same_seed_picks_the_same_images_and_another_seed_others():
    labels = labels_of([50] * 10)
    spec = LabelSpec(fraction=0.1, per_class=None, seed=5)
    assert torch.equal(choose(labels, spec), choose(labels.clone(), spec))
    other = choose(labels, LabelSpec(fraction=0.1, per_class=None, seed=6))
    assert not torch.equal(choose(labels, spec), other)


def test_every_label_is_no_subset():
    labels = labels_of([5, 5])
    for spec in (LabelSpec(None, None, 0), LabelSpec(1.0, None, 0)):
        assert label_subset.labelled_subset(labels, spec, torch.arange(10), None) is None


def test_a_saved_subset_of_the_same_spec_is_read_back(tmp_path):
    labels = labels_of([20, 20])
    spec = LabelSpec(fraction=None, per_class=3, seed=0)
    hand_picked = torch.cat([(labels == 0).nonzero().flatten()[:3], (labels == 1).nonzero().flatten()[:3]]).sort()[0]
    label_subset.save(tmp_path / "s.json", spec, hand_picked)
    assert torch.equal(label_subset.labelled_subset(labels, spec, torch.arange(40), tmp_path / "s.json"), hand_picked)
    # Another spec (an evaluation at another fraction) is chosen afresh.
    other = LabelSpec(fraction=None, per_class=2, seed=0)
    assert torch.equal(
        label_subset.labelled_subset(labels, other, torch.arange(40), tmp_path / "s.json"), choose(labels, other)
    )


def test_too_many_labels_per_class_is_one_line_naming_the_smallest_class():
    with pytest.raises(UserError, match="class 2 has only 80; ask for at most 80"):
        choose(labels_of([100, 120, 80]), LabelSpec(fraction=None, per_class=81, seed=0))


def test_a_split_without_labels_is_refused():
    labels = torch.tensor([0, 1, -1, 0, 1, -1])
    with pytest.raises(UserError, match="needs a labelled split"):
        choose(labels, LabelSpec(fraction=0.5, per_class=None, seed=0))


@pytest.mark.parametrize(
    "override, words",
    [
        ("data.label_fraction=0", "'data.label_fraction' must be in (0, 1]"),
        ("data.label_fraction=1.5", "'data.label_fraction' must be in (0, 1]"),
        ("eval.label_fraction=-0.1", "'eval.label_fraction' must be in (0, 1]"),
        ("data.labels_per_class=0", "'data.labels_per_class' must be >= 1"),
    ],
)
def test_bad_subset_settings_are_one_line(override, words):
    with pytest.raises(UserError) as error:
        load_config("quickstart", [override])
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_fraction_and_a_count_together_say_how_to_choose_one():
    with pytest.raises(UserError, match=r"not both .*data.label_fraction=null data.labels_per_class=5"):
        load_config("quickstart_finetune", ["data.labels_per_class=5", "data.label_fraction=0.1"])
    # One on the command line replaces the recipe's label_fraction (the more specific choice).
    cfg = load_config("quickstart_finetune", ["data.labels_per_class=5"])
    assert cfg.data.labels_per_class == 5 and cfg.data.label_fraction is None


def test_splits_of_a_supervised_method_hold_only_the_subset():
    cfg = load_config("quickstart_finetune", ["data.label_fraction=0.1", "data.holdout_classes=[9]"])
    splits = build_splits(cfg, labelled_training=True)
    assert len(splits.train) == len(splits.memory) == len(splits.subset) == 9 * 14  # 1293 seen digits / 9
    assert torch.bincount(splits.train.labels, minlength=10).tolist() == [14] * 9 + [0]
    assert len(splits.test) == 360 - 36 and len(splits.unseen) == 36  # kNN and probe score the whole test split


def test_a_self_supervised_method_sees_every_image_and_only_the_subset_labels():
    cfg = load_config("quickstart", ["data.labels_per_class=5"])
    splits = build_splits(cfg)
    assert len(splits.train) == 1437 and len(splits.memory) == 50
    labelled = splits.train.labels >= 0
    assert int(labelled.sum()) == 50 and torch.equal(labelled.nonzero().flatten(), splits.subset)
    assert torch.equal(splits.train.images[splits.subset], splits.memory.images)


def test_eval_keys_choose_the_evaluation_subset(tmp_path):
    cfg = load_config("quickstart", ["data.labels_per_class=5", "eval.labels_per_class=2"])
    assert len(build_splits(cfg).memory) == 50
    assert len(build_splits(cfg, for_evaluation=True).memory) == 20


def test_a_saved_subset_from_another_dataset_is_refused(tmp_path):
    cfg = load_config("quickstart", ["data.labels_per_class=2"])
    spec = label_subset.spec_for(cfg)
    (tmp_path / label_subset.FILE_NAME).write_text(json.dumps({**spec.__dict__, "indices": [0, 99999]}))
    with pytest.raises(UserError, match="outside this run's labelled training split"):
        build_splits(cfg, run_dir=tmp_path)


def test_held_out_classes_stay_out_of_a_self_supervised_run_with_few_labels():
    cfg = load_config("quickstart", ["data.labels_per_class=5", "data.holdout_classes=[8,9]"])
    splits = build_splits(cfg)
    full = build_splits(load_config("quickstart", ["data.holdout_classes=[8,9]"]))
    assert len(splits.train) == len(full.train)  # no held-out image came back as "unlabelled"
    assert torch.equal(splits.train.images, full.train.images)
    assert int((splits.train.labels >= 0).sum()) == 40 and not bool(
        torch.isin(splits.train.labels, torch.tensor([8, 9])).any()
    )
