"""The SLURM executor: an experiment's jobs submitted through submitit (``--executor slurm``).

The jobs whose needs have finished are submitted together as one job array (submitit's ``batch()``); a job
that needs others is submitted once they have ended well, so that SLURM holds no job that waits on a job that
failed. Each array task runs the job's command (:class:`SlurmJobRun`), its stdout and stderr appended to
``logs/<name>.out`` and ``.err``; submitit's own files go to ``logs/slurm``.

Before the time limit SLURM sends every process of a task SIGUSR1 (``--signal=USR1@120``): a pretraining run saves
and exits with 75 (``sslkit.loop.signals``), and the task requeues itself (``scontrol requeue``), as
docs/cluster.md's batch script does; the requeued task runs the same command, which continues from the saved
checkpoint (``run.resume=auto``, in every pretraining job's argv), and reports the cost of every part. A status of
138 (128 + SIGUSR1: the signal came before the first step or after the last) requeues too, once every process of
the task has ended: a launcher that dies of the signal at once (``accelerate launch --cpu``, torchrun) leaves its
training processes saving, and the task adopts and waits for them (:func:`adopt_orphans`). A task stopped by
``scancel`` (SIGTERM) saves as well and is not requeued: it ends as a failed job, and the sweep run again continues
it. The runner polls ``squeue`` and hears of each job as its task leaves the queue; Ctrl-C cancels every submitted
task (``scancel``), and the same command submits again what has not finished, which resumes from its checkpoint. A
command that ended otherwise (killed, its terminal closed) leaves its tasks to SLURM: each submitted job's task id
is kept in ``logs/slurm/tasks.json``, and the same command run again waits for those still queued or running
instead of submitting them twice.

Resources come from flags or a YAML file (:func:`slurm_settings`): partition, time, GPUs and CPUs per job, any
other ``#SBATCH`` line. submitit is imported only where the executor is used (``pip install "sslkit[slurm]"``).

>>> SlurmExecutor(partition="debug", time="0:10:00", cpus=2, options={"qos": "low"}).parameters()["additional_parameters"]
{'requeue': True, 'signal': 'USR1@120', 'partition': 'debug', 'time': '0:10:00', 'cpus_per_task': 2, 'qos': 'low'}
"""  # noqa: E501

from __future__ import annotations

import ctypes
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from sslkit.errors import REQUEUE_EXIT_STATUS, UserError, install_hint
from sslkit.experiments.executor import Executor, Ran, error_line
from sslkit.experiments.jobs import Job
from sslkit.files import written_whole

SIGNAL_BEFORE_LIMIT_S = 120  # a save takes well under a second; the rest is margin for a slow filesystem
POLL_S = 2.0  # how often squeue is asked which tasks are still queued or running
RESULT_GRACE_S = 10.0  # how long a task that left the queue may take to show its result file
ORPHANS_WAIT_S = 90.0  # how long a task waits for the processes its launcher left saving (within USR1@120)
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
TASKS_FILE = "tasks.json"  # in logs/slurm: each submitted job's task id, {name: "<array id>_<index>"}
SETTINGS = ("partition", "time", "gpus", "cpus", "options")  # the keys of --slurm-config's YAML


