"""The one shape of sslkit's experiments: plan -> jobs -> executor -> records -> tables.

An experiment's plan (its own, resolved and checked before anything runs) declares its jobs
(:class:`~sslkit.experiments.jobs.Job`: a command, its result file, the jobs it needs); an executor runs them
(:mod:`sslkit.experiments.executor`) and the runner records each one as it ends
(:mod:`sslkit.experiments.runner`); the experiment turns the records into its tables, after every job and at
its end, and says how it ended in an :class:`Outcome` for the command to print. An experiment of two steps
(the comparison calibrates its recipes, then plans its runs from their speed) runs its first jobs itself and
hands an :class:`Experiment` of the rest to :func:`run_experiment`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sslkit.console import console
from sslkit.experiments import runner
from sslkit.experiments.executor import Executor
from sslkit.experiments.jobs import Job


@dataclass
class Outcome:
    """How an experiment ended: its jobs' records, what it has to show, and the command's exit status.

    Attributes:
        records: every job's record, in order; None when Ctrl-C stopped the experiment.
        tables: its summary tables, to print in order.
        notes: the lines after them: where the results are, how many jobs failed.
        exit_status: 0 when every job succeeded, 1 when any failed, 130 when Ctrl-C stopped it.
    """

    records: list[dict] | None
    tables: list[Table] = field(default_factory=list)
    notes: list[Text] = field(default_factory=list)
    exit_status: int = 0


def interrupted() -> Outcome:
    """The outcome of an experiment Ctrl-C stopped (the runner has said how to continue it)."""
    return Outcome(None, exit_status=130)


def finished(records: list[dict], out: Path, noun: str, tables: list[Table], results: str) -> Outcome:
    """The outcome of an experiment that ran every job: its tables, then ``results`` (where they are written) and,
    when any job failed, a line saying how many and where their logs are (exit status 1)."""
    failed = [r for r in records if r["status"] == "failed"]
    notes = [Text(results)]
    if failed:
        notes.append(
            Text.from_markup(
                f"[red]{len(failed)} of {len(records)} {noun} failed[/]; rerunning the same command retries them "
                f"(logs in {escape(str(out / 'logs'))})"
            )
        )
    return Outcome(records, tables, notes, 1 if failed else 0)


class Experiment(ABC):
    """What :func:`run_experiment` asks of an experiment.

    Attributes:
        out: its output folder: its tables, ``logs/``, and the folders its jobs write to.
        noun: what its jobs are to the user ("points", "runs"), in the progress and the messages.
        records_file: the JSON file in :attr:`out` that holds its records (and its header), rewritten after every
            job: a rerun finds there the wall and CPU time of the jobs it skips.
        records_key: the key of the records in it.
    """

    out: Path
    noun: ClassVar[str] = "runs"
    records_file: ClassVar[str] = "results.json"
    records_key: ClassVar[str] = "runs"

    @abstractmethod
    def jobs(self) -> list[Job]:
        """Every job, in order: a job's needs come before it."""

    def intro(self, jobs: list[Job]) -> str | None:
        """The line shown before the first job, or None."""
        return None

    def prepare(self) -> None:
        """Make what its jobs' commands expect to exist (a folder they write into), once :attr:`out` exists."""

    @abstractmethod
    def write_tables(self, records: list[dict], times: dict[str, dict]) -> list[dict]:
        """Write its tables from the records so far, in job order (``times``: the :data:`~sslkit.experiments.jobs.
        TIMES` of every job ever run into :attr:`out`, by name); return its summary rows."""

    @abstractmethod
    def conclusion(self, records: list[dict], summary: list[dict]) -> Outcome:
        """How it ended, once every job has: its terminal tables, where its results are, its exit status."""


def run_experiment(experiment: Experiment, executor: Executor, times: dict[str, dict] | None = None) -> Outcome:
    """Run (or skip) every job of ``experiment`` on ``executor``, rewriting its tables after each; the progress
    shows as it goes.

    Args:
        times: the :data:`~sslkit.experiments.jobs.TIMES` of jobs earlier commands ran into its output, by name
            (default: read from its records file); updated with every job that runs.

    Returns:
        Its :meth:`~Experiment.conclusion`, or :func:`interrupted` when Ctrl-C stopped it.
    """
    out, jobs = experiment.out, experiment.jobs()
    out.mkdir(parents=True, exist_ok=True)
    if times is None:
        # Every job ever timed into this output, also those outside this command's grid: skipped jobs keep theirs.
        times = runner.previous_times(out / experiment.records_file, experiment.records_key)
    if (intro := experiment.intro(jobs)) is not None:
        console.print(intro, markup=False, highlight=False, soft_wrap=True)
    experiment.prepare()

    def tables(records: list[dict]) -> None:
        experiment.write_tables(records, times)

    records = runner.run_jobs(jobs, out, times, tables, experiment.noun, executor)
    if records is None:
        return interrupted()
    return experiment.conclusion(records, experiment.write_tables(records, times))
