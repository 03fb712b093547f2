"""Class-balanced, seeded subsets of the labels: training and evaluating with 1% or 10% of them.

The semi-supervised protocol of SimCLR (Chen et al. 2020, https://arxiv.org/abs/2002.05709,
section 7) keeps a class-balanced 1% or 10% of the labelled training images. Here the subset
holds the same number ``k`` of images of every class,

    k = labels_per_class                          or   k = round(label_fraction * N / C)

(``N`` labelled images of ``C`` classes, at least one each), drawn by a generator seeded with
``seed`` alone: the same seed picks the same images on every machine and in every process. A run
saves its subset as ``label_subset.json``; a resumed run and ``sslkit-evaluate`` read the saved indices
back, so a result is measured on exactly the images it was trained with.

``data.label_subset`` names such a file instead: the labels someone chose, most often
``sslkit-select``'s choice from the images' embeddings (:mod:`sslkit.selection`). Its ``indices``
index the labelled training split; when the file says what it was chosen among (``embeddings``: the
number of images, the dataset and split) and their classes (``labels``), a run of another dataset
or split is refused in one line rather than trained on the wrong images.

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
    """Which subset: a fraction of the labelled images or a count per class, and the seed that picks it; or the
    label file that names it (``data.label_subset``)."""

    fraction: float | None
    per_class: int | None
    seed: int
    file: str | None = None

    @property
    def everything(self) -> bool:
        return self.file is None and self.per_class is None and (self.fraction is None or self.fraction == 1)

    def describe(self) -> str:
        if self.file is not None:
            return f"as {self.file} names them"
        amount = f"{self.per_class} per class" if self.per_class is not None else f"{self.fraction:g} of the labels"
        return f"{amount} (seed {self.seed})"


def spec_for(cfg, for_evaluation: bool = False) -> LabelSpec:
    """The recipe's subset: ``data.*``, or for evaluation ``eval.*`` where those are set."""
    d, e = cfg.data, cfg.eval
    fraction, per_class, file = d.label_fraction, d.labels_per_class, d.label_subset
    if for_evaluation and (e.label_fraction is not None or e.labels_per_class is not None):
        fraction, per_class, file = e.label_fraction, e.labels_per_class, None
    return LabelSpec(fraction, per_class, cfg.run.seed if d.label_seed is None else d.label_seed, file)


def choose(
    labels: torch.Tensor, spec: LabelSpec, candidates: torch.Tensor | None = None, counted: int | None = None
) -> torch.Tensor:
    """Sorted indices of ``k`` images of every class present among ``candidates`` (default: every image): ``k`` is
    ``spec.per_class``, or ``spec.fraction`` of ``counted`` images (default: the candidates) over the classes.

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
    counted = len(pool) if counted is None else counted
    k = spec.per_class if spec.per_class is not None else max(1, round(spec.fraction * counted / len(classes)))
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
    if LabelSpec(saved["fraction"], saved["per_class"], saved["seed"], saved.get("file")) != spec:
        return None  # another subset (an evaluation at another fraction): chosen afresh, deterministically
    return torch.tensor(saved["indices"], dtype=torch.int64)


def read_label_file(path: Path, labels: torch.Tensor, dataset: str) -> torch.Tensor:
    """The sorted indices a label file (``data.label_subset``) names, checked against the labelled split.

    Args:
        path: the file: ``indices`` into the labelled training split, and optionally what they were chosen
            among (``embeddings``: ``count``, ``data.name``, ``data.split``) and their classes (``labels``).
        labels: the labelled training split's labels.
        dataset: its dataset's name.

    Raises:
        UserError: no such file, no indices, or indices chosen among another dataset or split (its count, name,
            split, an index out of range, or classes that disagree).
    """
    what = f"data.label_subset '{path}'"
    record = _label_record(path, what, dataset)
    indices = torch.tensor(record["indices"], dtype=torch.int64).unique()
    _check_chosen_among(record, what, len(labels), dataset)
    if int(indices.min()) < 0 or int(indices.max()) >= len(labels):
        raise UserError(
            f"{what} names image {int(indices.max())}, but {dataset}'s train split has {len(labels)} (0 to "
            f"{len(labels) - 1}); it was chosen on another dataset"
        )
    if "labels" in record and labels[indices].tolist() != record["labels"]:
        raise UserError(
            f"{what}: the classes it records disagree with {dataset}'s train split at the same indices; it was "
            f"chosen on another dataset (or another order of it)"
        )
    return indices


def _label_record(path: Path, what: str, dataset: str) -> dict:
    """A label file's JSON, refused in one line when it is missing, unreadable or names no indices."""
    if not path.is_file():
        raise UserError(f"{what} does not exist; give the label file sslkit-select wrote (its --out)")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UserError(f"{what} is not valid JSON ({error}); give the label file sslkit-select wrote") from None
    if isinstance(record, dict) and record.get("indices"):
        return record
    if isinstance(record, dict) and "items" in record:
        raise UserError(
            f"{what} names images by path, not by index into a whole dataset split; select on embeddings of "
            f"every image of {dataset}'s train split"
        )
    raise UserError(f"{what} holds no 'indices'; give the label file sslkit-select wrote, or a run's {FILE_NAME}")


def _check_chosen_among(record: dict, what: str, count: int, dataset: str) -> None:
    """The images a label file was chosen among (``embeddings``) are the ``count`` of ``dataset``'s train split."""
    source = record.get("embeddings") or {}
    data = source.get("data") if isinstance(source.get("data"), dict) else {}
    among = f"{data.get('name', '?')} {data.get('split', '?')}"
    if source.get("count") is not None and source["count"] != count:
        raise UserError(
            f"{what} was chosen among {source['count']} images ({among}) but this run's labelled training split "
            f"({dataset} train) has {count}; select on embeddings of {dataset}'s train split"
        )
    if data.get("name", dataset) != dataset or data.get("split", "train") != "train":
        raise UserError(
            f"{what} was chosen among {among}, not {dataset} train; select on embeddings of {dataset}'s train split"
        )


def labelled_subset(
    labels: torch.Tensor,
    spec: LabelSpec,
    candidates: torch.Tensor,
    saved: Path | None,
    dataset: str = "the dataset",
    counted: int | None = None,
    kept_out: str = "the classes data.holdout_classes keeps out of training",
):
    """The indices of ``spec``'s subset: read back from ``saved`` when it holds this spec, else chosen among
    ``candidates`` (a fraction of ``counted`` images: :func:`choose`), or read from the label file ``spec.file``,
    checked against ``labels`` of ``dataset``'s labelled split and refused where it names images of ``kept_out``.

    Returns None when the spec keeps every label.
    """
    if spec.everything:
        return None
    indices = load(saved, spec) if saved is not None else None
    if indices is None and spec.file is not None:
        indices = read_label_file(Path(spec.file), labels, dataset)
        if not bool(torch.isin(indices, candidates).all()):
            raise UserError(
                f"data.label_subset '{spec.file}' labels images of {kept_out}; drop them from the file, or keep "
                f"other images out"
            )
        return indices
    if indices is None:
        return choose(labels, spec, candidates, counted)
    if not bool(torch.isin(indices, candidates).all()):
        raise UserError(
            f"{saved} names images outside this run's labelled training split; it belongs to another dataset: "
            f"delete it, or evaluate with the data.* settings the run was trained with"
        )
    return indices