@dataclass
class SlurmJobRun:
    """What a job's array task runs: its command, its output appended to its logs, requeued when it saved on
    SLURM's signal. Pickled by submitit, so it holds plain values only.

    ``cost``: a JSON file that holds what the task's parts before a requeue cost (wall and CPU seconds), so that
    the part that ends reports the whole task's cost, not its own alone.
    """

    command: list[str]
    out: str
    err: str
    cost: str

    def __call__(self) -> Ran:
        earlier = earlier_cost(Path(self.cost))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if "SLURM_CPUS_PER_TASK" in env:  # torch's threads: the task's CPUs, not the node's (unless set)
            env.setdefault("OMP_NUM_THREADS", env["SLURM_CPUS_PER_TASK"])
        start, time_is_up = time.perf_counter(), []
        with open(self.out, "a") as out_file, open(self.err, "a") as err_file:
            process = subprocess.Popen(self.command, stdout=out_file, stderr=err_file, env=env)

            def pass_on(signum, frame) -> None:
                # SLURM signals every process of the task; passing it on as well covers a command that does not
                # share the task's processes, and a second signal while saving is only recorded.
                time_is_up.append(signum)
                process.send_signal(signal.SIGUSR1)

            signal.signal(signal.SIGUSR1, pass_on)
            adopt_orphans()
            _, wait_status, usage = os.wait4(process.pid, 0)
            process.returncode = status = os.waitstatus_to_exitcode(wait_status)
            cpu_s = usage.ru_utime + usage.ru_stime + wait_for_orphans(ORPHANS_WAIT_S)
        # Requeued only at the time limit's signal: a run stopped by scancel's SIGTERM saved, and stays cancelled
        # (the sweep run again continues it).
        wall_s, cpu_s = earlier["wall_s"] + time.perf_counter() - start, earlier["cpu_s"] + cpu_s
        if time_is_up and status in (REQUEUE_EXIT_STATUS, -signal.SIGUSR1, 128 + signal.SIGUSR1):
            with written_whole(self.cost) as tmp:
                tmp.write_text(json.dumps({"wall_s": wall_s, "cpu_s": cpu_s}))
            subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
            os._exit(REQUEUE_EXIT_STATUS)  # no result for submitit: the requeued task gives it
        error = None if status == 0 else error_line(Path(self.err).read_text(errors="replace"), status)
        return Ran(status, error, wall_s, cpu_s)


def earlier_cost(path: Path) -> dict[str, float]:
    """What a task's parts before its requeue cost (:attr:`SlurmJobRun.cost`); nothing before its first part."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"wall_s": 0.0, "cpu_s": 0.0}


def adopt_orphans() -> None:
    """Make this process the one that Linux gives the task's orphaned processes to (``PR_SET_CHILD_SUBREAPER``).

    A launcher may end before the processes it started: ``accelerate launch --cpu`` and torchrun die of SLURM's
    SIGUSR1 at once, while their training processes, signalled too, are still saving. Requeued then, the task's
    processes would be killed mid-save (the previous checkpoint survives; the steps since it are lost). Adopted,
    they are waited for (:func:`wait_for_orphans`). One system call through ctypes: no library sslkit depends on
    offers it; elsewhere than Linux nothing is adopted."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def wait_for_orphans(timeout: float) -> float:
    """Wait up to ``timeout`` seconds for this process's remaining children (adopted orphans among them); their
    CPU-seconds. Any still running after it are left to SLURM, which ends them with the task."""
    cpu_s, deadline = 0.0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:  # none left
            break
        if pid == 0:  # some still running
            time.sleep(0.1)
            continue
        cpu_s += usage.ru_utime + usage.ru_stime
    return cpu_s


