"""How many labels, and which images carry them: the budgets and selections of the label-efficiency comparison.

A **budget** is a fraction of the N labelled training images (``--fractions 0.01,0.1,1``) or a number
of them (``--labels 100,600``). A **selection** says which images get the labels:

- ``balanced``: the same number of images of every class, drawn at random and seeded
  (``data.label_fraction`` or ``data.labels_per_class`` with ``data.label_seed``,
  :mod:`sslkit.datasets.label_subset`): ``max(1, round(f N / C))`` of each of the C classes for a
  fraction f, ``n / C`` for n labels (n a multiple of C). It reads every image's class to balance
  them: an oracle that no one holding unlabelled images has, the reference a selection is held to;
- a strategy of :mod:`sslkit.selection` (``random``, ``kmeans``, ``typiclust``, ``probcover``,
  ``kcenter``): ``sslkit-select`` chooses ``round(f N)`` (or n) images from the pretrained encoder's
  embeddings of the training split, never reading a label, and writes a label file that the runs
  train on (``data.label_subset``).

A budget of every label (a fraction of 1, or N labels) needs no choice: its runs are made once,
with ``data.label_fraction=1``, under the selection ``all``.

>>> pool = LabelPool("digits", (100,) * 10)
>>> tiny = LabelSet("balanced", Budget(count=50), 0, pool, Path("labels"))
>>> tiny.tag, tiny.labels, tiny.train_keys()
('n50', 50, {'data.label_fraction': 'null', 'data.labels_per_class': 5, 'data.label_seed': 0, 'run.seed': 0})
>>> chosen = LabelSet("typiclust", Budget(fraction=0.01), 2, pool, Path("labels"))
>>> chosen.tag, chosen.labels, chosen.select_run, chosen.file
('typiclust-f0.01', 10, 'select-typiclust-f0.01-s2', PosixPath('labels/typiclust-f0.01-s2.json'))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from sslkit.config import Config
from sslkit.datasets import build_splits
from sslkit.errors import UserError
from sslkit.experiments.runs import fraction_text
from sslkit.selection import STRATEGIES

BALANCED = "balanced"
EVERY_LABEL = "all"  # the selection of a budget of every label: nothing to choose
SELECTIONS = (BALANCED, *STRATEGIES)


@dataclass(frozen=True)
class Budget:
    """How many labels: a fraction of the labelled training images, or a number of them (one of the two)."""

    fraction: float | None = None
    count: int | None = None

    @property
    def text(self) -> str:
        """``0.01`` or ``100``: as the tables show it."""
        return fraction_text(self.fraction) if self.fraction is not None else str(self.count)

    @property
    def tag(self) -> str:
        """``f0.01`` or ``n100``: as run names and label files carry it."""
        return f"f{self.text}" if self.fraction is not None else f"n{self.count}"

    @property
    def value(self) -> float:
        """The fraction or the count: what budgets are ordered and plotted by."""
        return self.fraction if self.fraction is not None else float(self.count)


@dataclass(frozen=True)
class LabelPool:
    """The labelled training images the budgets are taken from: how many of every class (of those present)."""

    dataset: str
    class_counts: tuple[int, ...]

    @property
    def images(self) -> int:
        return sum(self.class_counts)

    @property
    def classes(self) -> int:
        return len(self.class_counts)

    def everything(self, budget: Budget) -> bool:
        return budget.fraction == 1 or budget.count == self.images

    def per_class(self, budget: Budget) -> int:
        """How many images of every class ``balanced`` keeps for ``budget`` (as label_subset.choose counts them)."""
        if budget.fraction is not None:
            return max(1, round(budget.fraction * self.images / self.classes))
        return budget.count // self.classes


def label_pool(cfg: Config) -> LabelPool:
    """The labelled training split of ``cfg``'s data (its classes in data.holdout_classes left out).

    Raises:
        UserError: data without a labelled training split (an unlabelled folder, class-disjoint retrieval data).
    """
    memory = build_splits(cfg).memory
    if memory is None:
        raise UserError(
            f"data.name={cfg.data.name}: label efficiency needs a labelled training split to take the labels "
            f"from; use a labelled dataset (digits, fashion_mnist, cifar10, ...)"
        )
    counts = torch.bincount(memory.labels)
    return LabelPool(cfg.data.name, tuple(int(c) for c in counts[counts > 0]))


@dataclass(frozen=True)
class LabelSet:
    """The labelled images of one selection, budget and seed: what every road of theirs trains on.

    ``selection`` is ``balanced``, a strategy of :mod:`sslkit.selection`, or ``all`` (a budget of every label);
    ``labels_dir`` is where a strategy's label file goes.
    """

    selection: str
    budget: Budget
    seed: int
    pool: LabelPool
    labels_dir: Path

    @property
    def chosen_by_strategy(self) -> bool:
        return self.selection in STRATEGIES

    @property
    def tag(self) -> str:
        """In run names: the budget's tag, after the strategy's name when one chooses: ``typiclust-n100``."""
        return f"{self.selection}-{self.budget.tag}" if self.chosen_by_strategy else self.budget.tag

    @property
    def labels(self) -> int:
        """How many labelled images the runs train with."""
        if self.selection == EVERY_LABEL:
            return self.pool.images
        if self.selection == BALANCED:
            return self.pool.per_class(self.budget) * self.pool.classes
        return self.budget.count if self.budget.count is not None else round(self.budget.fraction * self.pool.images)

    @property
    def select_run(self) -> str | None:
        """The name of the sslkit-select run that writes :attr:`file`; None when no strategy chooses."""
        return f"select-{self.tag}-s{self.seed}" if self.chosen_by_strategy else None

    @property
    def file(self) -> Path | None:
        """The label file a strategy's choice is written to: ``<labels_dir>/<strategy>-<budget>-s<seed>.json``."""
        return self.labels_dir / f"{self.tag}-s{self.seed}.json" if self.chosen_by_strategy else None

    def run_name(self, kind: str) -> str:
        return f"{kind}-{self.tag}-s{self.seed}"

    def train_keys(self) -> dict[str, object]:
        """The keys a trained run gets for these labels; its run seed is the labels' seed."""
        seed = {"data.label_seed": self.seed, "run.seed": self.seed}
        if self.selection == EVERY_LABEL:
            return {"data.label_fraction": "1", **seed}
        if self.chosen_by_strategy:
            nulls = {"data.label_fraction": "null", "data.labels_per_class": "null"}
            return {**nulls, "data.label_subset": self.file, "run.seed": self.seed}
        if self.budget.fraction is not None:
            return {"data.label_fraction": self.budget.text, **seed}
        return {"data.label_fraction": "null", "data.labels_per_class": self.pool.per_class(self.budget), **seed}

    def eval_overrides(self) -> list[str]:
        """The overrides of ``sslkit-evaluate`` of the frozen encoder on these labels (the probe seeded as a run)."""
        seed = [f"data.label_seed={self.seed}", f"run.seed={self.seed}"]
        if self.selection == EVERY_LABEL:
            return ["eval.label_fraction=1", *seed]
        if self.chosen_by_strategy:
            nulls = ["eval.label_fraction=null", "eval.labels_per_class=null"]
            data = ["data.label_fraction=null", "data.labels_per_class=null", f"data.label_subset={self.file}"]
            return [*data, *nulls, f"run.seed={self.seed}"]
        if self.budget.fraction is not None:
            return [f"eval.label_fraction={self.budget.text}", *seed]
        return ["eval.label_fraction=null", f"eval.labels_per_class={self.pool.per_class(self.budget)}", *seed]

    def fields(self) -> dict[str, object]:
        """The columns of every run on these labels: the selection, the budget as asked, the labels it makes."""
        return {"selection": self.selection, "budget": self.budget.text, "labels": self.labels}


