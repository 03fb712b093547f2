"""What the commands share in reading their command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sslkit.console import console, print_table, print_user_error
from sslkit.errors import UserError
from sslkit.experiments.executor import Executor
from sslkit.experiments.local import LocalExecutor  # light: the standard library's processes and threads
from sslkit.experiments.slurm import slurm_settings  # light too: submitit is imported where it is used

if TYPE_CHECKING:
    from sslkit.experiments.experiment import Outcome


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
        choices=("local", "slurm"),
        default="local",
        help="where the jobs run: local, on this machine (default), or slurm, submitted as SLURM job arrays "
        "through submitit (pip install 'sslkit[slurm]')",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help=f"{counted} at once (default 1); each gets its share of the CPU threads (OMP_NUM_THREADS, unless "
        "train.threads is given: the numbers of one at a time need the same threads), or one GPU each where there "
        "are GPUs",
    )

    slurm = parser.add_argument_group("--executor slurm", "each job's resources (default: the cluster's)")
    slurm.add_argument("--slurm-partition", metavar="NAME", help="the partition (sbatch --partition)")
    slurm.add_argument("--slurm-time", metavar="TIME", help="each job's time limit, as sbatch --time takes it")
    slurm.add_argument("--slurm-gpus", type=int, metavar="N", help="GPUs per job (sbatch --gpus-per-node)")
    slurm.add_argument("--slurm-cpus", type=int, metavar="N", help="CPUs per job (sbatch --cpus-per-task)")
    slurm.add_argument(
        "--slurm-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another #SBATCH line, e.g. qos=low or signal=USR1@300 (repeat it for several)",
    )
    slurm.add_argument(
        "--slurm-config", type=Path, metavar="FILE", help="a YAML file of partition, time, gpus, cpus, options"
    )


def executor_of(args: argparse.Namespace) -> Executor:
    """The executor ``--executor``, ``--jobs`` and the ``--slurm-*`` flags ask for.

    Raises:
        UserError: ``--executor slurm`` where sbatch or submitit is missing, or a ``--slurm-option`` without ``=``.
    """
    if args.executor == "local":
        return LocalExecutor(args.jobs)
    options = {}
    for option in args.slurm_option:
        key, equals, value = option.partition("=")
        if not equals or not key:
            raise UserError(f"--slurm-option {option}: give KEY=VALUE, e.g. --slurm-option qos=low")
        options[key.strip().lstrip("-")] = value.strip()
    return slurm_settings(
        args.slurm_config,
        partition=args.slurm_partition,
        time=args.slurm_time,
        gpus=args.slurm_gpus,
        cpus=args.slurm_cpus,
        options=options,
    )


def run_and_report(experiment: Callable[[], Outcome]) -> int:
    """Run an experiment command's experiment, print its tables and notes, and return its exit status.

    A :class:`~sslkit.errors.UserError` it raises (a point's config, sbatch refusing the jobs) is one line and
    exit status 2.
    """
    try:
        outcome = experiment()
    except UserError as error:
        print_user_error(error)
        return 2
    for table in outcome.tables:
        print_table(table)
    for note in outcome.notes:
        console.print(note, highlight=False, soft_wrap=True)
    return outcome.exit_status
