"""The top k of each row of a block of similarities, in one order: largest first, equal values by lowest column.

Every exact search of sslkit ranks with this module (:func:`sslkit.evaluation.search.exact_search`,
and :func:`nearest_columns` for the retrieval metrics), so one order holds everywhere: the order of
faiss' exact index (its heaps compare (distance, id) pairs), pytorch-metric-learning's default kNN.
``torch.topk`` alone leaves the order of equal values unspecified; fixing it makes results
independent of block sizes and of the number of processes.

The order is carried by one int64 per value (:func:`order_keys`): the value's bits made monotonic,
then the column counted backwards, so that no two keys of a row are equal and a row's top k is one
``topk`` of keys. Keys are only made for candidates: a ``torch.topk`` of one more value than asked
(where the last two tie, the row is ranked again over all its columns), or, on a wide row, the few
chunks whose maxima can hold the answer (:class:`Chunks`, :func:`top_keys`), so that a row of
100,000 similarities costs one pass for its chunk maxima and a ``topk`` of 3,125 of them.
"""

from __future__ import annotations

import dataclasses
import math

import torch

# Columns per chunk at most (a power of 2; the tiles of the exact search then hold 32 chunks at least, whose
# maxima are vectorised), the cost of a candidate against a chunk maximum's (measured: tools/bench/neighbours.py
# --cases floor, tools/bench/README.md), and the share of a row's columns the chunks holding its top k may hold
# at most (beyond: topk over the whole row).
CHUNK = 32
CANDIDATE_COST = 8
CANDIDATE_SHARE = 1 / 8
# Chunk maxima per group whose maximum ranks them first (:func:`largest`).
GROUP = 32


