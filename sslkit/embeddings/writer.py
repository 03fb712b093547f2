"""An embeddings folder written chunk by chunk, by one process or several, and continued after an interruption.

The rows are cut into chunks of ``chunk_rows``. ``embeddings.npy`` is created at its full size
(:func:`numpy.lib.format.open_memmap`) and each process writes the rows of its chunks into it through
a memory map, so N x D is never in memory. ``meta.json`` says ``complete: false`` and lists the
chunks whose rows are written (``chunks_done``); the main process rewrites it atomically after each
round of chunks, once their rows are flushed. A run stopped in any way (``kill -9``, a full disk)
leaves a folder whose listed chunks are right; the same command continues from there, after checking
that it would write the same thing (:meth:`EmbeddingsWriter.start`).

The file's space is reserved when it is created (``posix_fallocate``), so a full disk is found
before any image is encoded, not as a crash later: a write into a memory-mapped hole that the disk
cannot fill kills the process with SIGBUS, where a ``write`` would have returned ENOSPC.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np

from sslkit.embeddings.store import ITEMS_FILE, META_FILE, VECTORS_FILE, write_items, write_meta
from sslkit.errors import UserError
from sslkit.files import TEMPORARY_SUFFIX, written_whole

# The meta.json keys that describe the run's progress rather than what is embedded.
PROGRESS_KEYS = ("complete", "chunk_rows", "chunks_done", "rows_done", "sslkit_version")
OUR_FILES = (VECTORS_FILE, ITEMS_FILE, META_FILE)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class EmbeddingsWriter:
    """The rows of an embeddings folder being written; see the module docstring.

    Build it with :meth:`start` (the main process: creates or checks the folder) and :meth:`join`
    (every other process, afterwards).
    """

    def __init__(self, folder: Path, meta: dict) -> None:
        self.folder, self.meta = folder, meta
        self.vectors = np.lib.format.open_memmap(folder / VECTORS_FILE, mode="r+")  # (N, D)
        self.done = set(meta["chunks_done"])

    @property
    def chunk_rows(self) -> int:
        return self.meta["chunk_rows"]

    @property
    def chunks(self) -> int:
        return -(-self.meta["count"] // self.chunk_rows)

    @property
    def complete(self) -> bool:
        return self.meta["complete"]

    def rows(self, chunk: int) -> range:
        return range(chunk * self.chunk_rows, min((chunk + 1) * self.chunk_rows, self.meta["count"]))

    def rows_done(self) -> int:
        return sum(len(self.rows(chunk)) for chunk in self.done)

    def write(self, chunk: int, vectors: np.ndarray) -> None:
        """Write a chunk's rows and flush them to the file (before any process records it as done).

        Shape:
            vectors: (len(rows(chunk)), D).
        """
        rows = self.rows(chunk)
        self.vectors[rows.start : rows.stop] = vectors
        self.vectors.flush()

    def record(self, chunks: list[int]) -> None:
        """Add finished chunks to ``meta.json`` (main process only), atomically."""
        self.done.update(chunks)
        self._save({**self.meta, "chunks_done": sorted(self.done), "rows_done": self.rows_done()})

    def finish(self) -> None:
        """Mark the folder complete (main process only): readers accept it from now on."""
        if len(self.done) != self.chunks:
            raise RuntimeError(f"{self.chunks - len(self.done)} chunks are not written")
        self._save({**self.meta, "chunks_done": sorted(self.done), "rows_done": self.meta["count"], "complete": True})

    def _save(self, meta: dict) -> None:
        try:
            write_meta(self.folder / META_FILE, meta)
        except OSError as error:
            raise UserError(
                f"cannot update {self.folder / META_FILE} ({error.strerror}); the {self.rows_done()} of "
                f"{meta['count']} rows finished before are kept: "
                f"{'free some space' if error.errno in NO_SPACE else 'fix this'} and run the same command again"
            ) from None
        self.meta = meta

    @classmethod
    def _reopen(cls, folder: Path, saved: dict) -> EmbeddingsWriter:
        """The writer of a folder written before, checked: its file must still hold (N, D) rows of its dtype."""
        try:
            writer = cls(folder, saved)
        except (OSError, ValueError) as error:  # deleted, truncated or replaced since
            raise UserError(f"'{folder / VECTORS_FILE}' cannot be read ({error}); --overwrite starts over") from None
        expected = (saved["count"], saved["dimension"])
        if writer.vectors.shape != expected or writer.vectors.dtype.name != saved["dtype"]:
            raise UserError(
                f"'{folder / VECTORS_FILE}' holds {writer.vectors.dtype.name} {writer.vectors.shape}, not the "
                f"{saved['dtype']} {expected} its meta.json says; --overwrite starts over"
            )
        return writer

    @classmethod
    def join(cls, folder: Path) -> EmbeddingsWriter:
        """The writer of a folder the main process has started."""
        return cls(folder, json.loads((folder / META_FILE).read_text()))

    @classmethod
    def start(
        cls,
        folder: Path,
        description: dict,
        shape: tuple[int, int],
        dtype: str,
        chunk_rows: int,
        items: list[str],
        labels: np.ndarray | None,
        overwrite: bool = False,
    ) -> EmbeddingsWriter:
        """A new folder, or the one at ``folder`` to continue when it holds the same unfinished embeddings.

        Args:
            folder: where to write; its parent must exist.
            description: what is embedded (source, weights, layer, transform, data, ...): an unfinished
                folder is continued only when its ``meta.json`` says the same.
            shape: (N, D).
            dtype: ``float32`` or ``float16``.
            chunk_rows: rows a chunk holds (a folder being continued keeps its own).
            items, labels: the rows' names and class ids (``items.csv``).
            overwrite: start over in a folder that holds other embeddings.

        Raises:
            UserError: the folder holds other embeddings or other files (without ``overwrite``), its parent
                does not exist, or the disk has no room for ``embeddings.npy``.
        """
        meta = {**description, "count": shape[0], "dimension": shape[1], "dtype": dtype}
        if (folder / META_FILE).is_file() and not overwrite:
            saved = json.loads((folder / META_FILE).read_text())
            if (difference := _difference(saved, meta)) is None:
                return cls._reopen(folder, saved)
            what = "an unfinished sslkit-embed of" if not saved.get("complete") else "the embeddings of"
            raise UserError(
                f"'{folder}' holds {what} another command ({difference}); use another --out, or --overwrite to "
                f"replace it"
            )
        _check_free(folder, overwrite)
        from sslkit import __version__

        meta |= {"sslkit_version": __version__, "chunk_rows": chunk_rows, "chunks_done": [], "rows_done": 0}
        _create(folder, meta | {"complete": False}, shape, dtype, items, labels)
        return cls(folder, json.loads((folder / META_FILE).read_text()))


def _difference(saved: dict, meta: dict) -> str | None:
    """The settings of ``meta`` that ``saved`` has otherwise (the first three), in words; None when they agree."""
    differences = [
        f"{key} differs" if key.endswith("_sha256") else f"{key}: {_short(saved.get(key))} there, {_short(value)} here"
        for key, value in meta.items()
        if json.loads(json.dumps(value)) != saved.get(key)  # as it reads back: tuples become lists
    ]
    return "; ".join(differences[:3]) + (", ..." if len(differences) > 3 else "") if differences else None


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_free(folder: Path, overwrite: bool) -> None:
    """Refuse a folder that holds anything but an earlier start's files (overwrite: remove those)."""
    if not folder.parent.is_dir():
        raise UserError(f"--out '{folder}': the folder '{folder.parent}' does not exist; create it or give another")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--out '{folder}' is a file; give a folder")
    if not folder.is_dir():
        return
    ours = {*OUR_FILES, *(name + TEMPORARY_SUFFIX for name in OUR_FILES)}
    others = sorted(entry.name for entry in folder.iterdir() if entry.name not in ours)
    if others:
        raise UserError(
            f"--out '{folder}' holds other files ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); "
            f"give a new or empty folder"
        )
    for name in ours:
        (folder / name).unlink(missing_ok=True)


