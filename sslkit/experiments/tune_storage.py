"""Where a study lives, shared by every worker of it, and what becomes of a trial whose worker died.

The study is Optuna's, in one of two storages:

- a journal file, ``OUT/study.journal`` (the default): :class:`optuna.storages.JournalStorage` on a
  :class:`~optuna.storages.journal.JournalFileBackend`, an append-only log that several processes share through a
  lock file: the workers on this machine, or on several machines that mount the same folder;
- any Optuna RDB URL (``--storage postgresql://user:password@host/db``): :class:`optuna.storages.RDBStorage`, for
  workers on machines that share no folder.

A worker that dies (kill -9, a crash, a lost machine) leaves its trial RUNNING. Such a trial is failed and
enqueued again with the same values (:class:`optuna.storages.RetryHeartbeatStaleTrialCallback`), and the retry
continues the same run directory from its last checkpoint (``run.resume=auto``). How a dead worker is told from a
live one depends on the storage:

- RDB: Optuna's heartbeat. Every worker records one for its trial every :data:`HEARTBEAT_S` seconds; a trial
  without one for :data:`GRACE_S` seconds is failed (and retried) by the next worker that asks for a trial.
- journal: Optuna has no heartbeat for it, so a lock stands for one. The worker holds an exclusive ``flock`` on
  ``OUT/locks/<run>.lock`` while it runs a trial (until the study has recorded how the trial ended), and the
  trial's training process inherits it: the kernel releases the lock only once both have exited, kill -9 included,
  at once. A RUNNING trial whose lock is free (and which started :data:`START_GRACE_S` seconds ago or more: its
  worker takes the lock once it has it) is failed and retried (:func:`fail_abandoned`). The same lock keeps a retry
  from starting while an orphaned run still trains in its folder. On a shared filesystem, ``flock`` needs working
  locks there (NFSv4 has them).

>>> RUN_ATTR, Place(Path("out"), None, "s").shown()
('run', 'out/study.journal')
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from sslkit.errors import UserError

JOURNAL = "study.journal"  # the default storage, in the output folder
LOCKS = "locks"  # the journal's liveness locks, one per run directory
HEARTBEAT_S = 30  # an RDB worker's heartbeat ...
GRACE_S = 90  # ... and how long without one makes its trial stale
START_GRACE_S = 10.0  # a journal trial may run this long before its worker takes its lock (it takes it at once)
MAX_RETRY = 3  # a trial whose workers keep dying (out of memory, say) is given up after this many retries

RUN_ATTR = "run"  # a trial's run directory's name: a retry inherits it, and continues that run
ERROR_ATTR = "error"  # why a trial's run failed (the run's own error line): such a trial counts as tried
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclass(frozen=True)
class Place:
    """A study's storage and name.

    Attributes:
        out: the output folder (the journal file's, the locks', the trials' run directories').
        url: an Optuna RDB URL, or None: the journal file ``out/study.journal``.
        name: the study's name in the storage.
    """

    out: Path
    url: str | None
    name: str

    def shown(self) -> str:
        """The storage as messages name it: the journal file, or the URL without its password."""
        if self.url is None:
            return str(self.out / JOURNAL)
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            return make_url(self.url).render_as_string(hide_password=True)
        except ArgumentError:  # not a URL SQLAlchemy reads: the message that opens it says so
            return self.url

    def storage(self) -> BaseStorage:
        """The storage, opened (an RDB's tables made when they are missing).

        Raises:
            UserError: an RDB URL that cannot be opened (unreachable, refused, a driver missing), in one line.
        """
        if self.url is None:
            self.out.mkdir(parents=True, exist_ok=True)
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(str(self.out / JOURNAL)))
        import sqlalchemy.exc

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            try:
                return optuna.storages.RDBStorage(
                    self.url,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                    heartbeat_stale_trial_callback=retry_callback(),
                )
            except ImportError as error:
                missing = error.__cause__ or error
                raise UserError(
                    f"--storage {self.shown()}: the database's driver is not installed ({missing}); "
                    'pip install "psycopg[binary]" for postgresql://, or the driver the URL names'
                ) from None
            except sqlalchemy.exc.SQLAlchemyError as error:
                reason = " ".join(str(error).split("\n")[0].split())
                raise UserError(f"--storage {self.shown()}: cannot open it ({reason})") from None

    def journal(self) -> bool:
        return self.url is None


def retry_callback() -> RetryHeartbeatStaleTrialCallback:
    """What becomes of a trial whose worker died: the same values enqueued again, with its user attributes (the
    run directory it continues)."""
    return RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)


def counted(trial: FrozenTrial) -> bool:
    """Whether ``trial`` counts towards ``--trials``: complete, pruned, or failed by its own run (a trial whose
    worker died does not: its retry does)."""
    return trial.state in COUNTED or (trial.state == TrialState.FAIL and ERROR_ATTR in trial.user_attrs)


def lock_path(out: Path, run: str) -> Path:
    return out / LOCKS / f"{run}.lock"


def take_lock(out: Path, run: str) -> int:
    """An open descriptor holding the exclusive lock of run directory ``run``, once every other holder (a live
    worker, or an orphaned run still training there) has let go; closing it in every process that has it
    releases the lock."""
    path = lock_path(out, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor


@contextlib.contextmanager
def lock_if_free(out: Path, run: str) -> Iterator[bool]:
    """Within it, whether run directory ``run``'s lock was free, and is now held here."""
    path = lock_path(out, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)


def fail_abandoned(study: optuna.Study, place: Place, start_grace_s: float = START_GRACE_S) -> list[int]:
    """Fail every RUNNING trial whose worker died, and enqueue each again; returns their numbers.

    RDB: the trials without a heartbeat for :data:`GRACE_S` seconds (Optuna's own check). Journal: the trials whose
    run's lock is free and that started ``start_grace_s`` seconds ago or more (see the module's docstring); while
    it checks one, it holds that lock, so that two workers checking at once fail and retry it once.
    """
    if not place.journal():
        before = {trial.number for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        after = {trial.number for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        return sorted(before - after)
    failed = []
    started_before = datetime.datetime.now() - datetime.timedelta(seconds=start_grace_s)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if trial.datetime_start is not None and trial.datetime_start > started_before:
            continue
        run = trial.user_attrs.get(RUN_ATTR, run_name(trial.number))
        with lock_if_free(place.out, run) as free:
            running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
            if not free or trial.number not in running:  # alive, or failed by another worker meanwhile
                continue
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
            retry(study, trial)
            failed.append(trial.number)
    return failed


def retry(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue ``trial``'s values again, for a trial whose worker stopped or died before its run ended."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry_callback()(study, trial)


def run_name(number: int) -> str:
    """A trial's run directory's name, ``trial-0007``: sorted as the trials are."""
    return f"trial-{number:04d}"
