"""Commands run in this process, for the tests of the experiments, and reading what they write.

A Python start-up costs more than the tiny runs these tests make, so a command is called as its
``main(argv)`` with its output captured (:func:`run_main`), and the jobs an experiment would start
as processes (``python -m MODULE ARGS``) run as ``MODULE.main(ARGS)`` here too
(:func:`jobs_in_this_process`). The local executor's own processes are tested in test_runner.py, and every
command's start by its installed name in test_cli.py.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sslkit.experiments import local
from sslkit.experiments.executor import Ran, error_line
from sslkit.experiments.jobs import Job


def run_main(main: Callable[[list[str]], int], argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """``main(argv)`` with ``env`` set, its stdout and stderr captured, as a finished process."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        for name, value in env.items():
            patch.setenv(name, value)
        status = main(list(argv))
    return subprocess.CompletedProcess(argv, status, stdout.getvalue(), stderr.getvalue())


@contextlib.contextmanager
def jobs_in_this_process(started: list[str] | None = None) -> Iterator[None]:
    """Within it, the local executor (one job at a time: the default) runs a job ``python -m MODULE ARGS`` as
    ``MODULE.main(ARGS)`` in this process (:func:`sslkit.experiments.local.run_process` replaced), its output to
    the job's logs as the real one writes them.

    Args:
        started: when given, the names of the jobs that run are appended to it.
    """

    def run_here(job: Job, logs: Path, environment: dict[str, str], processes: local.Processes) -> Ran:
        assert job.launcher is None and environment == {}, (job.launcher, environment)
        if started is not None:
            started.append(job.name)
        logs.mkdir(parents=True, exist_ok=True)
        err_path = logs / f"{job.name}.err"
        start, cpu_start = time.perf_counter(), time.process_time()
        with open(logs / f"{job.name}.out", "w") as out, open(err_path, "w") as err:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = importlib.import_module(job.module).main(list(job.argv))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        return Ran(status, None if status == 0 else error_line(err_path.read_text(), status), wall, cpu)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local, "run_process", run_here)
        yield


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def block_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import matplotlib`` (and its submodules, even if already loaded) raise ImportError."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
