"""Search by cosine similarity: L2 normalisation, blockwise similarities and distances, exact top-k, faiss.

One implementation for every user: the kNN evaluator and the retrieval metrics
(:mod:`sslkit.evaluation`), ``sslkit-neighbours`` and ``sslkit-duplicates``
(:mod:`sslkit.embeddings`), and the label-selection strategies (:mod:`sslkit.selection`).
k-means is :mod:`sslkit.evaluation.clustering`'s.

Bounded memory. Similarities are computed for one block of query rows at a time against every
reference (:func:`cosine_blocks`, :func:`squared_distance_blocks`), into one buffer reused from
block to block, so the largest array is one (rows, N) block, never the (Q, N) matrix
(60,000 x 60,000 float32 would be 14 GB). A caller keeps what it needs of a block before asking
for the next, which overwrites it. One buffer rather than a fresh block each time: the C allocator
would place blocks of under 32 MB on its heap, between the small results a caller keeps, and the
heap would grow by a block each time.

Order of neighbours (:func:`exact_search`): most similar first, exact ties by the reference's
index, lowest first (:mod:`sslkit.evaluation.top_k`, which ranks every exact search: faiss' exact
index and pytorch-metric-learning's default kNN order them so). A query's own column
(``own_columns``: the same item among the references) is set to ``-inf``, so it never ranks among
its neighbours; an exact duplicate of it does.

Approximate search (:func:`build_faiss_index`, :func:`faiss_search`) is faiss' index over the
inner product of L2-normalised vectors, which is their cosine similarity, for sets where N^2
similarities take too long:

- ``ivf``: IVF-Flat, the vectors split into ``nlist`` = 4 sqrt(N) lists by k-means (the faiss
  wiki's 4-16 sqrt(N); at most N / 39, the training points faiss asks per list), trained on up to
  :data:`IVF_TRAINING_PER_LIST` rows per list; a query scans the ``nprobe`` lists nearest to it
  (:data:`DEFAULT_NPROBE`).
- ``hnsw``: HNSW-Flat, :data:`HNSW_LINKS` links per vector, efConstruction
  :data:`HNSW_EF_CONSTRUCTION`, efSearch as the caller asks (``sslkit-neighbours``:
  ``max(DEFAULT_EF_SEARCH, 2k)``).

faiss holds its own copy of the vectors, so an index needs twice the exact search's memory for the set.
"""

from __future__ import annotations

import concurrent.futures
import math
import queue
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from sslkit.errors import UserError, install_hint
from sslkit.evaluation.top_k import (
    Chunks,
    Tiles,
    chunks_for,
    key_columns,
    key_values,
    tile_maxima,
    top_keys,
)

# A block of query rows holds at most this many bytes of similarities: 1,118 rows against 60,000.
SIMILARITY_BLOCK_BYTES = 256 * 2**20
MAX_ROWS_PER_BLOCK = 4096
# The exact search (tools/bench/neighbours.py --cases floor; tools/bench/README.md): query rows per block,
# and reference columns per matrix product on the CPU (a multiple of top_k.CHUNK), whose (rows, columns) tile
# of similarities is still in cache when its chunk maxima are taken; None: one product per block, as on a GPU.
SEARCH_ROWS = 512
TILE_COLUMNS = 1024
# Rows of a distance block of the selection strategies: 512 x 60,000 float32 is 123 MB.
BLOCK_ROWS = 512

