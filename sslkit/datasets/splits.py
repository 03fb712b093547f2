"""The datasets a run trains and is evaluated on, built once for the trainer and ``sslkit-evaluate`` alike.

Four roles, all from the recipe's ``data`` section:

- ``train``: what the method trains on (``data.train_split``; STL-10 may train on ``unlabeled``);
- ``memory``: the labelled training split (or its labelled subset: ``data.label_fraction``,
  ``data.labels_per_class``, or the images a label file names, ``data.label_subset``), the kNN
  memory and the linear probe's training set;
- ``test``: the labelled test split every accuracy is measured on (with ``data.val_fraction``: the
  training images it holds out, :mod:`sslkit.datasets.validation`, and the test split is not read);
- ``unseen``: with ``data.holdout_classes``, those classes of the test split, kept out of the
  other three and used for retrieval among classes never trained on (the CUB / Cars protocol).

Class-disjoint data (the retrieval benchmarks ``cub200``, ``cars196``, ``sop``, ``inshop``, or an
image folder with ``data.class_split``) trains on its training classes and is evaluated by
retrieval only: ``unseen`` holds the test classes (In-shop: the queries, with the ``gallery``
they are retrieved from), and there is no ``memory`` or ``test`` (no kNN or linear probe over
classes the network never trained on).

With ``eval.data`` set, or training data that has no labels (an unlabelled image folder, tar
shards), ``memory`` and ``test`` are the ``train`` and ``test`` splits of the evaluation set
(``eval.data``), or None when there is none: the run then trains without evaluation.

>>> from sslkit.schema import Config
>>> splits = build_splits(Config())
>>> len(splits.train), len(splits.test), splits.unseen is None
(1437, 360, True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from sslkit.datasets.base import DatasetInfo, ImageDataset, ImageSource
from sslkit.datasets.build import build_dataset
from sslkit.datasets.folders import ImageFiles, has_labelled_splits, labelled_folder
from sslkit.datasets.label_subset import FILE_NAME, LabelSpec, labelled_subset, spec_for
from sslkit.datasets.retrieval import READERS as RETRIEVAL_READERS
from sslkit.datasets.validation import validation_rows, without
from sslkit.errors import UserError


@dataclass
class Splits:
    """The four datasets of a run (see the module docstring) and what they share."""

    train: ImageSource
    memory: ImageDataset | None
    test: ImageDataset | None
    unseen: ImageDataset | None
    info: DatasetInfo
    subset: torch.Tensor | None = None
    subset_spec: LabelSpec | None = None
    gallery: ImageDataset | None = None  # what ``unseen`` queries are retrieved from (None: one another)


def build_splits(
    cfg,
    train_split: str | None = None,
    run_dir: Path | None = None,
    for_evaluation: bool = False,
    labelled_training: bool = False,
):
    """The recipe's datasets, with its labelled subset (``data.label_fraction`` / ``labels_per_class`` /
    ``label_subset``).

    Args:
        cfg: the recipe.
        train_split: replaces ``data.train_split`` (evaluation trains on nothing: ``"train"``).
        run_dir: the run's directory: a ``label_subset.json`` there of the same subset is read back.
        for_evaluation: take the subset from ``eval.label_fraction`` / ``eval.labels_per_class`` when set.
        labelled_training: train on the labelled subset only (a method that needs labels); otherwise on
            every image, with only the subset's labels.

    Returns:
        :class:`Splits`, whose ``subset`` holds the chosen indices into the labelled training split
        (None: every label).

    Raises:
        UserError: a dataset that cannot be loaded, ``data.holdout_classes`` naming every class, or a
            subset the data cannot give.
    """
    d = cfg.data
    train_split = train_split or d.train_split
    if d.name in RETRIEVAL_READERS or d.class_split is not None:
        return _class_disjoint_splits(cfg, for_evaluation)
    if _separate_evaluation(cfg):
        return _splits_with_evaluation_set(cfg, train_split, run_dir, for_evaluation)
    load = lambda split: build_dataset(d.name, split, d.root, d.download, d.image_size)  # noqa: E731
    train_set = load(train_split)
    info = train_set.info
    # The kNN memory and the linear probe need labels: the labelled "train" split.
    labelled = train_set if train_split == "train" else load("train")
    if d.val_fraction is not None:
        return _splits_with_validation(cfg, train_set, labelled, run_dir, for_evaluation, labelled_training)
    test_set = load("test")
    if len(set(d.holdout_classes)) >= info.num_classes:
        raise UserError(
            f"data.holdout_classes holds out all {info.num_classes} classes of {d.name}, leaving none to train on; "
            f"keep at least one class out of the list (the README's road holds out 5 of 10)"
        )
    seen = lambda ds: ds.select_classes(d.holdout_classes, keep=False) if d.holdout_classes else ds  # noqa: E731
    # Train (and measure kNN / linear accuracy) on the seen classes; retrieve among the unseen ones.
    unseen = test_set.select_classes(d.holdout_classes, keep=True) if d.holdout_classes else None
    spec = spec_for(cfg, for_evaluation)
    seen_rows = torch.isin(labelled.labels, torch.tensor(d.holdout_classes, dtype=torch.int64), invert=True)
    seen_rows = seen_rows.nonzero().flatten()  # the labelled split's images of seen classes
    saved = run_dir / FILE_NAME if run_dir is not None else None
    subset = labelled_subset(labelled.labels, spec, seen_rows, saved, d.name)
    if subset is None:
        return Splits(seen(train_set), seen(labelled), seen(test_set), unseen, info)
    memory = labelled.subset(subset)
    if labelled_training:
        train = memory  # supervised methods see the labelled images only
    elif train_split == "train":
        # The others see every image of the seen classes, and only the subset's labels.
        train = _keep_labels_of(train_set, subset).subset(seen_rows)
    else:
        train = seen(train_set)  # another split (STL-10's unlabelled images): no label of the subset is in it
    return Splits(train, memory, seen(test_set), unseen, info, subset, spec)


def _splits_with_validation(cfg, train_set, labelled, run_dir: Path | None, for_evaluation, labelled_training):
    """``data.val_fraction``: the held-out training images in the test set's place, out of every other role."""
    d = cfg.data
    if train_set is not labelled and "train" in d.train_split:
        raise UserError(
            f"data.val_fraction holds out images of the train split, and data.train_split={d.train_split} trains on "
            f"them; give data.train_split=train or unlabeled"
        )
    held = validation_rows(labelled.labels, d.val_fraction)
    rows = without(torch.arange(len(labelled)), held)
    saved = run_dir / FILE_NAME if run_dir is not None else None
    kept_out = f"the validation split data.val_fraction={d.val_fraction} holds out"
    spec = spec_for(cfg, for_evaluation)
    subset = labelled_subset(labelled.labels, spec, rows, saved, d.name, counted=len(labelled), kept_out=kept_out)
    validation, same_split = labelled.subset(held), train_set is labelled
    if subset is None:
        train = train_set.subset(rows) if same_split else train_set
        return Splits(train, labelled.subset(rows), validation, None, train_set.info)
    memory = labelled.subset(subset)
    if labelled_training:
        train = memory
    else:  # another split (STL-10's unlabelled images) holds none of the held-out images
        train = _keep_labels_of(train_set, subset).subset(rows) if same_split else train_set
    return Splits(train, memory, validation, None, train_set.info, subset, spec)


