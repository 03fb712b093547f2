"""A one-node SLURM on this machine, for the tests that submit through a real scheduler.

Debian's ``slurm-wlm`` and ``munge`` (``apt-get install slurm-wlm munge``): ``munged``, ``slurmctld`` and ``slurmd``
run as root from one temporary folder (their configuration, sockets, state, spool and logs), on ports of their own,
so several of them can run side by side and nothing outside the folder is touched. The node is ``localhost`` with
this machine's CPUs; no cgroups (a container has none to give), no accounting database. The same configuration is
written out in docs/cluster.md ("Try it on one machine").

Where a binary is missing, the tests do not run as root, or the node is not idle within 30 s, the fixture skips
with one line naming what failed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dist_utils import _free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "scontrol", "squeue", "sinfo", "scancel", "srun")
# A job in one of these states never runs again (a requeued one goes back to PENDING, not here).
FINAL_STATES = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
}  # fmt: skip
START_TIMEOUT = 30.0  # seconds for each daemon to be ready

# All that a one-node cluster needs; the rest is SLURM's default. Where a setting is not the default, why:
# - SlurmctldHost=localhost, and `slurmd -N localhost`: the node is localhost whatever the machine's host name.
# - The ports: free ones (default 6817 and 6818), so that clusters of several test processes run side by side.
# - AuthInfo: munged's socket in the folder; cred_expire is also how long a requeued job waits before it may start
#   again (default 120 s).
# - ProctrackType / TaskPlugin: track a job's processes by their parents and bind nothing (default: cgroups, which
#   a container does not give).
# - SelectType / SelectTypeParameters: CPUs are what jobs take (default: whole nodes), so one-CPU jobs share it.
# - SchedulerParameters=sched_interval=1: look at waiting jobs every second (default 60 s), so that a requeued job
#   starts as soon as it may.
# - KillWait: seconds between SIGTERM and SIGKILL for a cancelled or timed-out job (default 30).
# - MailProg: none here (without one slurmctld logs an error at every start).
# - ReturnToService=2: a node that was down (its slurmd restarted) takes jobs again once it registers.
# A finished job stays in `scontrol show job`, where the tests read its final state, for MinJobAge (300 s).
SLURM_CONF = """\
ClusterName=sslkit
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthInfo=socket={folder}/munge/munge.socket,cred_expire=5
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=1
MailProg=/bin/true
KillWait=5
ReturnToService=2
NodeName=localhost CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


class SlurmUnavailable(RuntimeError):
    """The cluster could not start here; the message is one line naming what failed."""


