"""An embeddings folder on disk: what ``sslkit-embed`` writes and every other embeddings command reads.

Layout::

    <folder>/
        embeddings.npy   (N, D) float32 or float16, a plain NumPy ``.npy`` file (``np.load(..., mmap_mode="r")``)
        items.csv        row,item,label: the row of embeddings.npy, the image (a path, or a dataset index),
                         its class id (empty when the source has no labels)
        meta.json        source, backbone, layer, transform, dimension, count, dtype, normalized, ...

Why ``.npy`` and not a CSV of numbers (lightly's ``embeddings.csv``): 60,000 x 512 floats are 123 MB
as ``.npy`` and open in microseconds memory-mapped; as text they are three times larger and take
seconds to parse. Rows are read memory-mapped, so a folder larger than memory can be searched.

A folder is complete once ``meta.json`` says ``"complete": true``; a writer that stops part-way
leaves ``complete: false`` and :func:`read_embeddings` refuses it with one line.

>>> import tempfile
>>> folder = write_embeddings(tempfile.mkdtemp(), np.eye(3, dtype=np.float32), ["a.png", "b.png", "c.png"])
>>> read_embeddings(folder).vectors.shape
(3, 3)
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np

from sslkit.errors import UserError
from sslkit.files import written_whole

VECTORS_FILE = "embeddings.npy"
ITEMS_FILE = "items.csv"
META_FILE = "meta.json"
DTYPES = ("float32", "float16")


@dataclasses.dataclass(frozen=True)
class Embeddings:
    """An embeddings folder, read.

    Attributes:
        folder: where it was read from.
        vectors: (N, D) float32 or float16, memory-mapped read-only.
        items: N item names (an image path, or a dataset index as text).
        labels: (N,) int64 class ids, or None when the source has no labels.
        meta: the folder's ``meta.json``.
    """

    folder: Path
    vectors: np.ndarray
    items: list[str]
    labels: np.ndarray | None
    meta: dict

    def __len__(self) -> int:
        return len(self.items)

    @property
    def normalized(self) -> bool:
        """Whether each row was L2-normalised when written (cosine similarity is then a dot product)."""
        return bool(self.meta.get("normalized", False))


def write_items(path: Path, items: list[str], labels: np.ndarray | None) -> None:
    """``items.csv``: ``row,item,label``, the label empty where there is none."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "item", "label"])
        for row, item in enumerate(items):
            writer.writerow([row, item, "" if labels is None else int(labels[row])])


def read_items(path: Path) -> tuple[list[str], np.ndarray | None]:
    """The items and labels of an ``items.csv`` (labels None when the column is empty throughout)."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != ["row", "item", "label"]:
            raise UserError(f"'{path}' is not an sslkit items.csv: its header is {header}, expected row,item,label")
        rows = list(reader)
    items = [row[1] for row in rows]
    given = [row[2] for row in rows]
    if not any(given):
        return items, None
    if not all(given):
        raise UserError(f"'{path}': some rows have a label and some do not; every row needs one, or none")
    return items, np.asarray([int(label) for label in given], dtype=np.int64)


def write_meta(path: Path, meta: dict) -> None:
    """Write ``meta.json`` atomically: a reader sees the old file or the new one, never half of one."""
    with written_whole(path) as tmp:
        tmp.write_text(json.dumps(meta, indent=2))


def write_embeddings(
    folder: str | Path,
    vectors: np.ndarray,
    items: list[str],
    labels: np.ndarray | None = None,
    meta: dict | None = None,
) -> Path:
    """Write a whole embeddings folder from arrays in memory (``sslkit-embed`` writes in chunks instead).

    Shape:
        vectors: (N, D) float32 or float16; labels: (N,) integer class ids or None.
    """
    folder = Path(folder)
    vectors = np.asarray(vectors)
    if vectors.ndim != 2 or vectors.dtype.name not in DTYPES:
        raise ValueError(f"vectors must be (N, D) float32 or float16, got {vectors.dtype.name} {vectors.shape}")
    if len(items) != len(vectors) or (labels is not None and len(labels) != len(vectors)):
        raise ValueError(f"{len(vectors)} vectors need as many items and labels, got {len(items)} items")
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / VECTORS_FILE, vectors)
    write_items(folder / ITEMS_FILE, items, labels)
    norms = np.linalg.norm(vectors.astype(np.float32), axis=1)
    info = {
        "count": len(vectors),
        "dimension": int(vectors.shape[1]),
        "dtype": vectors.dtype.name,
        "normalized": bool(np.allclose(norms, 1.0, atol=1e-3)),
        **(meta or {}),
        "complete": True,
    }
    write_meta(folder / META_FILE, info)
    return folder


def read_embeddings(folder: str | Path) -> Embeddings:
    """Open an embeddings folder, checking that its three files agree; one line for what does not."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"'{folder}' is not a folder; give the output folder of sslkit-embed")
    missing = [name for name in (VECTORS_FILE, ITEMS_FILE, META_FILE) if not (folder / name).is_file()]
    if missing:
        raise UserError(
            f"'{folder}' has no {', '.join(missing)}: it is not an embeddings folder written by sslkit-embed"
        )
    meta = json.loads((folder / META_FILE).read_text())
    if not meta.get("complete", False):
        raise UserError(
            f"'{folder}' is an unfinished sslkit-embed run ({meta.get('rows_done', 0)} of {meta.get('count', '?')} "
            f"rows); run the same sslkit-embed command again to finish it"
        )
    try:
        vectors = np.load(folder / VECTORS_FILE, mmap_mode="r")
    except ValueError as error:  # a truncated or foreign file
        raise UserError(f"'{folder / VECTORS_FILE}' is not a readable .npy file ({error})") from None
    items, labels = read_items(folder / ITEMS_FILE)
    if vectors.ndim != 2 or len(vectors) != len(items):
        raise UserError(
            f"'{folder}': {VECTORS_FILE} holds {vectors.shape[0] if vectors.ndim else 0} rows but {ITEMS_FILE} "
            f"{len(items)}; the folder was changed after it was written: embed again"
        )
    return Embeddings(folder, vectors, items, labels, meta)