def _keep_labels_of(dataset, indices: torch.Tensor):
    """``dataset`` with every label outside ``indices`` replaced by -1 (unlabelled)."""
    labels = torch.full_like(dataset.labels, -1)
    labels[indices] = dataset.labels[indices]
    return dataset.with_labels(labels)


def _separate_evaluation(cfg) -> bool:
    """Whether evaluation uses another dataset than the training data's own labelled splits."""
    d, e = cfg.data, cfg.eval.data
    unlabelled = d.name == "webdataset" or (
        d.name == "imagefolder" and d.image_size is None and not has_labelled_splits(d.root)
    )
    return unlabelled or e.name is not None or e.root is not None


def _splits_with_evaluation_set(cfg, train_split: str, run_dir: Path | None, for_evaluation: bool) -> Splits:
    """Training data from ``data``, kNN memory and test set from ``eval.data`` (None without one)."""
    d, e = cfg.data, cfg.eval.data
    train_set = build_dataset(d.name, train_split, d.root, d.download, d.image_size, d.max_size)
    if d.val_fraction is not None:
        raise UserError(
            f"data.val_fraction holds out labelled training images, and {d.name} at {d.root} has no labels; drop "
            f"it, or train on labelled folders (root/train/<class>/ and root/test/<class>/)"
        )
    if d.holdout_classes:
        raise UserError(
            "data.holdout_classes needs the training data's own labelled splits; "
            "it cannot be combined with eval.data or unlabelled training data"
        )
    if e.name is None and e.root is None:
        info = train_set.info
        return Splits(train_set, None, None, None, info)
    name = e.name or "imagefolder"
    max_size = d.max_size if name == "imagefolder" else None
    load = lambda split: build_dataset(name, split, e.root, d.download, None, max_size)  # noqa: E731
    memory, test = load("train"), load("test")
    if memory.info.channels != train_set.info.channels:
        raise UserError(
            f"eval.data {name} has {memory.info.channels}-channel images but the training data "
            f"{train_set.info.channels}-channel ones; evaluate on a dataset of the same kind (RGB image folders: "
            f"eval.data.root with train/<class>/ and test/<class>/)"
        )
    info = dataclasses.replace(train_set.info, num_classes=memory.info.num_classes)
    spec = spec_for(cfg, for_evaluation)
    saved = run_dir / FILE_NAME if run_dir is not None else None
    subset = labelled_subset(memory.labels, spec, torch.arange(len(memory)), saved, name)
    if subset is None:
        return Splits(train_set, memory, test, None, info)
    return Splits(train_set, memory.subset(subset), test, None, info, subset, spec)


