"""The datasets a run trains and is evaluated on, built once for the trainer and ``evaluate.py`` alike.

Four roles, all from the recipe's ``data`` section:

- ``train``: what the method trains on (``data.train_split``; STL-10 may train on ``unlabeled``);
- ``memory``: the labelled training split, the kNN memory and the linear probe's training set;
- ``test``: the labelled test split every accuracy is measured on;
- ``unseen``: with ``data.holdout_classes``, those classes of the test split, kept out of the
  other three and used for retrieval among classes never trained on (the CUB / Cars protocol).

>>> from sslkit.config import Config
>>> splits = build_splits(Config())
>>> len(splits.train), len(splits.test), splits.unseen is None
(1437, 360, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset

from sslkit import data
from sslkit.errors import UserError


@dataclass
class Splits:
    """The four datasets of a run (see the module docstring) and what they share."""

    train: Dataset
    memory: Dataset
    test: Dataset
    unseen: Dataset | None
    info: data.DatasetInfo


def build_splits(cfg, train_split: str | None = None) -> Splits:
    """The recipe's datasets; ``train_split`` overrides ``data.train_split`` (evaluation trains on nothing).

    Raises:
        UserError: a dataset that cannot be loaded, or ``data.holdout_classes`` naming every class.
    """
    d = cfg.data
    train_split = train_split or d.train_split
    load = lambda split: data.build_dataset(d.name, split, d.root, d.download, d.image_size)  # noqa: E731
    train_set, test_set = load(train_split), load("test")
    info = train_set.info
    # The kNN memory and the linear probe need labels: the labelled "train" split.
    memory_set = train_set if train_split == "train" else load("train")
    if not d.holdout_classes:
        return Splits(train_set, memory_set, test_set, None, info)
    if len(set(d.holdout_classes)) >= info.num_classes:
        raise UserError(
            f"data.holdout_classes holds out all {info.num_classes} classes of {d.name}, leaving none to train on; "
            f"keep at least one class out of the list (the README's road holds out 5 of 10)"
        )
    # Train (and measure kNN / linear accuracy) on the seen classes; retrieve among the unseen ones.
    return Splits(
        train=train_set.select_classes(d.holdout_classes, keep=False),
        memory=memory_set.select_classes(d.holdout_classes, keep=False),
        test=test_set.select_classes(d.holdout_classes, keep=False),
        unseen=test_set.select_classes(d.holdout_classes, keep=True),
        info=info,
    )