def order_keys(values: torch.Tensor, columns: torch.Tensor, num_columns: int) -> torch.Tensor:
    """One int64 per entry that sorts as (value, then lower column first) does: ties broken in one comparison.

    The high 32 bits are the float32 value's bits made monotonic (a negative float's bits count
    down as it grows: flip them), the low 32 bits the column counted backwards. No two keys of a
    row are equal, so their order is total and a row's top k of them is unique.

    Shape:
        values: (c, k) float32; columns: (c, k) int64, below ``num_columns`` < 2^32; returns: (c, k) int64
    """
    bits = (values + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into 0.0, which compares equal to it
    monotonic = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (monotonic.long() << 32) | (num_columns - 1 - columns)


def key_values(keys: torch.Tensor) -> torch.Tensor:
    """The float32 values that :func:`order_keys` encoded (-0.0 comes back as 0.0). Shape: (c, k) both."""
    monotonic = (keys >> 32).int()
    return (monotonic ^ ((monotonic >> 31) & 0x7FFFFFFF)).view(torch.float32)


def key_columns(keys: torch.Tensor, num_columns: int) -> torch.Tensor:
    """The columns that :func:`order_keys` encoded. Shape: (c, k) both."""
    return num_columns - 1 - (keys & 0xFFFFFFFF)


@dataclasses.dataclass(frozen=True)
class Chunks:
    """The columns ``0 .. width - 1`` of a block of similarities in chunks of ``size``, whose maxima narrow a
    row's top k down to a few chunks (:func:`top_keys`).

    The block is held in tiles of ``tile`` columns, the last one shorter where ``tile`` does not divide
    ``width``, each tile a contiguous (rows, columns) matrix. Chunk ``j`` of a tile of ``w`` columns holds
    its columns ``j, j + w/size, j + 2 w/size, ...``, so the chunk maxima of a tile are the elementwise
    maximum of its ``size`` contiguous column runs: one vectorised pass, while the tile is in cache.
    Chunks are numbered through the tiles (the tile from column ``f`` holds chunks ``f / size`` on). The
    last ``width % tile % size`` columns fill no chunk: they are always candidates.
    """

    width: int
    tile: int
    size: int

    @property
    def whole(self) -> int:
        """The columns in chunks."""
        return self.width - self.width % self.tile % self.size

    @property
    def count(self) -> int:
        return self.whole // self.size

    def tiles(self) -> list[tuple[int, int, int]]:
        """``(first column, columns, columns in chunks)`` of each tile."""
        starts = range(0, self.width, self.tile)
        return [(f, min(self.tile, self.width - f), min(self.tile, self.whole - f)) for f in starts]

    def step(self, tile_first: torch.Tensor) -> torch.Tensor:
        """The step between the columns of a chunk of the tile starting at ``tile_first``: its chunks' count."""
        return torch.clamp(self.whole - tile_first, max=self.tile) // self.size

    def columns(self, chunks: torch.Tensor) -> torch.Tensor:
        """The columns of the given chunks, then every column in no chunk.

        Shape:
            chunks: (c, n) int64; returns: (c, n * size + width - whole) int64
        """
        tile_first = chunks.div(self.tile // self.size, rounding_mode="floor") * self.tile
        first = tile_first + chunks - tile_first // self.size  # (c, n)
        offsets = torch.arange(self.size, device=chunks.device) * self.step(tile_first)[..., None]  # (c, n, size)
        rest = torch.arange(self.whole, self.width, device=chunks.device).expand(len(chunks), -1)
        return torch.cat([(first[..., None] + offsets).flatten(1), rest], dim=1)

    def of(self, columns: torch.Tensor) -> torch.Tensor:
        """The chunk of each column below :attr:`whole`. Shape: any int64, kept."""
        tile_first = columns.div(self.tile, rounding_mode="floor") * self.tile
        return tile_first // self.size + (columns - tile_first) % self.step(tile_first)


def chunks_for(width: int, depth: int, tile: int | None) -> Chunks | None:
    """The chunks of a block of ``width`` columns for its top ``depth``, in tiles of ``tile`` columns (a multiple
    of :data:`CHUNK`; None: one tile), or None where ``topk`` over the whole row is cheaper.

    A row costs the ranking of its ``width / size`` chunk maxima and the keys of ``depth * size`` candidates:
    the size balancing the two, ``sqrt(width / (CANDIDATE_COST * depth))``, to the nearest power of 2 from 4 to
    :data:`CHUNK` (100,000 columns, k = 10: 32). None where even then the candidates would be over
    :data:`CANDIDATE_SHARE` of the row.
    """
    balanced = math.sqrt(width / (CANDIDATE_COST * depth))
    size = min(CHUNK, 2 ** max(2, round(math.log2(max(balanced, 1)))))
    chunks = Chunks(width, tile or max(width - width % size, size), size)
    fits = depth * size <= width * CANDIDATE_SHARE and chunks.count > depth
    return chunks if fits else None


def tile_maxima(tile: torch.Tensor, size: int, out: torch.Tensor) -> None:
    """The maxima of a tile's chunks (:class:`Chunks`).

    Shape:
        tile: (c, w), w a multiple of size; out: (c, w / size)
    """
    if tile.shape[1]:
        torch.amax(tile.unflatten(1, (size, -1)), dim=1, out=out)


@dataclasses.dataclass(frozen=True)
class Tiles:
    """A (rows, width) block of similarities held tile by tile in one flat buffer: tile ``t`` is the contiguous
    (stride, tile) matrix from ``flat[t * stride * tile]``, its first ``rows`` rows in use, so that column
    ``j`` of row ``r`` is ``flat[((j // tile) * stride + r) * tile + j % tile]``."""

    flat: torch.Tensor
    rows: int
    width: int
    tile: int
    stride: int

    @classmethod
    def of(cls, similarity: torch.Tensor) -> Tiles:
        """A plain block as one tile. Shape: similarity: (c, G), contiguous."""
        return cls(similarity.view(-1), len(similarity), similarity.shape[1], similarity.shape[1], len(similarity))

    def matrix(self, index: int) -> torch.Tensor:
        """Tile ``index`` as a (rows, columns) matrix."""
        start = index * self.stride * self.tile
        columns = min(self.tile, self.width - index * self.tile)
        return self.flat[start : start + self.stride * self.tile].view(self.stride, self.tile)[: self.rows, :columns]

    def positions(self, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """Where column ``columns[i, j]`` of row ``rows[i]`` is in :attr:`flat`.

        Shape:
            rows: (n, 1); columns: (n, m); returns: (n, m)
        """
        tile_index = columns.div(self.tile, rounding_mode="floor")
        return (tile_index * self.stride + rows) * self.tile + columns - tile_index * self.tile

    def gather(self, columns: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Column ``columns[i, j]`` of row ``rows[i]`` (default: row i). Shape: columns: (n, m); returns: (n, m)"""
        rows = torch.arange(len(columns), device=columns.device) if rows is None else rows
        return self.flat[self.positions(rows[:, None], columns)]

    def whole_rows(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """These rows (default: all), every column: a view of all rows of one tile, else a copy.

        Shape:
            rows: (n,); returns: (n, width)
        """
        if self.tile >= self.width:
            return self.matrix(0) if rows is None else self.matrix(0)[rows]
        rows = torch.arange(self.rows, device=self.flat.device) if rows is None else rows
        return self.gather(torch.arange(self.width, device=rows.device).expand(len(rows), -1), rows)


def top_keys(tiles: Tiles, depth: int, chunks: Chunks | None, maxima, first: int, total: int) -> torch.Tensor:
    """:func:`order_keys` of each row's ``depth`` first columns, in order; the block's columns are columns
    ``first ..`` of ``total``.

    With ``chunks`` and their ``maxima``, a row's top lies in its ``depth`` chunks of largest maxima (and the
    columns in no chunk) wherever the ``depth + 1``-th maximum is below the ``depth``-th: every other column is
    at most that maximum, so below ``depth`` values inside them. That leaves a few times ``depth`` candidates
    of the row's width. A row whose two maxima are equal (values tied across the cut) is ranked over all its
    columns. Without chunks (a ``depth`` near the width), ``topk`` over the whole row.

    Shape:
        maxima: (rows, chunks.count); returns: (rows, min(depth, width)) int64
    """
    every = torch.arange(first, first + tiles.width, device=tiles.flat.device)
    if chunks is None:
        return _top_keys_of(tiles.whole_rows(), every.expand(tiles.rows, -1), depth, total)
    top, best = largest(maxima, depth + 1)  # (rows, depth + 1), largest first
    candidates = chunks.columns(best[:, :depth])  # (rows, depth * size + width - whole)
    keys = _top_keys_of(tiles.gather(candidates), candidates + first, depth, total)
    spills = (top[:, depth - 1] == top[:, depth]).nonzero()[:, 0]
    if len(spills):
        keys[spills] = _top_keys_of(tiles.whole_rows(spills), every.expand(len(spills), -1), depth, total)
    return keys


def largest(values: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``count`` largest values, largest first, and their columns (equal values in no set order).

    A wide row goes through the maxima of its groups of :data:`GROUP` columns: its ``count`` largest values
    lie in its ``count`` groups of largest maxima and the columns in no group, so one ``topk`` of the group
    maxima and one of those groups' values replace a ``topk`` of the row. (Where groups tie at the cut, a value
    of a group left out can equal the last one kept: the values are the same, a column may be another.)

    Shape:
        values: (c, n); returns: (c, min(count, n)) values and int64 columns
    """
    whole = values.shape[1] - values.shape[1] % GROUP
    if whole < 4 * GROUP * count:
        return values.topk(min(count, values.shape[1]), dim=1)
    groups = values[:, :whole].unflatten(1, (-1, GROUP)).amax(dim=2)  # (c, whole / GROUP)
    best = groups.topk(count, dim=1).indices  # (c, count)
    columns = (best[..., None] * GROUP + torch.arange(GROUP, device=values.device)).flatten(1)
    rest = torch.arange(whole, values.shape[1], device=values.device).expand(len(values), -1)
    columns = torch.cat([columns, rest], dim=1)  # (c, count * GROUP + n - whole)
    top, where = values.gather(1, columns).topk(count, dim=1)
    return top, columns.gather(1, where)


def _top_keys_of(values: torch.Tensor, columns: torch.Tensor, depth: int, total: int) -> torch.Tensor:
    """:func:`order_keys` of each row's ``depth`` largest values, in order; ``columns`` are theirs.

    ``topk`` of one more than needed, in no set order among equal values, then the keys of those alone;
    where the last two are equal, ``topk`` may have left out an equal value of a lower column, and the
    row's keys are all ranked (rare: exact ties).

    Shape:
        values: (c, n) float32; columns: (c, n) int64; returns: (c, min(depth, n)) int64
    """
    take = min(depth + 1, values.shape[1])
    top, where = values.topk(take, dim=1, sorted=False)  # (c, take)
    keys = order_keys(top, columns.gather(1, where), total).sort(dim=1, descending=True).values
    if take > depth:
        spills = ((keys[:, depth - 1] >> 32) == (keys[:, depth] >> 32)).nonzero()[:, 0]
        if len(spills):
            keys[spills, :depth] = order_keys(values[spills], columns[spills], total).topk(depth, dim=1).values
    return keys[:, :depth]


def nearest_columns(similarity: torch.Tensor, depth: int) -> torch.Tensor:
    """Column indices of each row's ``depth`` largest values: largest first, equal values by lowest column.

    ``similarity.gather(1, columns)`` gives the values themselves. ``depth`` must not exceed G.

    Shape:
        similarity: (c, G) float32; returns: (c, depth) int64
    """
    width = similarity.shape[1]
    chunks = chunks_for(width, depth, None)
    maxima = None
    if chunks is not None:
        maxima = similarity.new_empty(len(similarity), chunks.count)
        for first, _, whole in chunks.tiles():
            out = maxima[:, first // chunks.size : (first + whole) // chunks.size]
            tile_maxima(similarity[:, first : first + whole], chunks.size, out)
    return key_columns(top_keys(Tiles.of(similarity.contiguous()), depth, chunks, maxima, 0, width), width)