def _create(folder: Path, meta: dict, shape: tuple[int, int], dtype: str, items: list[str], labels) -> None:
    """``items.csv``, ``embeddings.npy`` at its full size, then ``meta.json``; on failure, nothing."""
    made_folder = not folder.exists()
    folder.mkdir(exist_ok=True)
    try:
        with written_whole(folder / ITEMS_FILE) as tmp:
            write_items(tmp, items, labels)
        with written_whole(folder / VECTORS_FILE) as tmp:
            vectors = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
            size = vectors.offset + vectors.nbytes
            del vectors
            if hasattr(os, "posix_fallocate"):  # Linux; elsewhere the file stays sparse (see the module docstring)
                with open(tmp, "r+b") as f:
                    os.posix_fallocate(f.fileno(), 0, size)
        write_meta(folder / META_FILE, meta)
    except OSError as error:
        if made_folder:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            for name in (*OUR_FILES, *(name + TEMPORARY_SUFFIX for name in OUR_FILES)):
                (folder / name).unlink(missing_ok=True)
        if error.errno in NO_SPACE:
            need = shape[0] * shape[1] * np.dtype(dtype).itemsize
            free = shutil.disk_usage(folder.parent).free
            raise UserError(
                f"no room for {shape[0]} x {shape[1]} {dtype} embeddings ({need / 1e6:.1f} MB) in '{folder}': "
                f"{free / 1e6:.1f} MB free; free some space or give --out on another disk (--dtype float16 halves it)"
            ) from None
        raise UserError(f"cannot write the embeddings in '{folder}' ({error.strerror}); give another --out") from None
