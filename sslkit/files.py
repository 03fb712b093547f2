"""Files written whole or not at all: written to a temporary path beside the target, renamed over it when done.

A reader, or a process started meanwhile, sees the old file or the whole new one, never half of one.
The temporary path is ``<name>.tmp`` in the target's own folder, so the rename stays on one file
system, where ``os.replace`` is atomic (POSIX). A write that fails removes its temporary path and
leaves the old file as it was; one killed outright leaves the temporary path, which the next write
to the same target removes first.

>>> import tempfile
>>> target = Path(tempfile.mkdtemp()) / "record.json"
>>> with written_whole(target) as tmp:
...     _ = tmp.write_text("{}")
>>> target.read_text(), sorted(p.name for p in target.parent.iterdir())
('{}', ['record.json'])
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

TEMPORARY_SUFFIX = ".tmp"


def temporary_path(path: str | Path) -> Path:
    """Where :func:`written_whole` writes ``path`` first: ``<name>.tmp`` beside it."""
    path = Path(path)
    return path.with_name(path.name + TEMPORARY_SUFFIX)


@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write (a file, or a folder); it becomes ``path`` only when the
    ``with`` block finishes without an exception, and is removed in every case."""
    path = Path(path)
    tmp = temporary_path(path)
    remove(tmp)  # left by a write that was killed
    try:
        yield tmp
        put_in_place(tmp, path)
    finally:
        remove(tmp)


def put_in_place(written: str | Path, path: str | Path) -> None:
    """Rename ``written`` to ``path``, replacing what is there.

    A file replaces a file in one atomic step. A folder is replaced in two, the old one removed and
    then the new one renamed (POSIX renames only over an empty folder): in between, neither is there.
    """
    written, path = Path(written), Path(path)
    if (path.is_dir() and not path.is_symlink()) or (written.is_dir() and path.exists()):
        remove(path)
    os.replace(written, path)


def remove(path: str | Path) -> None:
    """Remove a file or a folder with everything in it, if there is one."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