@dataclass
class SlurmExecutor(Executor):
    """Submits jobs to SLURM through submitit, with these resources each (None: the cluster's default).

    Attributes:
        partition: ``--partition``.
        time: ``--time``, in any form sbatch takes (``30``, ``2:00:00``, ``1-00:00:00``).
        gpus: ``--gpus-per-node``.
        cpus: ``--cpus-per-task``; the job's torch threads too (``OMP_NUM_THREADS``).
        options: other ``#SBATCH`` lines, ``{"qos": "low"}`` for ``--qos=low``; they override the above.
        one_at_a_time: at most one task of an array runs at once (``--array=...%1``).
    """

    partition: str | None = None
    time: str | None = None
    gpus: int | None = None
    cpus: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    one_at_a_time: bool = False

    def alone(self) -> SlurmExecutor:
        return replace(self, one_at_a_time=True)

    def parameters(self) -> dict[str, Any]:
        """The keywords of submitit's ``SlurmExecutor.update_parameters``."""
        sbatch: dict[str, Any] = {"requeue": True, "signal": f"USR1@{SIGNAL_BEFORE_LIMIT_S}"}
        given = {"partition": self.partition, "time": self.time, "gpus_per_node": self.gpus}
        sbatch.update({key: value for key, value in given.items() if value is not None})
        if self.cpus is not None:
            sbatch["cpus_per_task"] = self.cpus
        sbatch.update(self.options)
        # time=None: the partition's limit unless one is given, not submitit's 5 minutes
        return {
            "additional_parameters": sbatch,
            "array_parallelism": 1 if self.one_at_a_time else 10_000,
            "time": None,
        }

    def check(self) -> None:
        """Ask sbatch whether it would take a job with these resources (``sbatch --test-only``), so that a
        partition or limit the cluster refuses is said before anything is written.

        Raises:
            UserError: sbatch's own message.
        """
        sbatch = self.parameters()["additional_parameters"]
        flags = [
            f"--{key.replace('_', '-')}" + ("" if value is True else f"={value}") for key, value in sbatch.items()
        ]
        tried = subprocess.run(["sbatch", "--test-only", *flags, "--wrap", "true"], capture_output=True, text=True)
        if tried.returncode != 0:
            said = [line.strip() for line in tried.stderr.splitlines() if line.strip()]
            why = said[-1].removeprefix("sbatch: error: ") if said else f"status {tried.returncode}"
            raise UserError(f"sbatch refuses jobs with {' '.join(flags)}: {why}")

    def run(
        self,
        jobs: Sequence[Job],
        logs: Path,
        started: Callable[[Job], None],
        ended: Callable[[Job, Ran | None], bool],
        stopped: Callable[[Job, Ran], None],
    ) -> None:
        """As :meth:`Executor.run`; a task requeued at its time limit reports the cost of all its parts. Ctrl-C
        cancels the tasks, whose cost so far SLURM does not hand back: none is reported ``stopped``."""
        import submitit

        executor = submitit.SlurmExecutor(folder=logs / "slurm", max_num_timeout=1000)
        executor.update_parameters(**self.parameters())
        waiting, unfinished, failed = list(jobs), {job.name for job in jobs}, set()
        queued: dict[str, tuple[Job, Any]] = {}  # by SLURM job id
        for job, task in still_running(jobs, logs):  # submitted by an earlier command that did not wait for them
            waiting.remove(job)
            queued[task.job_id] = (job, task)
            started(job)
        try:
            while waiting or queued:
                ready = []
                for job in list(waiting):
                    if any(need in failed for need in job.needs):
                        waiting.remove(job)
                        unfinished.discard(job.name)
                        failed.add(job.name)
                        ended(job, None)
                    elif not any(need in unfinished for need in job.needs):
                        waiting.remove(job)
                        ready.append(job)
                if ready:
                    for job, task in zip(ready, submit(executor, ready, logs), strict=True):
                        queued[task.job_id] = (job, task)
                        started(job)
                    record_tasks(logs, {job.name: job_id for job_id, (job, _) in queued.items()})
                if not queued:
                    if waiting:
                        raise ValueError(f"job {waiting[0].name} needs a job that comes after it, or itself")
                    return
                time.sleep(POLL_S)
                live = still_queued()
                results_due = time.monotonic() + RESULT_GRACE_S  # one wait for the tasks that left together
                for job_id in [job_id for job_id in queued if job_id not in live]:
                    job, task = queued.pop(job_id)
                    unfinished.discard(job.name)
                    if not ended(job, outcome(task, results_due)):
                        failed.add(job.name)
        except KeyboardInterrupt:
            for _, task in queued.values():
                task.cancel(check=False)
            raise


def submit(executor, jobs: list[Job], logs: Path) -> list:
    """Submit ``jobs`` as one array, their logs emptied first; sbatch's refusal as a UserError."""
    import submitit

    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for job in jobs:
        out, err, cost = logs / f"{job.name}.out", logs / f"{job.name}.err", logs / "slurm" / f"{job.name}.cost.json"
        out.write_text("")
        err.write_text("")
        cost.unlink(missing_ok=True)  # an earlier submission's, whose cost its own end reported
        runs.append(SlurmJobRun(job.command(), str(out), str(err), str(cost)))
    try:
        with executor.batch():
            tasks = [executor.submit(run) for run in runs]
    except (submitit.core.utils.FailedJobError, OSError) as error:
        said = [line.strip() for line in str(error).splitlines() if "error:" in line]
        raise UserError(f"sbatch refused the jobs: {said[-1] if said else str(error).strip()}") from None
    return tasks


