"""The local executor: an experiment's jobs as processes on this machine, N at once (``--executor local --jobs N``).

Each job is its own process, so a job that crashes or diverges cannot take the others down. With N jobs at
once the machine is divided between them: where there are GPUs, each job gets one (``CUDA_VISIBLE_DEVICES``;
more jobs than GPUs share them in turn), and each gets its share of the CPU threads this process may use
(``OMP_NUM_THREADS``, which torch takes as its thread count unless the run's ``train.threads`` says otherwise).
Every run is seeded by itself: its numbers do not depend on where it ran, nor beside what. Its thread count is
another matter: the same run on one thread and on two sums its floats in another order, and its figures may
differ in their last digits, so a run that must give the numbers of one run at a time sets ``train.threads``.
One job at a time (N = 1, the default) leaves the environment as it is.

A job starts once the jobs it needs have finished well, the first ready in the experiment's order; N worker
threads (:class:`concurrent.futures.ThreadPoolExecutor`) each wait for one process. Every job runs in a session
(and process group) of its own, so that Ctrl-C reaches the runner alone, which passes it on once to every
running job (its launcher and their workers alike), waits for them to stop, and raises KeyboardInterrupt; a
second Ctrl-C kills what is left. SIGTERM and SIGHUP (``kill``, a closed terminal), which no longer reach the
jobs either, stop them as Ctrl-C does.

>>> [slot["OMP_NUM_THREADS"] for slot in slot_environments(2, cpus=8, gpus=[])]
['4', '4']
>>> [slot["CUDA_VISIBLE_DEVICES"] for slot in slot_environments(3, cpus=8, gpus=["0", "1"])]
['0', '1', '0']
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from sslkit.errors import UserError
from sslkit.experiments.executor import Executor, Ran, error_line
from sslkit.experiments.jobs import Job

# The main thread waits in slices of this many seconds, not at once: the kernel may hand Ctrl-C (or SIGTERM) to
# any thread of the process, and a main thread blocked in one long wait would never run Python's handler.
SIGNAL_CHECK_S = 0.2


def slot_environments(jobs: int, cpus: int, gpus: Sequence[str]) -> list[dict[str, str]]:
    """What each of ``jobs`` places running side by side adds to a job's environment: its share of the ``cpus``
    threads and, with ``gpus``, one of them (in turn); nothing for a single place."""
    if jobs == 1:
        return [{}]
    threads = {"OMP_NUM_THREADS": str(max(1, cpus // jobs))}
    return [{**threads, **({"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {})} for i in range(jobs)]


def visible_gpus() -> list[str]:
    """The GPUs jobs may run on: those ``CUDA_VISIBLE_DEVICES`` names when it is set, else every one torch sees."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [device.strip() for device in given.split(",") if device.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


