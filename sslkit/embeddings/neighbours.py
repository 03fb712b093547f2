"""Each item's k nearest neighbours by cosine similarity: exact and blockwise, or approximate with faiss.

Both searches are :mod:`sslkit.evaluation.search`'s; this module reads them from embeddings files,
checks the request, shows progress and writes the result.

Exact (``index="exact"``, the default): :func:`~sslkit.evaluation.search.exact_search`. The set
searched is held in memory as L2-normalised float32 (N x D x 4 bytes: 123 MB for 60,000 x 512); the
queries are read from the file one block of rows at a time, and each block's similarities are the
only other large array, :data:`~sslkit.evaluation.search.SIMILARITY_BLOCK_BYTES` at most. Neighbours
come most similar first, equal similarities by lowest row (the order of faiss' exact index).

Approximate (``index="faiss"``): faiss' IVF-Flat (``ivf``) or HNSW-Flat (``hnsw``) index over the
inner product of L2-normalised vectors (:func:`~sslkit.evaluation.search.build_faiss_index`, whose
module gives the settings), for sets where N^2 similarities take too long; efSearch is
``max(DEFAULT_EF_SEARCH, 2k)`` unless given. faiss holds its own copy of the vectors, so the
approximate search needs twice the exact one's memory for the set. :func:`recall_at_k` measures
what the approximation loses, against the exact search on a sample of queries
(``tools/bench/neighbours.py``).

When the queries are the set itself (``queries=None``) an item is removed from its own list; an
exact duplicate of it is not. ``sslkit-neighbours`` writes the result as ``neighbours.npz``
(:func:`save_neighbours`).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from sslkit.embeddings.choices import FAISS_TYPES, INDEXES
from sslkit.errors import UserError
from sslkit.evaluation.search import (
    DEFAULT_EF_SEARCH,
    build_faiss_index,
    exact_search,
    faiss_search,
    rows_per_block,
    unit_vectors,
)
from sslkit.files import written_whole


def progress_bar(description: str, enabled: bool) -> Progress:
    """A transient rich bar (it disappears when done: logs keep the results only)."""
    columns = (TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    return Progress(*columns, transient=True, disable=not enabled)


def check_finite(vectors, name: str) -> None:
    """Raise one line naming the first row with a NaN or inf, reading ``vectors`` a block at a time."""
    step = rows_per_block(1) * 16
    for start in range(0, len(vectors), step):
        finite = np.isfinite(np.asarray(vectors[start : start + step])).all(axis=1)
        if not finite.all():
            row = start + int(np.flatnonzero(~finite)[0])
            raise UserError(f"{name}: row {row} has NaN or inf values; embed again (the encoder diverged?)")


def read_unit_vectors(vectors, progress: bool = False) -> torch.Tensor:
    """:func:`~sslkit.evaluation.search.unit_vectors`, with a progress bar.

    Shape:
        vectors: (N, D) tensor or NumPy array (a memory map); returns: (N, D) float32 on the CPU.
    """
    with progress_bar("reading vectors", progress) as bar:
        task = bar.add_task("", total=len(vectors))
        return unit_vectors(vectors, lambda rows: bar.advance(task, rows))


def check_search(vectors, k: int, queries, index: str, faiss_type: str) -> None:
    """One line for each mistake: a wrong shape, another dimension, k beyond the set, an unknown index."""
    if vectors.ndim != 2 or len(vectors) == 0:
        raise UserError(f"the embeddings must be a non-empty (N, D) matrix, got shape {tuple(vectors.shape)}")
    if queries is not None and (queries.ndim != 2 or queries.shape[1] != vectors.shape[1]):
        raise UserError(
            f"the queries have {queries.shape[-1]} dimensions, the embeddings {vectors.shape[1]}: embed both "
            f"with the same encoder"
        )
    available = len(vectors) - (queries is None)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"k must be a whole number >= 1, got {k!r}")
    if k > available:
        others = f"{len(vectors)} items less the query itself" if queries is None else f"{len(vectors)} items"
        raise UserError(f"k={k} is more neighbours than there are ({others}): give k <= {available}")
    if index not in INDEXES:
        raise UserError(f"index must be one of {', '.join(INDEXES)}, got {index!r}")
    if faiss_type not in FAISS_TYPES:
        raise UserError(f"faiss_type must be one of {', '.join(FAISS_TYPES)}, got {faiss_type!r}")


def exact_neighbours(
    references: torch.Tensor, queries, k: int, own_columns: torch.Tensor | None, progress: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~sslkit.evaluation.search.exact_search`, with a progress bar, as NumPy arrays.

    Shape:
        references: (N, D) L2-normalised float32; queries: (Q, D) tensor or NumPy array;
        own_columns: (Q,) each query's own row among the references (excluded), or None;
        returns: similarities (Q, k) float32 and indices (Q, k) int64.
    """
    with progress_bar("exact neighbours", progress) as bar:
        task = bar.add_task("", total=len(queries))
        found = exact_search(queries, references, k, own_columns, on_rows=lambda rows: bar.advance(task, rows))
    return found[0].numpy(), found[1].numpy()