def record_tasks(logs: Path, tasks: dict[str, str]) -> None:
    """Add ``tasks`` ({job name: SLURM task id}) to ``logs/slurm/tasks.json``."""
    path = logs / "slurm" / TASKS_FILE
    with written_whole(path) as tmp:
        tmp.write_text(json.dumps({**submitted_tasks(logs), **tasks}, indent=1))


def submitted_tasks(logs: Path) -> dict[str, str]:
    """The SLURM task id of every job submitted into ``logs`` ({} before the first submission)."""
    try:
        return json.loads((logs / "slurm" / TASKS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def still_running(jobs: Sequence[Job], logs: Path) -> list[tuple[Job, Any]]:
    """The jobs among ``jobs`` whose task, submitted into ``logs`` by an earlier command, SLURM still holds
    (queued, running or requeued), each with that task as submitit sees it, to wait for instead of submitting it
    again."""
    import submitit

    tasks = submitted_tasks(logs)
    if not tasks:
        return []
    live = still_queued()
    return [
        (job, submitit.SlurmJob(folder=logs / "slurm", job_id=tasks[job.name]))
        for job in jobs
        if tasks.get(job.name) in live
    ]


def still_queued() -> set[str]:
    """The ids of this user's array tasks and jobs that SLURM has not finished (pending, running, requeued)."""
    listed = subprocess.run(
        ["squeue", "--noheader", "--array", "--user", getpass.getuser(), "--format", "%i"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {line.strip() for line in listed.stdout.splitlines() if line.strip()}


def outcome(task, results_due: float) -> Ran:
    """What a task that left the queue gave: its :class:`SlurmJobRun`'s Ran, or why there is none.

    A task cancelled before it ran leaves no result file; submitit would wait for ``sacct`` to say so, which a
    cluster without accounting never does, so its absence at ``results_due`` (a ``time.monotonic()``, leaving a
    shared filesystem time to show the file) is read as the end.
    """
    while not task.paths.result_pickle.exists():
        if time.monotonic() > results_due:
            return Ran(1, f"SLURM job {task.job_id} ended without a result (cancelled, or killed)", 0.0, 0.0)
        time.sleep(0.5)
    try:
        return task.result()
    except Exception as error:  # noqa: BLE001 (submitit's UncompletedJobError or FailedJobError, with its log's tail)
        lines = [line for line in str(error).splitlines() if line.strip()]
        return Ran(1, f"SLURM job {task.job_id} ended without a result: {lines[0] if lines else error}", 0.0, 0.0)


def slurm_settings(config: Path | None, **flags: Any) -> SlurmExecutor:
    """The executor the ``--slurm-*`` flags ask for, over the YAML file ``config`` (keys :data:`SETTINGS`).

    Raises:
        UserError: sbatch is not on the PATH, submitit is not installed, or the YAML file is not such a file.
    """
    if shutil.which("sbatch") is None:
        raise UserError("--executor slurm needs SLURM's sbatch on the PATH; run on a SLURM login node")
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise UserError(f"--executor slurm needs submitit: {install_hint('slurm')}") from None
    settings: dict[str, Any] = {}
    if config is not None:
        try:
            settings = yaml.safe_load(config.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise UserError(f"--slurm-config {config}: cannot read it as YAML ({error.__class__.__name__})")
        unknown = sorted(set(settings) - set(SETTINGS)) if isinstance(settings, dict) else ["(not a mapping)"]
        if unknown:
            raise UserError(f"--slurm-config {config}: unknown key {unknown[0]}; the keys are {', '.join(SETTINGS)}")
    options = {**(settings.get("options") or {}), **flags.pop("options", {})}
    given = {key: value for key, value in flags.items() if value is not None}
    executor = SlurmExecutor(**{**{k: v for k, v in settings.items() if k != "options"}, **given, "options": options})
    executor.check()
    return executor