class OneNodeSlurm:
    """``munged``, ``slurmctld`` and ``slurmd`` for a node ``localhost``, all their files in ``folder``.

    Attributes:
        folder: the configuration, the munge key, the sockets, state, spool and logs.
        conf: the configuration file (``SLURM_CONF`` of every command and job).
        daemons: each daemon's name and process, in the order they started (children of this process).
    """

    def __init__(self, folder: Path, cpus: int = 2) -> None:
        self.folder = folder
        self.cpus = cpus
        self.conf = folder / "slurm.conf"
        self.daemons: list[tuple[str, subprocess.Popen]] = []

    def start(self) -> None:
        """Writes the key and configuration, starts the three daemons and waits until the node is idle."""
        missing = [name for name in (*DAEMONS, *COMMANDS) if not shutil.which(name, path=_sbin_path())]
        if missing:
            raise SlurmUnavailable(f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("slurmd runs jobs as their users and must be started as root; these tests are not")
        for sub in ("munge", "state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ports = {"ctld_port": _free_port(), "slurmd_port": _free_port()}
        self.conf.write_text(SLURM_CONF.format(folder=self.folder, cpus=self.cpus, **ports))
        munge = self.folder / "munge"
        self._daemon(
            "munged", "--foreground", f"--key-file={key}", f"--socket={munge / 'munge.socket'}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={self.folder / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )  # fmt: skip
        self._until(lambda: (munge / "munge.socket").exists(), "munged made no socket")
        self._daemon("slurmctld", "-D")
        self._daemon("slurmd", "-D", "-N", "localhost")
        self._until(self._node_idle, "node localhost not idle")

    def stop(self) -> None:
        """Cancels every job, stops the daemons (SIGKILL after 10 s) and removes the folder."""
        if any(name == "slurmctld" and process.poll() is None for name, process in self.daemons):
            jobs = self.run("squeue", "--noheader", "--format=%i").stdout.split()
            if jobs:  # their processes outlive slurmd: they end with their job
                self.run("scancel", *jobs)
                _wait(lambda: not self.run("squeue", "--noheader", "--format=%i").stdout.split(), 30)
        for _, process in reversed(self.daemons):
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.daemons.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(
        self, *command: str, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """One of SLURM's commands against this cluster, in ``env`` (default: this process's environment)."""
        return subprocess.run(command, capture_output=True, text=True, env=self.environment(env), cwd=cwd, timeout=60)

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with ``SLURM_CONF`` naming this cluster's configuration,
        and without the ``SLURM_*`` variables of a job this process may itself run in."""
        kept = {key: value for key, value in (base or os.environ).items() if not key.startswith("SLURM_")}
        return {**kept, "SLURM_CONF": str(self.conf)}

    def sbatch(self, *arguments: str, cwd: Path, env: dict[str, str] | None = None) -> int:
        """Submits a job (``sbatch`` with ``arguments``, from ``cwd``, its environment ``env``); returns its id."""
        submitted = self.run("sbatch", "--parsable", *arguments, cwd=cwd, env=env)
        assert submitted.returncode == 0, submitted.stderr
        return int(submitted.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """What ``scontrol show job`` says of a job: ``JobState``, ``Restarts``, ``ExitCode``, ``StdOut``, ..."""
        shown = self.run("scontrol", "--oneliner", "show", "job", str(job_id))
        assert shown.returncode == 0, shown.stderr
        return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", shown.stdout))

    def wait(
        self, job_id: int, timeout: float = 300, until: Callable[[dict[str, str]], bool] | None = None
    ) -> dict[str, str]:
        """Waits until a job has ended for good (requeued runs included), or until ``until`` is true of :meth:`job`;
        returns :meth:`job`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["JobState"] in FINAL_STATES or (until is not None and until(job)):
                return job
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {job['JobState']} after {timeout:.0f} s: {self.output(job_id)}")

    def output(self, job_id: int) -> str:
        """The job's output file (its ``StdOut``), every run of it where it was submitted with
        ``--open-mode=append``."""
        path = Path(self.job(job_id)["StdOut"])
        return path.read_text() if path.is_file() else ""

    def _daemon(self, name: str, *arguments: str) -> None:
        """Starts a daemon in the foreground, as this process's child: stopped by its id, and reaped."""
        with open(self.folder / f"{name}.out", "w") as said:
            process = subprocess.Popen(
                [shutil.which(name, path=_sbin_path()), *arguments], stdout=said, stderr=subprocess.STDOUT,
                env=self.environment(), start_new_session=True,
            )  # fmt: skip
        self.daemons.append((name, process))

    def _node_idle(self) -> bool:
        return self.run("sinfo", "--noheader", "--format=%T", "--nodes=localhost").stdout.strip() == "idle"

    def _until(self, condition, failure: str) -> None:
        """Waits for ``condition``; raises :class:`SlurmUnavailable` when a daemon exits or time runs out first."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for name, process in self.daemons:
                if process.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited with status {process.returncode}: {self._said(name)}")
            if condition():
                return
            time.sleep(0.1)
        raise SlurmUnavailable(f"{failure} {START_TIMEOUT:.0f} s after the start: {self._said('slurmd')}")

    def _said(self, name: str) -> str:
        """A daemon's last fatal error (its output, then its log), else its last error, else its last line. Every
        start logs some harmless errors (no PMIx library, no state saved yet)."""
        lines = []
        for path in (self.folder / f"{name}.out", self.folder / f"{name}.log"):
            lines += [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
        fatal = [line for line in lines if "fatal" in line.lower()]
        errors = [line for line in lines if "error" in line.lower()]
        return (fatal or errors or lines or ["nothing in its output"])[-1]


def _sbin_path() -> str:
    """PATH with the system folders the daemons live in (a non-login root shell may lack /usr/sbin)."""
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


@contextlib.contextmanager
def started_slurm() -> Iterator[OneNodeSlurm]:
    """A one-node SLURM in a folder of its own, stopped and removed on leaving; skips where it cannot start."""
    # Not under pytest's temporary folders: munged refuses a socket in a folder that others cannot enter (700).
    folder = Path(tempfile.mkdtemp(prefix="sslkit-slurm-"))
    folder.chmod(0o755)
    cluster = OneNodeSlurm(folder)
    try:
        cluster.start()
    except SlurmUnavailable as error:
        cluster.stop()
        pytest.skip(f"no one-node SLURM here: {error}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module", name="one_node_slurm")
def one_node_slurm_fixture() -> Iterator[OneNodeSlurm]:
    """``one_node_slurm``: one cluster for the tests of a module (import this where they are)."""
    with started_slurm() as cluster:
        yield cluster