# Lists an IVF query scans. 16 found 0.999 of the exact 10 nearest among 60,000 Fashion-MNIST
# embeddings (980 lists; 8: 0.987, 32: 1.0 at 2.7x the time) and all of them among 1,000,000
# clustered vectors (4,000 lists; 8: 0.998 and more) (tools/bench/README.md).
DEFAULT_NPROBE = 16
# Training vectors per IVF list: faiss asks 39 at least and samples 256 at most. 256 trained the
# 4,000 lists of 1,000,000 x 128 in 383 s, 64 in 93 s, to the same recall (tools/bench/README.md).
IVF_TRAINING_PER_LIST = 64
HNSW_LINKS = 32
HNSW_EF_CONSTRUCTION = 40
DEFAULT_EF_SEARCH = 64
# Query rows per faiss search call: large enough for its threads, small enough for a progress bar.
FAISS_QUERY_BLOCK = 16384
INSTALL_FAISS = f"{install_hint('faiss')} (or pip install faiss-cpu)"

# Called with the number of rows each block finished: a progress bar's advance, or nothing.
OnRows = Callable[[int], None] | None


def rows_per_block(num_references: int) -> int:
    """Query rows per block: a (rows, num_references) float32 block within :data:`SIMILARITY_BLOCK_BYTES`."""
    return max(1, min(MAX_ROWS_PER_BLOCK, SIMILARITY_BLOCK_BYTES // (4 * max(num_references, 1))))


def _advance(on_rows: OnRows, rows: int) -> None:
    if on_rows is not None:
        on_rows(rows)


# --------------------------------------------------------------------------- L2 normalisation


def unit_rows(rows, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rows of a tensor or of a NumPy array (a memory map is read here, only these rows), L2-normalised float32.

    ``x / max(||x||, 1e-12)``: a zero row stays zero.

    Shape:
        rows: (c, D) any float dtype; returns: (c, D) float32 on ``device``.
    """
    if isinstance(rows, torch.Tensor):
        rows = rows.to(device=device, dtype=torch.float32)
    else:
        rows = torch.from_numpy(np.array(rows, dtype=np.float32)).to(device)  # a copy: a memory map is read-only
    return F.normalize(rows, dim=1)


def unit_vectors(vectors, on_rows: OnRows = None) -> torch.Tensor:
    """All of ``vectors`` L2-normalised as float32 in memory, read once, a block of rows at a time.

    Shape:
        vectors: (N, D) tensor or NumPy array (a memory map); returns: (N, D) float32 on the CPU.
    """
    result = torch.empty(len(vectors), vectors.shape[1], dtype=torch.float32)
    step = rows_per_block(1)
    for start in range(0, len(vectors), step):
        result[start : start + step] = unit_rows(vectors[start : start + step])
        _advance(on_rows, min(step, len(vectors) - start))
    return result


# --------------------------------------------------------------------------- blockwise similarities


def cosine_blocks(
    queries: torch.Tensor,
    references: torch.Tensor,
    rows_per_block: int = BLOCK_ROWS,
    own_columns: torch.Tensor | None = None,
    first: int = 0,
    last: int | None = None,
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Cosine similarities of the queries against every reference, one block of query rows at a time.

    Yields ``(start, stop, similarity)`` for query rows ``start:stop`` of ``first:last``, every block
    in the same buffer (module docstring). A query's own column (``own_columns``) is ``-inf``.

    Shape:
        queries: (Q, D) and references: (G, D), L2-normalised float32 on one device;
        own_columns: (Q,) int64, or None; similarity: (stop - start, G) float32.
    """
    last = len(queries) if last is None else last
    buffer = torch.empty(max(0, min(rows_per_block, last - first)), len(references), device=references.device)
    for start in range(first, last, rows_per_block):
        stop = min(start + rows_per_block, last)
        similarity = torch.mm(queries[start:stop], references.T, out=buffer[: stop - start])  # (c, G)
        if own_columns is not None:
            rows = torch.arange(stop - start, device=references.device)
            similarity[rows, own_columns[start:stop].to(references.device)] = float("-inf")
        yield start, stop, similarity


def squared_distance_blocks(
    queries: torch.Tensor, references: torch.Tensor, rows_per_block: int = BLOCK_ROWS
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(start, stop, ||q - x||^2 of queries[start:stop] to every reference)``, block after block, in one buffer.

    ``||q - x||^2 = 2 - 2 q . x`` for unit rows, clamped at 0 (rounding makes a point's distance to
    itself about -1e-7).

    Shape:
        queries: (Q, D) and references: (N, D) unit rows; each block: (at most rows_per_block, N).
    """
    for start, stop, similarity in cosine_blocks(queries, references, rows_per_block):
        yield start, stop, similarity.mul_(-2).add_(2).clamp_(min=0)  # in place: no temporaries


def squared_distances(queries: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
    """``||q - x||^2`` between unit rows, clamped at 0, in one product.

    Shape:
        queries: (B, D); references: (N, D); returns: (B, N).
    """
    return (queries @ references.T).mul_(-2).add_(2).clamp_(min=0)


# --------------------------------------------------------------------------- exact search


def exact_search(
    queries,
    references: torch.Tensor,
    k: int,
    own_columns: torch.Tensor | None = None,
    block_rows: int | None = None,
    on_rows: OnRows = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most similar references of each query, in the order of the module docstring.

    A block of query rows (read, converted to float32 and L2-normalised a block at a time, so the
    queries may be a NumPy memory map larger than memory) meets a block of reference columns, a tile
    of :data:`TILE_COLUMNS` at a time on the CPU, each tile's chunk maxima taken while it is in cache;
    :func:`~sslkit.evaluation.top_k.top_keys` finds the block's top k from them, and the blocks of
    columns are merged by their keys (:class:`BlockSearch`). On the CPU with torch's ``T`` threads,
    ``T`` blocks of queries are searched at once, each on one thread (torch's intra-op threads are set
    to one meanwhile, and restored): a core never waits for another between two products, which kept
    two threads twice as fast as two threads sharing each product (tools/bench/README.md). Memory:
    :data:`SIMILARITY_BLOCK_BYTES` of similarities in all.

    Args:
        queries: the rows to find neighbours for.
        references: the rows searched, L2-normalised.
        k: neighbours per query, at most G.
        own_columns: each query's own row among the references, never its neighbour; or None.
        block_rows: query rows per block (default :data:`SEARCH_ROWS`).
        on_rows: called with the rows of each finished block, in order, from the calling thread.

    Shape:
        queries: (Q, D) tensor or NumPy array; references: (G, D) float32; own_columns: (Q,) int64;
        returns: similarities (Q, k) float32 and columns (Q, k) int64, on the references' device.
    """
    if not 1 <= k <= len(references):
        raise ValueError(f"k must be between 1 and the {len(references)} references, got {k}")
    device = references.device
    rows = min(block_rows or SEARCH_ROWS, max(len(queries), 1))
    keys = torch.empty(len(queries), k, dtype=torch.long, device=device)

    def search(searcher: BlockSearch, start: int, stop: int) -> None:
        own = None if own_columns is None else own_columns[start:stop].to(device)
        keys[start:stop] = searcher.top_keys(unit_rows(queries[start:stop], device), own)

    over_query_blocks(len(queries), rows, lambda workers: BlockSearch(references, k, rows, workers), search, on_rows)
    return key_values(keys), key_columns(keys, len(references))


def over_query_blocks(
    count: int, rows: int, make: Callable[[int], BlockSearch], work: Callable, on_rows: OnRows = None
) -> None:
    """``work(searcher, start, stop)`` for each block of ``rows`` of ``count`` query rows, on as many threads as
    torch has on the CPU, each with its own ``make(threads)`` and torch's intra-op threads set to one meanwhile.

    ``on_rows`` hears of the blocks in order, on the calling thread.
    """
    starts = range(0, count, rows)
    threads = max(1, min(torch.get_num_threads(), len(starts)))
    searchers = queue.SimpleQueue()
    for _ in range(threads):
        searchers.put(make(threads))

    def run(start: int) -> int:
        searcher = searchers.get()
        try:
            work(searcher, start, min(start + rows, count))
        finally:
            searchers.put(searcher)
        return min(start + rows, count) - start

    if threads == 1:
        for start in starts:
            _advance(on_rows, run(start))
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            for done in pool.map(run, starts):
                _advance(on_rows, done)
    finally:
        torch.set_num_threads(previous)


class BlockSearch:
    """The top k of blocks of query rows among ``references``, with its own buffers (one per thread).

    The references are cut into blocks of equal width, ``rows`` x width float32 within a ``1 / threads``
    share of :data:`SIMILARITY_BLOCK_BYTES`; each is held in tiles of :data:`TILE_COLUMNS` columns on the
    CPU (one tile elsewhere, and wherever the top k has no chunks: ``k`` near the width).
    """

    def __init__(self, references: torch.Tensor, k: int, rows: int, threads: int = 1) -> None:
        self.references, self.k, self.rows = references, k, rows
        widest = max(1, SIMILARITY_BLOCK_BYTES // (4 * rows * threads))
        self.width = -(-len(references) // -(-len(references) // widest))  # blocks of equal width
        tile = TILE_COLUMNS if references.device.type == "cpu" else None  # None: one product per block
        self.parts = []
        for first, part in zip(range(0, len(references), self.width), references.split(self.width)):
            chunks = chunks_for(len(part), k, tile)
            self.parts.append((first, part, chunks, tile if tile and chunks is not None else len(part)))
        self.flat = references.new_empty(rows * (self.width + (tile or 0)))  # the tiles of one (rows, width) block
        most = max((chunks.count for _, _, chunks, _ in self.parts if chunks is not None), default=0)
        self.maxima = references.new_empty(rows, most)

    def products(self, block: torch.Tensor, part: torch.Tensor, chunks: Chunks | None, tile: int):
        """The block's similarities to one block of references, as :class:`~sslkit.evaluation.top_k.Tiles`, and
        their chunk maxima, each tile's right after its product, while it is in cache.

        Shape:
            block: (c, D); part: (w, D); returns: Tiles of (c, w), maxima (c, chunks.count)
        """
        tiles = Tiles(self.flat, len(block), len(part), tile, self.rows)
        maxima = self.maxima[: len(block), : chunks.count if chunks is not None else 0]
        for index, start in enumerate(range(0, len(part), tile)):
            product = torch.mm(block, part[start : start + tile].T, out=tiles.matrix(index))
            # The chunk tiles of this product: the same tile on the CPU, all of them in one product elsewhere.
            for first in range(start, start + product.shape[1], chunks.tile) if chunks is not None else ():
                whole = min(chunks.tile, chunks.whole - first)
                if whole > 0:
                    out = maxima[:, first // chunks.size : (first + whole) // chunks.size]
                    tile_maxima(product[:, first - start : first - start + whole], chunks.size, out)
        return tiles, maxima

    def top_keys(self, block: torch.Tensor, own: torch.Tensor | None) -> torch.Tensor:
        """The block's top k as :func:`~sslkit.evaluation.top_k.order_keys`, ``own`` its rows' own columns.

        Shape:
            block: (c, D) L2-normalised; own: (c,) int64 or None; returns: (c, k) int64
        """
        best = None
        for first, part, chunks, tile in self.parts:
            tiles, maxima = self.products(block, part, chunks, tile)
            if own is not None:
                _leave_out(tiles, own - first, chunks, maxima)
            found = top_keys(tiles, self.k, chunks, maxima, first, len(self.references))  # (c, min(k, w))
            best = found if best is None else _merge(best, found, self.k)
        return best


def _leave_out(tiles: Tiles, own: torch.Tensor, chunks: Chunks | None, maxima) -> None:
    """Each row's own column, where it falls in this block of columns, set to -inf, and its chunk's maximum anew.

    Shape:
        own: (rows,) the own columns counted from the block's first; maxima: (rows, chunks.count)
    """
    rows = ((own >= 0) & (own < tiles.width)).nonzero()[:, 0]
    tiles.flat[tiles.positions(rows[:, None], own[rows, None])] = float("-inf")
    if chunks is not None:
        rows = rows[own[rows] < chunks.whole]
        chunk = chunks.of(own[rows])
        columns = chunks.columns(chunk[:, None])[:, : chunks.size]  # (n, size)
        maxima[rows, chunk] = tiles.gather(columns, rows).amax(dim=1)


def _merge(keys: torch.Tensor, more: torch.Tensor, k: int) -> torch.Tensor:
    """The first ``k`` of two rows of keys. Shape: (c, a) and (c, b); returns: (c, min(k, a + b))"""
    both = torch.cat([keys, more], dim=1)
    return both.topk(min(k, both.shape[1]), dim=1).values


# --------------------------------------------------------------------------- faiss


def faiss_installed() -> bool:
    """Whether faiss can be imported (a missing package, or one a test hid)."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def import_faiss():
    """The faiss module, or one line saying how to install it."""
    try:
        import faiss
    except ImportError:
        raise UserError(f"the faiss index needs faiss, which is not installed: {INSTALL_FAISS}") from None
    return faiss


def ivf_lists(num_vectors: int) -> int:
    """nlist = 4 sqrt(N), at most N / 39 (faiss' minimum of training points per list), at least 1."""
    return max(1, min(round(4 * math.sqrt(num_vectors)), num_vectors // 39))


def build_faiss_index(
    references: np.ndarray,
    faiss_type: str,
    nprobe: int | None,
    ef_search: int,
    seed: int = 0,
    on_rows: OnRows = None,
):
    """A trained faiss index over inner products holding ``references`` (module docstring for the settings).

    Shape:
        references: (N, D) L2-normalised float32, C-contiguous.
    """
    faiss = import_faiss()
    num_vectors, dimension = references.shape
    if faiss_type == "hnsw":
        index = faiss.IndexHNSWFlat(dimension, HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = ef_search
    else:
        nlist = ivf_lists(num_vectors)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dimension), dimension, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        sample = np.random.default_rng(seed).permutation(num_vectors)[: IVF_TRAINING_PER_LIST * nlist]
        index.train(references[np.sort(sample)])
        index.nprobe = min(nlist, nprobe or DEFAULT_NPROBE)
    for start in range(0, num_vectors, FAISS_QUERY_BLOCK):
        index.add(references[start : start + FAISS_QUERY_BLOCK])
        _advance(on_rows, min(FAISS_QUERY_BLOCK, num_vectors - start))
    return index


def faiss_search(
    index, queries, k: int, own_columns: np.ndarray | None = None, on_rows: OnRows = None
) -> tuple[np.ndarray, np.ndarray]:
    """The index's k neighbours of each query; with ``own_columns``, k + 1 searched and the query's own row dropped
    (or the last, where the index did not return the query itself). -1 (similarity -inf) where it found fewer.

    Shape:
        queries: (Q, D) tensor or NumPy array, L2-normalised here; own_columns: (Q,) int64 or None;
        returns: similarities (Q, k) float32 and indices (Q, k) int64.
    """
    extra = int(own_columns is not None)
    similarities = np.empty((len(queries), k), dtype=np.float32)
    indices = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), FAISS_QUERY_BLOCK):
        stop = min(start + FAISS_QUERY_BLOCK, len(queries))
        found_similarity, found = index.search(unit_rows(queries[start:stop]).numpy(), k + extra)  # (c, k + extra)
        if extra:
            keep = found != own_columns[start:stop, None]
            keep[keep.all(axis=1), -1] = False  # itself not among them: drop the least similar instead
            found_similarity, found = found_similarity[keep].reshape(-1, k), found[keep].reshape(-1, k)
        found_similarity[found < 0] = -np.inf
        similarities[start:stop], indices[start:stop] = found_similarity, found
        _advance(on_rows, stop - start)
    return similarities, indices
