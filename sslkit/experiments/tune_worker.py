"""A worker of a study: it runs the study's trials one after another until the study holds its ``--trials``.

``sslkit-tune`` starts its workers as itself with ``--worker I`` (:mod:`sslkit.command_lines.tune`), on the
executor; any number of them, on any machines that reach the storage, share one study. A worker asks the study
for a trial (a retry of a stopped one first), runs its pretraining run as a process of its own, and tells the
study how it ended:

- complete: the run's ``results.json`` holds the metric (its value is the trial's);
- pruned: while the run trains, the worker reads each epoch's online kNN top-1 from its ``metrics.jsonl`` and
  reports it to the trial (``trial.report(value, epoch)``); once the pruner says so (``trial.should_prune()``), it
  sends the run its stop signal (the run saves and exits with 75);
- failed: the run failed (its error line is kept, and the trial counts as tried: a diverging learning rate is
  an answer too);
- stopped: Ctrl-C, a stop signal, or the command that started it ending: the worker stops its run (which saves),
  and the trial is enqueued again with the same values, to continue that run from its checkpoint.

A worker ends when the study holds its trials; while the last ones run on other workers it waits, retrying
those whose worker died (:func:`sslkit.experiments.tune_storage.fail_abandoned`). It exits with 0; 2 when a
finished run did not record the metric (every worker of the study stops, in the same line); 130 after Ctrl-C;
75 (to be started again: a SLURM task requeues itself on it) after a stop signal (SIGTERM, SIGHUP, the runs'
``train.stop_signals``, the command that started it ending), or when its run was stopped by a signal the worker
did not get.
"""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import optuna
from optuna.trial import TrialState

from sslkit.console import console, error_console, print_user_error
from sslkit.errors import REQUEUE_EXIT_STATUS, UserError
from sslkit.experiments.executor import Ran
from sslkit.experiments.jobs import Job
from sslkit.experiments.local import Processes, run_process, stopping_as_ctrl_c
from sslkit.experiments.tune import STOPPED_ATTR
from sslkit.experiments.tune_plan import Plan
from sslkit.experiments.tune_storage import (
    ERROR_ATTR,
    RUN_ATTR,
    counted,
    fail_abandoned,
    retry,
    run_name,
    take_lock,
)
from sslkit.loop.signals import signal_of, stop_with_parent

POLL_S = 1.0  # how often a worker reads its run's metrics.jsonl
WAIT_S = 2.0  # how often an idle worker looks whether the last trials still run


class RunFailed(Exception):
    """A trial's run failed; the trial is failed, with its error line, and the worker goes on."""


class RunStopped(Exception):
    """A trial's run was stopped by a signal that did not reach the worker (a cluster's preemption)."""


