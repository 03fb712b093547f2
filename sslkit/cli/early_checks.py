"""The mistakes a command names before it imports torch: a path that is not there, a recipe's name or keys, a range.

Importing torch and the library costs seconds of CPU; the mistakes users make most (a folder that does not
exist, a misspelled recipe or key) need only the file system and the recipe's schema (:mod:`sslkit.schema`:
YAML and dataclasses). Each command checks its arguments with these functions as soon as they are parsed (most
in a ``check_early`` of their own) and its one line comes in a tenth of a CPU-second, as ``--help`` does
(tools/bench/cli_errors.py measures it).

Each check raises the :class:`~sslkit.errors.UserError` that the library raises for the same mistake, in the
same words: the library keeps its own checks, for its callers in Python, and
tests/test_cli_early_errors.py holds each line here against the library's. A command line with two
mistakes may hear of another one first than the library would name; each is the user's to fix.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from sslkit.console import print_user_error
from sslkit.errors import UserError
from sslkit.schema import apply_overrides, find_recipe, parse_config, read_yaml

# An embeddings folder's files, as sslkit.embeddings.store names them (that module imports numpy).
EMBEDDINGS_FILES = ("embeddings.npy", "items.csv", "meta.json")


def refused(check_early: Callable[[argparse.Namespace], None], args: argparse.Namespace) -> bool:
    """``check_early(args)``; for a mistake, its line printed as the command prints the library's, and True."""
    try:
        check_early(args)
    except UserError as error:
        print_user_error(error)
        return True
    return False


def recipe_with_overrides(recipe: str | Path, overrides: Sequence[str] = ()) -> Path:
    """The recipe's file, its YAML, and every key and type with ``overrides`` applied: what
    :func:`sslkit.config.load_config` checks before the names and ranges, which need the registries."""
    path = find_recipe(recipe)
    source = str(path) + (" (with command-line overrides)" if overrides else "")
    parse_config(apply_overrides(read_yaml(path), list(overrides)), source)
    return path


def existing_path(path: str | Path, what: str) -> None:
    """A file or folder that must be there: ``'PATH' not found; give WHAT``."""
    if not Path(path).exists():
        raise UserError(f"'{Path(path)}' not found; give {what}")


def embeddings_folder(folder: str | Path) -> None:
    """A folder sslkit-embed finished: its three files, and ``meta.json`` saying it is complete
    (:func:`sslkit.embeddings.read_embeddings` also checks the files against one another)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"'{folder}' is not a folder; give the output folder of sslkit-embed")
    missing = [name for name in EMBEDDINGS_FILES if not (folder / name).is_file()]
    if missing:
        raise UserError(
            f"'{folder}' has no {', '.join(missing)}: it is not an embeddings folder written by sslkit-embed"
        )
    meta = json.loads((folder / EMBEDDINGS_FILES[2]).read_text())
    if not meta.get("complete", False):
        raise UserError(
            f"'{folder}' is an unfinished sslkit-embed run ({meta.get('rows_done', 0)} of {meta.get('count', '?')} "
            f"rows); run the same sslkit-embed command again to finish it"
        )


def at_least(value: int, minimum: int, option: str) -> None:
    """``--option must be at least MINIMUM, got VALUE``."""
    if value < minimum:
        raise UserError(f"{option} must be at least {minimum}, got {value}")


def is_run_dir(path: Path) -> bool:
    """A directory the trainer has started writing: it has a ``config.yaml``
    (:func:`sslkit.experiments.report.is_run_dir`'s rule)."""
    return (path / "config.yaml").is_file()
