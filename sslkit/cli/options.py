"""What the commands share in reading their command line."""

from __future__ import annotations

import argparse

from sslkit.experiments.local import LocalExecutor  # light: the standard library's processes and threads


def reject_unknown_option(command_line: list[str], options) -> bool:
    """Print one line and return True for a ``--option`` the command does not take (see
    :func:`sslkit.config.check_command_line`: it names the ``key=value`` override probably meant).

    The check itself imports nothing heavy (:func:`sslkit.schema.unknown_option`): only a command line with such
    an option pays for the library's import, and ``--help`` answers at once.
    """
    from sslkit.schema import unknown_option

    if unknown_option(command_line, options) is None:
        return False
    from sslkit.config import check_command_line
    from sslkit.console import print_user_error
    from sslkit.errors import UserError

    try:
        check_command_line(command_line, options)
    except UserError as error:
        print_user_error(error)
        return True
    return False


def add_executor_options(parser: argparse.ArgumentParser, counted: str) -> None:
    """``--executor`` and ``--jobs N`` of the experiment commands; ``counted``: what N counts, e.g. "points"."""
    parser.add_argument(
        "--executor",
        choices=("local",),
        default="local",
        help="where the jobs run: local, on this machine (default)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help=f"{counted} at once (default 1); each gets its share of the CPU threads (OMP_NUM_THREADS, unless "
        "train.threads is given), or one GPU each where there are GPUs",
    )


def executor_of(args: argparse.Namespace) -> LocalExecutor:
    """The executor ``--executor`` and ``--jobs`` ask for."""
    return LocalExecutor(args.jobs)
