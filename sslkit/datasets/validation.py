"""A validation split held out of the labelled training images, for choosing settings without the test split.

``data.val_fraction=F`` keeps ``round(F * n_c)`` images of every class ``c`` of the labelled training split out of
training, and measures every accuracy of the run on them instead of the test split: the online kNN, the final kNN
and linear probe, a fine-tune's or FixMatch's own classifier. The held-out images are in no stream the run trains
on (labelled or not) and in no labelled subset. ``sslkit-tune --validation F`` selects its trials this way, so that
the test split measures the chosen recipe once, after the search (as "Realistic Evaluation of Deep
Semi-Supervised Learning Algorithms", Oliver et al. 2018, asks of tuning with few labels).

The draw is seeded by :data:`SEED`, not ``run.seed``: every trial of a study, whatever its seed, is measured on
the same images.

>>> labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
>>> held = validation_rows(labels, 0.5)
>>> labels[held].tolist()
[0, 0, 1, 1, 1]
"""

from __future__ import annotations

import torch

from sslkit.errors import UserError

SEED = 0  # the validation images of one dataset are the same in every run that holds them out


def validation_rows(labels: torch.Tensor, fraction: float) -> torch.Tensor:
    """Sorted indices of ``round(fraction * n_c)`` images of every class ``c`` of a labelled split, drawn at random
    with :data:`SEED`.

    Raises:
        UserError: a class that would keep none of its images for training (or give none to validation).

    Shape:
        labels: (N,) int64, every one a class; returns (V,) int64.
    """
    generator = torch.Generator().manual_seed(SEED)
    held = []
    for c, count in zip(*(t.tolist() for t in torch.unique(labels, return_counts=True))):
        k = round(fraction * count)
        if not 0 < k < count:
            raise UserError(
                f"data.val_fraction={fraction} holds out {k} of the {count} training images of class {c}, leaving "
                f"{'none to validate on' if k == 0 else 'none to train on'}; give a fraction that keeps some of "
                f"every class on both sides, e.g. 0.1"
            )
        members = (labels == c).nonzero().flatten()
        held.append(members[torch.randperm(count, generator=generator)[:k]])
    return torch.cat(held).sort().values


def without(rows: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``rows`` but those in ``held``, in their order."""
    return rows[torch.isin(rows, held, invert=True)]