def label_sets(
    budgets: list[Budget], selections: list[str], seeds: list[int], pool: LabelPool, labels_dir: Path
) -> list[LabelSet]:
    """Every set of labels the comparison trains on, by budget, then seed, then selection (one ``all`` set per
    seed at a budget of every label)."""
    sets = []
    for budget in budgets:
        chosen = [EVERY_LABEL] if pool.everything(budget) else selections
        sets += [LabelSet(selection, budget, seed, pool, labels_dir) for seed in seeds for selection in chosen]
    return sets


# --------------------------------------------------------------------------- the options, checked


def parse_fractions(text: str) -> list[float]:
    """``0.01,0.1,1`` -> ``[0.01, 0.1, 1.0]``, sorted; each in (0, 1], none twice."""
    fractions = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise UserError(
                f"--fractions '{text}': '{part.strip()}' is not a number; give fractions of the labels, "
                f"e.g. --fractions 0.01,0.1,1"
            ) from None
        if not 0 < value <= 1 or math.isnan(value):
            raise UserError(
                f"--fractions '{text}': {part.strip()} is outside (0, 1]; 0.01 keeps 1% of the labels, 1 all of them"
            )
        fractions.append(value)
    texts = [fraction_text(f) for f in fractions]
    if len(set(texts)) < len(texts):
        raise UserError(f"--fractions '{text}': a fraction appears twice")
    return sorted(fractions)


