"""An embeddings folder in, a label file out: what ``sslkit-select`` does.

The label file is a run's ``label_subset.json`` (:mod:`sslkit.datasets.label_subset`), extended with
how it was chosen, so that ``data.label_subset=FILE`` trains any recipe on exactly those labels::

    {"fraction": null, "per_class": null, "seed": 0,
     "indices": [...],             every labelled image (the --labelled ones and the new), sorted: indices into
                                   the split the embeddings hold, when their items are its dataset indices
     "items": [...],               the same images by name, when the items are image paths instead
     "chosen": [...],              the new images, in the order the strategy chose them
     "labels": [...],              the class of each of "indices", when the embeddings carry labels: a run
                                   checks them against its own data
     "strategy": "typiclust", "budget": 100,
     "labelled": {"file": ..., "count": 20} or null,
     "embeddings": {"folder": ..., "count": 60000, "data": {"name": "fashion_mnist", "split": "train", ...}},
     "details": {...}}             what the strategy measured (ProbCover: delta, its purity, the coverage)

Labels already given (``--labelled``) come as such a file (or a run's ``label_subset.json``), or as a
text file of items, one per line, as ``items.csv`` names them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from sslkit.embeddings import Embeddings, read_embeddings
from sslkit.errors import UserError
from sslkit.files import written_whole
from sslkit.selection.strategies import choose


@dataclasses.dataclass(frozen=True)
class LabelFile:
    """What ``sslkit-select`` wrote: where, and the record (see the module docstring)."""

    path: Path
    record: dict


def dataset_indices(items: list[str]) -> np.ndarray | None:
    """The items as integers when they are the dataset indices ``0 .. N-1`` of a whole split (in any order),
    else None (image paths, shard keys, or part of a split)."""
    if not all(item.isdigit() for item in items):
        return None
    indices = np.asarray([int(item) for item in items], dtype=np.int64)
    if not np.array_equal(np.sort(indices), np.arange(len(items))):
        return None
    return indices


def labelled_rows(path: Path, embeddings: Embeddings) -> np.ndarray:
    """The rows of ``embeddings`` that a ``--labelled`` file names.

    Raises:
        UserError: no such file, or items that are not in the embeddings.
    """
    if not path.is_file():
        raise UserError(
            f"--labelled '{path}' does not exist; give a label file (sslkit-select's, or a run's "
            f"label_subset.json) or a text file of items, one per line"
        )
    names = _names_in(path)
    row_of = {item: row for row, item in enumerate(embeddings.items)}
    missing = [name for name in names if name not in row_of]
    if missing:
        raise UserError(
            f"--labelled '{path}' names {len(missing)} of its {len(names)} images that are not items of "
            f"{embeddings.folder} (first: '{missing[0]}'); give the labels of the images these embeddings hold"
        )
    return np.unique(np.asarray([row_of[name] for name in names], dtype=np.int64))


def _names_in(path: Path) -> list[str]:
    """The item names of a label file (its indices as text, or its items) or of a text file of items."""
    text = path.read_text()
    if text.lstrip().startswith("{"):
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise UserError(f"--labelled '{path}' is not valid JSON ({error})") from None
        if "indices" in record:
            return [str(int(index)) for index in record["indices"]]
        if "items" in record:
            return [str(item) for item in record["items"]]
        raise UserError(f"--labelled '{path}' holds neither 'indices' nor 'items'; it is no label file")
    return [line.strip() for line in text.splitlines() if line.strip()]


def default_out(folder: Path, strategy: str, total: int, seed: int) -> Path:
    """``labels-<strategy>-<labels>-seed<seed>.json`` in the embeddings folder."""
    return folder / f"labels-{strategy}-{total}-seed{seed}.json"


def select_to_file(
    folder: str | Path,
    budget: int,
    strategy: str,
    labelled: str | Path | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    delta: float | None = None,
    classes: int | None = None,
) -> LabelFile:
    """Choose ``budget`` images of the embeddings folder and write the label file (nothing on a bad request).

    ProbCover's number of pseudo-classes defaults to the number of classes among the embeddings' labels.

    Raises:
        UserError: an unreadable folder, a bad ``--labelled`` file, or a request :func:`~.strategies.choose`
            refuses.
    """
    embeddings = read_embeddings(folder)
    labelled_path = Path(labelled) if labelled is not None else None
    already = labelled_rows(labelled_path, embeddings) if labelled_path is not None else np.empty(0, np.int64)
    if strategy == "probcover" and delta is None and classes is None and embeddings.labels is not None:
        classes = len(np.unique(embeddings.labels[embeddings.labels >= 0]))
    selection = choose(embeddings.vectors, budget, strategy, already, seed, delta, classes)
    rows = np.union1d(already, selection.rows)
    record = {
        "fraction": None,
        "per_class": None,
        "seed": seed,
        **_named(embeddings, rows, selection.rows),
        "strategy": strategy,
        "budget": budget,
        "labelled": None if labelled_path is None else {"file": str(labelled_path), "count": len(already)},
        "embeddings": {
            "folder": str(embeddings.folder.resolve()),
            "count": len(embeddings),
            **{key: embeddings.meta[key] for key in ("data", "source", "layer") if key in embeddings.meta},
        },
        "details": {"classes": classes, **selection.details} if strategy == "probcover" else selection.details,
    }
    path = Path(out) if out is not None else default_out(embeddings.folder, strategy, len(rows), seed)
    _write_atomically(path, record)
    return LabelFile(path, record)


def _named(embeddings: Embeddings, rows: np.ndarray, chosen: np.ndarray) -> dict:
    """``indices`` (or ``items``), ``chosen`` and ``labels`` of the label file for these rows."""
    indices = dataset_indices(embeddings.items)
    if indices is not None:
        named = {"indices": sorted(indices[rows].tolist()), "chosen": indices[chosen].tolist()}
        order = rows[np.argsort(indices[rows])]  # the rows in the order of their sorted indices
    else:
        named = {"items": [embeddings.items[r] for r in rows], "chosen": [embeddings.items[r] for r in chosen]}
        order = rows
    if embeddings.labels is not None:
        named["labels"] = embeddings.labels[order].tolist()
    return named


def _write_atomically(path: Path, record: dict) -> None:
    """A reader (or a run started meanwhile) sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as tmp:
        tmp.write_text(json.dumps(record))
