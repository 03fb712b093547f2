"""Class-balanced, seeded subsets of the labels: training and evaluating with 1% or 10% of them.

The semi-supervised protocol of SimCLR (Chen et al. 2020, https://arxiv.org/abs/2002.05709,
section 7) keeps a class-balanced 1% or 10% of the labelled training images. Here the subset
holds the same number ``k`` of images of every class,

    k = labels_per_class                          or   k = round(label_fraction * N / C)

(``N`` labelled images of ``C`` classes, at least one each), drawn by a generator seeded with
``seed`` alone: the same seed picks the same images on every machine and in every process. A run
saves its subset as ``label_subset.json``; a resumed run and ``sslkit-evaluate`` read the saved indices
back, so a result is measured on exactly the images it was trained with.

>>> import torch
>>> labels = torch.arange(10).repeat(30)  # 300 images, 10 classes
>>> spec = LabelSpec(fraction=0.1, per_class=None, seed=0)
>>> chosen = choose(labels, spec)
>>> len(chosen), torch.bincount(labels[chosen]).tolist()
(30, [3, 3, 3, 3, 3, 3, 3, 3, 3, 3])
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sslkit.errors import UserError

FILE_NAME = "label_subset.json"


@dataclass(frozen=True)
class LabelSpec:
    """Which subset: a fraction of the labelled images or a count per class, and the seed that picks it."""

    fraction: float | None
    per_class: int | None
    seed: int

    @property
    def everything(self) -> bool:
        return self.per_class is None and (self.fraction is None or self.fraction == 1)

    def describe(self) -> str:
        amount = f"{self.per_class} per class" if self.per_class is not None else f"{self.fraction:g} of the labels"
        return f"{amount} (seed {self.seed})"


def spec_for(cfg, for_evaluation: bool = False) -> LabelSpec:
    """The recipe's subset: ``data.*``, or for evaluation ``eval.*`` where those are set."""
    d, e = cfg.data, cfg.eval
    fraction, per_class = d.label_fraction, d.labels_per_class
    if for_evaluation and (e.label_fraction is not None or e.labels_per_class is not None):
        fraction, per_class = e.label_fraction, e.labels_per_class
    return LabelSpec(fraction, per_class, cfg.run.seed if d.label_seed is None else d.label_seed)


def choose(labels: torch.Tensor, spec: LabelSpec, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Sorted indices of ``k`` images of every class present among ``candidates`` (default: every image).

    Raises:
        UserError: unlabelled images (-1) among the candidates, or a class with fewer than ``k`` images.

    Shape:
        labels: (N,) int64; candidates: (M,) int64 indices into ``labels``; returns (k * C,) int64.
    """
    candidates = torch.arange(len(labels)) if candidates is None else candidates
    pool = labels[candidates]
    if bool((pool < 0).any()):
        raise UserError(
            f"a label subset ({spec.describe()}) needs a labelled split, but {int((pool < 0).sum())} of its "
            f"{len(pool)} images have no label; train on data.train_split=train or drop data.label_fraction"
        )
    classes, counts = torch.unique(pool, return_counts=True)
    k = spec.per_class if spec.per_class is not None else max(1, round(spec.fraction * len(pool) / len(classes)))
    smallest = int(counts.min())
    if k > smallest:
        key = "data.labels_per_class" if spec.per_class is not None else "data.label_fraction"
        raise UserError(
            f"{key} asks for {k} labelled images of every class, but class {int(classes[counts.argmin()])} has "
            f"only {smallest}; ask for at most {smallest} per class"
        )
    generator = torch.Generator().manual_seed(spec.seed)
    chosen = []
    for c in classes.tolist():  # classes in order, each with its own draw from the one generator
        members = candidates[pool == c]
        chosen.append(members[torch.randperm(len(members), generator=generator)[:k]])
    return torch.cat(chosen).sort().values


def save(path: Path, spec: LabelSpec, indices: torch.Tensor) -> None:
    """``label_subset.json``: the spec and the chosen indices into the labelled training split."""
    Path(path).write_text(json.dumps({**asdict(spec), "indices": indices.tolist()}))


def load(path: Path, spec: LabelSpec) -> torch.Tensor | None:
    """The saved indices when ``path`` holds a subset of this spec; None when there is no such file."""
    path = Path(path)
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if LabelSpec(saved["fraction"], saved["per_class"], saved["seed"]) != spec:
        return None  # another subset (an evaluation at another fraction): chosen afresh, deterministically
    return torch.tensor(saved["indices"], dtype=torch.int64)


def labelled_subset(labels: torch.Tensor, spec: LabelSpec, candidates: torch.Tensor, saved: Path | None):
    """The indices of ``spec``'s subset: read back from ``saved`` when it holds this spec, else chosen.

    Returns None when the spec keeps every label.
    """
    if spec.everything:
        return None
    indices = load(saved, spec) if saved is not None else None
    if indices is None:
        return choose(labels, spec, candidates)
    if not bool(torch.isin(indices, candidates).all()):
        raise UserError(
            f"{saved} names images outside this run's labelled training split; it belongs to another dataset: "
            f"delete it, or evaluate with the data.* settings the run was trained with"
        )
    return indices