def approximate_neighbours(
    references: torch.Tensor,
    queries,
    k: int,
    own_columns: torch.Tensor | None,
    faiss_type: str,
    nprobe: int | None,
    ef_search: int,
    seed: int,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """A faiss index built over ``references`` and searched (:func:`~sslkit.evaluation.search.faiss_search`),
    with progress bars.

    Shape:
        as :func:`exact_neighbours`.
    """
    with progress_bar(f"building the faiss {faiss_type} index", progress) as bar:
        task = bar.add_task("", total=len(references))
        index = build_faiss_index(
            references.numpy(), faiss_type, nprobe, ef_search, seed, lambda rows: bar.advance(task, rows)
        )
    own = None if own_columns is None else own_columns.numpy()
    with progress_bar("faiss neighbours", progress) as bar:
        task = bar.add_task("", total=len(queries))
        return faiss_search(index, queries, k, own, lambda rows: bar.advance(task, rows))


def nearest_neighbours(
    vectors,
    k: int = 10,
    queries=None,
    index: str = "exact",
    faiss_type: str = "ivf",
    nprobe: int | None = None,
    ef_search: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest items of each query by cosine similarity, most similar first.

    Without ``queries`` every item of ``vectors`` is a query and is left out of its own list (an
    exact duplicate of it stays in). ``index="exact"`` searches every pair, blockwise;
    ``index="faiss"`` an approximate faiss index (``faiss_type`` ``"ivf"`` or ``"hnsw"``, module
    docstring), with ``nprobe`` lists scanned (IVF) or an ``ef_search`` candidate list (HNSW).

    Args:
        vectors: the set searched, e.g. ``read_embeddings(folder).vectors``; any float dtype.
        k: neighbours per query.
        queries: other vectors to find neighbours for, of the same dimension, or None.
        index, faiss_type, nprobe, ef_search: the search (module docstring).
        seed: the IVF index's training sample and k-means.
        progress: show rich progress bars.

    Shape:
        vectors: (N, D) NumPy array (a memory map) or tensor; queries: (Q, D) or None (Q = N);
        returns: similarities (Q, k) float32 and indices (Q, k) int64 rows of ``vectors``.

    >>> similarities, indices = nearest_neighbours(np.eye(3, dtype=np.float32) + 0.1, k=1)
    >>> indices[:, 0].tolist()
    [1, 0, 0]
    """
    check_search(vectors, k, queries, index, faiss_type)
    for name, value in (("nprobe", nprobe), ("ef_search", ef_search)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if queries is not None:
        check_finite(queries, "the queries")
    references = read_unit_vectors(vectors, progress)  # (N, D)
    if not torch.isfinite(references).all():
        check_finite(vectors, "the embeddings")
    own_columns = torch.arange(len(vectors)) if queries is None else None
    queries = references if queries is None else queries
    if index == "exact":
        return exact_neighbours(references, queries, k, own_columns, progress)
    ef_search = ef_search or max(DEFAULT_EF_SEARCH, 2 * k)
    return approximate_neighbours(references, queries, k, own_columns, faiss_type, nprobe, ef_search, seed, progress)


def recall_at_k(vectors, indices: np.ndarray, queries=None, sample: int = 1000, seed: int = 0) -> float:
    """Recall@k of neighbour lists against the exact search: the share of each query's exact k nearest that
    its list holds, averaged over ``sample`` queries drawn at random (all of them when fewer).

    Shape:
        vectors: (N, D); indices: (Q, k) from :func:`nearest_neighbours` on the same vectors and queries.
    """
    if sample < 1:
        raise UserError(f"the recall sample must be >= 1 queries, got {sample}")
    num_queries, k = indices.shape
    rows = np.sort(np.random.default_rng(seed).permutation(num_queries)[:sample])
    references = unit_vectors(vectors)
    sampled = references[rows] if queries is None else np.asarray(queries[rows])
    own_columns = torch.from_numpy(rows) if queries is None else None
    _, exact = exact_neighbours(references, sampled, k, own_columns)
    found = [len(np.intersect1d(exact[i], indices[row])) for i, row in enumerate(rows)]
    return float(np.sum(found) / (len(rows) * k))


def check_output(path: Path, suffixes: tuple[str, ...]) -> None:
    """One line, before any work, for an output path that cannot be written."""
    if path.suffix not in suffixes:
        raise UserError(f"--out '{path}': give a file ending in {' or '.join(suffixes)}")
    if not path.parent.is_dir():
        raise UserError(f"--out '{path}': the folder '{path.parent}' does not exist; create it or give another path")
    if not os.access(path.parent, os.W_OK):
        raise UserError(f"--out '{path}': '{path.parent}' is not writable; give a writable path")


def save_neighbours(
    path: Path,
    similarities: np.ndarray,
    indices: np.ndarray,
    query_items: list[str] | None = None,
    items: list[str] | None = None,
) -> None:
    """Write neighbours as ``.npz`` (arrays ``indices`` (Q, k) int64, ``similarities`` (Q, k) float32:
    ``np.load(path)["indices"]``) or as ``.csv`` (``query_row,query_item,rank,neighbour_row,neighbour_item,
    similarity``, rank 1 the nearest), whole or not at all."""
    path = Path(path)
    with written_whole(path) as tmp:
        if path.suffix == ".npz":
            with open(tmp, "wb") as f:
                np.savez(f, indices=indices, similarities=similarities)
            return
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["query_row", "query_item", "rank", "neighbour_row", "neighbour_item", "similarity"])
            for row in range(len(indices)):
                for rank, (column, similarity) in enumerate(zip(indices[row], similarities[row]), start=1):
                    query_item = query_items[row] if query_items else ""
                    item = items[column] if items and column >= 0 else ""
                    writer.writerow([row, query_item, rank, int(column), item, f"{similarity:.6f}"])