class Processes:
    """The jobs' running processes, for the worker threads that start and wait for them and for Ctrl-C, which
    stops them all: once it has, no other starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, subprocess.Popen] = {}
        self._stopping = False

    def start(self, command: list[str], **popen) -> subprocess.Popen | None:
        """``subprocess.Popen(command)`` in a session (and process group) of its own; None once they are being
        stopped."""
        with self._lock:
            if self._stopping:
                return None
            process = subprocess.Popen(command, start_new_session=True, **popen)
            self._running[process.pid] = process
            return process

    def ended(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._running.pop(process.pid, None)

    def running(self) -> bool:
        """Whether any job's process is still running."""
        with self._lock:
            return bool(self._running)

    def signal_all(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group of every running job, and start no other."""
        with self._lock:
            self._stopping = True
            for pid in self._running:
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:  # it has just ended
                    pass


def run_process(job: Job, logs: Path, environment: dict[str, str], processes: Processes, **popen) -> Ran | None:
    """Run ``job``'s command, its stdout and stderr to ``logs/<name>.out`` / ``.err``, ``environment`` added to
    this process's (``popen``: more of :class:`subprocess.Popen`'s keywords, e.g. ``pass_fds``); None when Ctrl-C
    came before it started."""
    logs.mkdir(parents=True, exist_ok=True)
    err_path = logs / f"{job.name}.err"
    # Unbuffered: a job's log is readable while it runs.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **environment}
    start = time.perf_counter()
    with open(logs / f"{job.name}.out", "w") as out_file, open(err_path, "w") as err_file:
        process = processes.start(job.command(), stdout=out_file, stderr=err_file, env=env, **popen)
        if process is None:
            return None
        # wait4: this child's CPU time with that of the processes it waited for (a launcher's workers), where
        # getrusage(RUSAGE_CHILDREN) would add up every job that ran beside it.
        _, wait_status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(wait_status)
        processes.ended(process)
    wall, status = time.perf_counter() - start, process.returncode
    error = None if status == 0 else error_line(err_path.read_text(errors="replace"), status)
    return Ran(status, error, wall, usage.ru_utime + usage.ru_stime)


@contextlib.contextmanager
def stopping_as_ctrl_c(
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP),
) -> Iterator[list[signal.Signals]]:
    """Within it, ``signals`` raise KeyboardInterrupt in this (the main) thread, as Ctrl-C does; it gives the list
    of those received, for a caller that tells them from Ctrl-C."""
    received: list[signal.Signals] = []
    if threading.current_thread() is not threading.main_thread():
        yield received  # Python runs handlers in the main thread only
        return

    def interrupt(signum: int, frame) -> None:
        received.append(signal.Signals(signum))
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class LocalExecutor(Executor):
    """Runs ``jobs`` jobs at once on this machine, each on its share of it (:func:`slot_environments`);
    ``share``: the jobs the machine is divided between, at least ``jobs`` (default ``jobs``)."""

    jobs: int = 1
    share: int | None = None

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise UserError(f"--jobs must be at least 1, got {self.jobs}")
        if self.share is not None and self.share < self.jobs:
            raise ValueError(f"{self.jobs} jobs at once cannot share the machine {self.share} ways")

    def alone(self) -> LocalExecutor:
        return LocalExecutor(1, self.share or self.jobs)

    def environments(self) -> list[dict[str, str]]:
        """Each place's additions to a job's environment."""
        share = self.share or self.jobs
        if share == 1:
            return [{}] * self.jobs
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return slot_environments(share, cpus, visible_gpus())[: self.jobs]

    def run(
        self,
        jobs: Sequence[Job],
        logs: Path,
        started: Callable[[Job], None],
        ended: Callable[[Job, Ran | None], bool],
        stopped: Callable[[Job, Ran], None],
    ) -> None:
        processes = Processes()
        running: dict[Future, tuple[Job, int]] = {}  # filled by dispatch: what Ctrl-C stops
        # SIGINT too: a command started in the background of a script inherits it ignored, and so would every job
        # it starts (an ignored signal stays ignored across exec), which the Ctrl-C passed on would then not stop.
        # Handled here, it is at its default in the jobs.
        stops = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
        with stopping_as_ctrl_c(stops), ThreadPoolExecutor(self.jobs, thread_name_prefix="job") as pool:

            def run_on(job: Job, place: dict[str, str]) -> Ran | None:
                return run_process(job, logs, place, processes)

            try:
                self.dispatch(jobs, pool, run_on, started, ended, running)
            except KeyboardInterrupt:
                stop(processes, pool)
                for job, ran in stopped_runs(running):
                    stopped(job, ran)
                raise

    def dispatch(
        self,
        jobs: Sequence[Job],
        pool: ThreadPoolExecutor,
        run_on: Callable[[Job, dict[str, str]], Ran | None],
        started: Callable[[Job], None],
        ended: Callable[[Job, Ran | None], bool],
        running: dict[Future, tuple[Job, int]],
    ) -> None:
        """Start each job on ``pool`` as ``run_on(job, place)`` once a place is free and the jobs it needs have
        ended well, the first ready in ``jobs``' order; report each as it ends (:meth:`Executor.run`).

        ``running``: an empty dict this fills with the running jobs, each with its place, by future, and empties
        as it reports them: once Ctrl-C has come, the jobs it holds are those not reported.
        """
        places, order = self.environments(), {job.name: index for index, job in enumerate(jobs)}
        waiting, unfinished, failed = list(jobs), set(order), set()
        free = list(range(self.jobs))
        while waiting or running:
            for job in list(waiting):
                if any(need in failed for need in job.needs):
                    waiting.remove(job)
                    unfinished.discard(job.name)
                    failed.add(job.name)
                    ended(job, None)
                elif free and not any(need in unfinished for need in job.needs):
                    waiting.remove(job)
                    place = free.pop(0)
                    started(job)
                    running[pool.submit(run_on, job, places[place])] = (job, place)
            if not running:
                if waiting:
                    raise ValueError(f"job {waiting[0].name} needs a job that comes after it, or itself")
                return
            done, _ = wait(running, timeout=SIGNAL_CHECK_S, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: order[running[f][0].name]):
                job, place = running.pop(future)
                free.append(place)
                unfinished.discard(job.name)
                if not ended(job, future.result()):  # a Ran: a job is not reported once Ctrl-C came
                    failed.add(job.name)
            free.sort()


def stopped_runs(running: dict[Future, tuple[Job, int]]) -> list[tuple[Job, Ran]]:
    """The jobs that were running when Ctrl-C came, each with what it ran (all have ended, as :func:`stop` waits
    for them); not those it came before they started, nor one whose process could not be started."""
    done = [(job, future) for future, (job, _) in running.items() if future.done() and not future.cancelled()]
    return [(job, future.result()) for job, future in done if future.exception() is None and future.result()]


def stop(processes: Processes, pool: ThreadPoolExecutor) -> None:
    """Ctrl-C: pass it on once to every running job and wait for them to stop; a second one kills them."""
    processes.signal_all(signal.SIGINT)
    pool.shutdown(wait=False, cancel_futures=True)
    try:
        while processes.running():  # in slices, for the second Ctrl-C (SIGNAL_CHECK_S)
            time.sleep(SIGNAL_CHECK_S)
    except KeyboardInterrupt:
        processes.signal_all(signal.SIGKILL)
    pool.shutdown(wait=True)