def _class_disjoint_splits(cfg, for_evaluation: bool) -> Splits:
    """Training classes to train on, the other classes to retrieve among (see the module docstring)."""
    d, e = cfg.data, cfg.eval
    subset = spec_for(cfg, for_evaluation)
    what = f"data.class_split={d.class_split}" if d.class_split is not None else f"data.name={d.name}"
    for used, key in (
        (bool(d.holdout_classes), "data.holdout_classes"),
        (not subset.everything, "a label subset (data/eval.label_fraction, labels_per_class, data.label_subset)"),
        (e.data.name is not None or e.data.root is not None, "eval.data"),
    ):
        if used:
            raise UserError(
                f"{what} trains and evaluates on disjoint classes already; drop {key}, which would split them again"
            )
    if d.class_split is not None:
        train, unseen = split_classes(labelled_folder(d.root, d.max_size), d.class_split)
        return Splits(train, None, None, unseen, train.info)
    load = lambda split: build_dataset(d.name, split, d.root, d.download, None, d.max_size)  # noqa: E731
    train = load("train")
    if d.name == "inshop":
        return Splits(train, None, None, load("query"), train.info, gallery=load("gallery"))
    return Splits(train, None, None, load("test"), train.info)


def split_classes(files: ImageFiles, fraction: float) -> tuple[ImageFiles, ImageFiles]:
    """The images of the first ``fraction`` of the classes (at least one, at most all but one), and the rest.

    Each part is labelled ``0 ..`` within its own classes, which keep their sorted order.
    """
    count = len(files.classes)
    if count < 2:
        raise UserError(f"data.class_split needs at least 2 classes to split, found {count}")
    first = min(max(1, round(fraction * count)), count - 1)
    seen = files.labels < first
    paths = [[path for path, keep in zip(files.paths, seen.tolist()) if keep == part] for part in (True, False)]
    train = ImageFiles(paths[0], files.labels[seen], files.classes[:first], files.max_size)
    return train, ImageFiles(paths[1], files.labels[~seen] - first, files.classes[first:], files.max_size)