class EpochValues:
    """The online kNN top-1 of every epoch a run's ``metrics.jsonl`` holds, read as it grows.

    A resumed run first cuts the file back to its checkpoint (:mod:`sslkit.loop.run_directory`): a file that
    shrank is read again from its start.
    """

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.last_epoch = path, 0, 0

    def new(self) -> list[tuple[int, float]]:
        """``(epoch, knn_top1)`` of the monitor records written since the last call, in order."""
        try:
            with open(self.path, "rb") as file:
                if os.fstat(file.fileno()).st_size < self.offset:
                    self.offset = 0
                file.seek(self.offset)
                text = file.read()
        except FileNotFoundError:
            return []
        complete = text[: text.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self.offset += len(complete)
        values = []
        for line in complete.decode().splitlines():
            record = json.loads(line)
            if "epoch" in record and ("knn_top1" in record or "final_knn_top1" in record):
                self.last_epoch = int(record["epoch"])
            if "knn_top1" in record:
                values.append((int(record["epoch"]), float(record["knn_top1"])))
        return values


class Objective:
    """One trial, as :meth:`optuna.Study.optimize` calls it: its run, watched and pruned; returns the run's metric."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.stopped: int | None = None  # the number of the trial Ctrl-C or a stop signal ended
        self.lock: int | None = None  # the trial's run's lock, held until its state is recorded (release)

    def __call__(self, trial: optuna.Trial) -> float:
        self.stopped = None
        run = trial.user_attrs.get(RUN_ATTR) or run_name(trial.number)  # a retry continues its trial's run
        self.lock = lock = take_lock(self.plan.out, run)  # first: the run inherits it, and it says the trial lives
        try:
            trial.set_user_attr(RUN_ATTR, run)
            values = {space.key: space.suggest(trial) for space in self.plan.spaces}
            job = self.plan.trial_job(run, values)
            shown = ", ".join(f"{key}={value}" for key, value in values.items())
            console.print(f"trial {trial.number} ({run}): {shown}", markup=False, highlight=False, soft_wrap=True)
            ran, pruned_at, epochs = self.watched(trial, job, lock)
        except KeyboardInterrupt:
            self.stopped = trial.number
            raise
        trial.set_user_attr("epochs", epochs)
        return self.outcome(trial, ran, pruned_at, job.finished_metrics())

    def release(self) -> None:
        """Let go of the last trial's lock, once Optuna has recorded how the trial ended: until then the trial is
        RUNNING, and another worker that found its lock free would fail it as abandoned and run it again."""
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def watched(self, trial: optuna.Trial, job: Job, lock: int) -> tuple[Ran, int | None, int]:
        """Run ``job``, reporting its epochs to ``trial`` and stopping it when the pruner says so; returns how it
        ran, the epoch it was pruned at (None: not pruned) and the last epoch it evaluated. Its wall and CPU seconds
        are added to the trial's, a stopped run's too: a retry's cost is that of every attempt.

        Raises:
            KeyboardInterrupt: Ctrl-C or a stop signal; the run has saved and exited.
        """
        processes, epochs, pruned_at = Processes(), EpochValues(job.result.parent / "metrics.jsonl"), None
        stopped = False
        stop = signal_of(self.plan.stop_signal)
        logs = self.plan.out / "logs"
        with ThreadPoolExecutor(1, thread_name_prefix="trial") as pool:
            future = pool.submit(run_process, job, logs, {}, processes, pass_fds=(lock,))
            try:
                while True:
                    finished = bool(wait([future], timeout=POLL_S).done)
                    for epoch, value in epochs.new():
                        if pruned_at is None:
                            trial.report(value, epoch)
                            if trial.should_prune():
                                pruned_at = epoch
                                processes.signal_all(stop)  # the run saves and exits
                    if finished:
                        break
            except KeyboardInterrupt:
                processes.signal_all(stop)  # the run saves; leaving the pool waits for it to exit
                stopped = True
        ran = future.result()
        if ran is not None:
            for key, cost in (("wall_s", ran.wall_s), ("cpu_s", ran.cpu_s)):
                trial.set_user_attr(key, trial.user_attrs.get(key, 0.0) + cost)
        if stopped or ran is None:  # None: stopped before it started
            raise KeyboardInterrupt
        return ran, pruned_at, epochs.last_epoch

    def outcome(self, trial: optuna.Trial, ran: Ran, pruned_at: int | None, metrics: dict | None) -> float:
        """The trial's value, or the exception that tells the study how it ended."""
        metric = self.plan.metric
        if ran.status == 0 and metrics is not None:
            if metric not in metrics:
                recorded = ", ".join(sorted(metrics)) or "nothing"
                raise UserError(
                    f"--metric {metric}: the runs record {recorded}, not {metric}; choose one of those "
                    f"(the same command with it continues the study)"
                )
            return metrics[metric]
        if pruned_at is not None and ran.status in (REQUEUE_EXIT_STATUS, -signal_of(self.plan.stop_signal)):
            raise optuna.TrialPruned(f"pruned at epoch {pruned_at}")
        if ran.status == REQUEUE_EXIT_STATUS:
            self.stopped = trial.number
            raise RunStopped(ran.error)
        error = ran.error if ran.status != 0 else f"finished without writing {self.plan.metric} to results.json"
        trial.set_user_attr(ERROR_ATTR, error)
        raise RunFailed(error)


def next_step(study: optuna.Study, trials: int) -> str:
    """``ask`` a trial, ``wait`` for the last ones others run, or ``done``."""
    every = study.get_trials(deepcopy=False)
    done = sum(map(counted, every))
    running = sum(trial.state == TrialState.RUNNING for trial in every)
    waiting = any(trial.state == TrialState.WAITING for trial in every)
    if done >= trials:
        return "done"
    # Two workers asking at once may both start the last trial: the study then ends a trial over.
    return "ask" if waiting or done + running < trials else "wait"


def stop_line(stop: BaseException, signalled: list[signal.Signals], trial: int | None) -> str:
    """Why a worker stopped on a stop signal (``signalled``), or its run on one it missed; its trial's fate."""
    why = f"its run was stopped ({stop})" if isinstance(stop, RunStopped) else f"stopped by {signalled[0].name}"
    again = "" if trial is None else f"; trial {trial} enqueued again, to continue its run"
    return f"{why}{again} (exit status {REQUEUE_EXIT_STATUS}: start the worker again)"


def run_worker(plan: Plan, index: int) -> int:
    """Worker ``index``: run trials of the study until it holds ``plan.trials``; returns the exit status (see the
    module's docstring)."""
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    stop_with_parent(signal.SIGTERM, os.getppid())  # the command that started it ends: stop, as Ctrl-C does
    study = plan.open_study(create=False, worker=index)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # each trial's own line says how it ended
    objective, ran = Objective(plan), 0
    # SIGTERM and SIGHUP, and the stop signals of the runs: a cluster's notice reaches the worker too.
    stops = tuple(dict.fromkeys((signal.SIGTERM, signal.SIGHUP, *map(signal_of, plan.stop_signals))))
    with stopping_as_ctrl_c(stops) as signalled:
        try:
            while (step := next_step(study, plan.trials)) != "done":
                if stopped := study.user_attrs.get(STOPPED_ATTR):
                    raise UserError(stopped)
                if step == "wait":
                    time.sleep(WAIT_S)
                else:
                    try:
                        study.optimize(objective, n_trials=1, catch=(RunFailed,))
                    finally:
                        objective.release()  # the trial's state is recorded (or its worker stops)
                    ran += 1
                fail_abandoned(study, plan.place)
        except (KeyboardInterrupt, RunStopped) as stop:
            if objective.stopped is not None:  # failed by optimize: its values again, for the run to continue
                retry(study, study.get_trials(deepcopy=False)[objective.stopped])
            if isinstance(stop, KeyboardInterrupt) and not signalled:
                return 130
            # A stop signal asks for the worker again (a cluster requeues a task on 75).
            error_console.print(stop_line(stop, signalled, objective.stopped), markup=False, soft_wrap=True)
            return REQUEUE_EXIT_STATUS
        except UserError as error:
            study.set_user_attr(STOPPED_ATTR, str(error))
            print_user_error(error)
            return 2
    result = plan.out / "workers" / f"worker-{index}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps({"trials_run": ran}))
    return 0