def parse_counts(text: str) -> list[int]:
    """``600,100`` -> ``[100, 600]``: numbers of labelled images, each at least 1, none twice."""
    counts = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            raise UserError(
                f"--labels '{text}': '{part.strip()}' is not a whole number; give numbers of labelled images, "
                f"e.g. --labels 100,600"
            ) from None
        if value < 1:
            raise UserError(f"--labels '{text}': {value} labels leave nothing to train on; give at least 1")
        counts.append(value)
    if len(set(counts)) < len(counts):
        raise UserError(f"--labels '{text}': a number appears twice")
    return sorted(counts)


def parse_budgets(fractions: str | None, counts: str | None) -> list[Budget]:
    """The budgets of ``--fractions`` or of ``--labels``: exactly one of the two."""
    if (fractions is None) == (counts is None):
        given = "both" if fractions is not None else "neither"
        raise UserError(
            f"give the label budgets as --fractions (e.g. 0.01,0.1,1) or as --labels (numbers of labelled images, "
            f"e.g. 100,600), one of the two; {given} given"
        )
    if fractions is not None:
        return [Budget(fraction=f) for f in parse_fractions(fractions)]
    return [Budget(count=n) for n in parse_counts(counts)]


def parse_selections(text: str) -> list[str]:
    """``balanced,typiclust`` -> the selections, in the order given; each known, none twice."""
    selections = [part.strip() for part in text.split(",")]
    for selection in selections:
        if selection not in SELECTIONS:
            raise UserError(
                f"--select '{text}': unknown selection '{selection}'; choose among {', '.join(SELECTIONS)} "
                f"(balanced: a class-balanced random draw, which reads the labels)"
            )
    if len(set(selections)) < len(selections):
        raise UserError(f"--select '{text}': a selection appears twice")
    return selections


def check_budgets(budgets: list[Budget], selections: list[str], pool: LabelPool, fixmatch: bool) -> None:
    """Refuse budgets the labelled training split cannot give, or that leave a selection or FixMatch nothing to do.

    Raises:
        UserError: more labels than images; a budget that leaves a strategy no image to choose; with ``balanced``,
            a number of labels that is not a multiple of the classes, or more of a class than it has; every budget
            all the labels while a strategy or FixMatch needs images without one.
    """
    what = f"{pool.dataset}'s labelled training split"
    for budget in budgets:
        if budget.count is not None and budget.count > pool.images:
            raise UserError(
                f"--labels {budget.count}: {what} has {pool.images} images; give at most {pool.images} "
                f"({pool.images}: every label)"
            )
        if pool.everything(budget):
            continue
        if any(s in STRATEGIES for s in selections) and budget.fraction is not None:
            if round(budget.fraction * pool.images) < 1:
                raise UserError(
                    f"--fractions {budget.text} of the {pool.images} images of {what} is no image for --select to "
                    f"choose; give a fraction of at least {fraction_text(1 / pool.images)}"
                )
        if BALANCED in selections:
            check_balanced(budget, pool)
    if all(pool.everything(b) for b in budgets):
        chooses = [s for s in selections if s in STRATEGIES]
        if chooses or fixmatch:
            needs = f"--select {chooses[0]} chooses images to label" if chooses else "--fixmatch needs unlabelled ones"
            raise UserError(
                f"{needs}, but every budget labels all {pool.images} images of {what}; add a smaller budget"
            )


def check_balanced(budget: Budget, pool: LabelPool) -> None:
    """``balanced`` keeps the same number of every class: a number of labels that is a multiple of the classes, and
    no more of a class than it has."""
    classes = pool.classes
    if budget.count is not None and budget.count % classes:
        below, above = budget.count // classes * classes, (budget.count // classes + 1) * classes
        nearest = f"{below} or {above}" if below else str(above)
        raise UserError(
            f"--labels {budget.count}: --select balanced keeps the same number of each of the {classes} classes of "
            f"{pool.dataset}; give a multiple of {classes}, e.g. {nearest}"
        )
    per_class, smallest = pool.per_class(budget), min(pool.class_counts)
    if per_class > smallest:
        option = f"--labels {budget.count}" if budget.count is not None else f"--fractions {budget.text}"
        raise UserError(
            f"{option}: --select balanced keeps {per_class} images of every class, but a class of {pool.dataset} "
            f"has only {smallest}; give a smaller budget"
        )
