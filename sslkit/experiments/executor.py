"""Where an experiment's jobs run: the interface every executor offers the runner, and what a job's run gave.

The runner (:mod:`sslkit.experiments.runner`) hands an executor the jobs that have not finished and hears of
each one as it starts and ends; it never learns where they ran. An executor starts a job only once the jobs it
needs among them have ended well, and does not start one whose need failed. Ctrl-C stops every job it runs: its
``run`` raises KeyboardInterrupt once they have stopped, and the same command continues where they were.

- :class:`sslkit.experiments.local.LocalExecutor`: on this machine, N jobs at once (``--executor local --jobs N``).

>>> error_line("error: loss became nan at step 3\\nTraceback (most recent call last):\\n  ...", 1)
'loss became nan at step 3'
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sslkit.experiments.jobs import Job


@dataclass(frozen=True)
class Ran:
    """What running a job's command gave: its exit status, its error line (None when it exited 0), and its cost.

    ``cpu_s``: user plus system seconds of the command and of every process it waited for (a launcher's workers
    too): on a machine shared with other jobs it says what the job cost where its wall time does not.
    """

    status: int
    error: str | None
    wall_s: float
    cpu_s: float


class Executor(ABC):
    """Runs jobs somewhere, each once the jobs it needs have ended well."""

    @abstractmethod
    def run(
        self,
        jobs: Sequence[Job],
        logs: Path,
        started: Callable[[Job], None],
        ended: Callable[[Job, Ran | None], bool],
        stopped: Callable[[Job, Ran], None],
    ) -> None:
        """Run ``jobs``, each job's stdout and stderr to ``logs/<name>.out`` and ``.err``.

        A job's ``needs`` among ``jobs`` come before it; a need that is not among them has finished. ``started``
        and ``ended`` are called in the caller's thread, as each job starts and ends: ``ended(job, ran)`` says
        whether the job succeeded, and ``ended(job, None)`` tells of a job not started because a job it needs
        failed (which fails the jobs that need it in turn). When Ctrl-C stops the jobs, ``stopped(job, ran)``
        tells what each running job had cost by then, where the executor can know it (the same command continues
        the job later, and its cost is then both parts).

        Raises:
            KeyboardInterrupt: Ctrl-C; every job that ran has stopped.
        """

    @abstractmethod
    def alone(self) -> Executor:
        """The same share of the machine for each job, one job at a time: where a job is timed undisturbed."""


def error_line(stderr: str, status: int) -> str:
    """What went wrong, in one line: sslkit's own ``error:`` line, else the last line of stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    # Under a launcher, the launcher's traceback follows the job's own one-line error.
    ours = [line for line in lines if line.startswith("error:")]
    if ours:
        return ours[-1].removeprefix("error:").strip()
    if lines:
        return lines[-1]
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exited with status {status} and printed nothing on stderr"
