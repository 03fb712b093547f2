"""docs/cluster.md's SLURM batch script under a real SLURM: a one-node cluster on this machine (``slurm_utils``).

The script's CPU form (docs/cluster.md, "Try it on one machine") runs two training processes of a tiny quick start
with a one-minute time limit: SLURM's signal arrives mid-run, both processes save and exit 75, the script requeues its
job, and the requeued job continues with ``run.resume=auto`` to a backbone bit-identical to that of a run nobody
interrupted. When the signal comes depends on SLURM's clock and the machine's speed: the test reads what happened
from SLURM and the job's output rather than assuming it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from dist_utils import _free_port
from slurm_utils import FINAL_STATES, one_node_slurm_fixture, started_slurm  # noqa: F401 (the fixture)
from test_preemption_e2e import COMMON, assert_same_backbone, finish, start
from test_pretrain_e2e import QUICKSTART, ROOT, env

DOC = ROOT / "docs" / "cluster.md"
# SLURM looks at time limits every 30 s, so the signal (USR1@5 of a one-minute limit) comes 25-55 s after a start
# of the job: the run must outlast that. 45 epochs of 22 steps took 60-150 s of two processes on a busy 2-core
# machine; where the machine is fast enough to end them first, the test runs again at twice the length.
EPOCHS = (45, 90)
STEPS_PER_EPOCH = 1437 // 64
SAVED = re.compile(r"stopped by SIGUSR1 after step (\d+): saved")


def batch_scripts() -> tuple[str, str]:
    """docs/cluster.md's batch scripts: the cluster's (GPUs, several nodes) and its CPU form for one machine."""
    scripts = re.findall(r"```bash\n(#!/bin/bash\n.*?)```", DOC.read_text(), re.DOTALL)
    [cluster] = [script for script in scripts if "--gpus-per-node" in script]
    [one_node] = [script for script in scripts if "recipes/quickstart.yaml" in script]
    return cluster, one_node


def commands(script: str) -> list[str]:
    """What a batch script runs: its lines less the ``#SBATCH`` directives."""
    return [line for line in script.splitlines() if not line.startswith("#SBATCH")]


def directives(script: str) -> list[str]:
    return [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")]


def test_the_one_machine_script_runs_what_the_cluster_script_runs():
    cluster, one_node = batch_scripts()
    same = [line.replace("recipes/simclr.yaml", "recipes/quickstart.yaml") for line in commands(cluster)]
    assert commands(one_node) == [line.replace("run.name=simclr-r50", "run.name=quickstart") for line in same]
    assert {"--requeue", "--open-mode=append", "--time=1", "--signal=USR1@5"} <= set(directives(one_node))
    assert not [option for option in directives(one_node) if "gpu" in option]


def script_at_test_size(folder: Path, epochs: int) -> str:
    """The one-machine script with the tests' tiny settings, its run in ``folder``, on a free port (another run on
    this machine may hold 29500)."""
    _, script = batch_scripts()
    overrides = " ".join([f"run.output_dir={folder}", *COMMON, f"train.epochs={epochs}"])
    for old, new in [
        ("MASTER_PORT=29500", f"MASTER_PORT={_free_port()}"),
        ("recipes/quickstart.yaml", str(QUICKSTART)),
        ("run.resume=auto'", f"run.resume=auto {overrides}'"),
    ]:
        assert script.count(old) == 1, old
        script = script.replace(old, new)
    return script


def job_environment() -> dict[str, str]:
    """What the job's processes find (sbatch passes the submitter's environment on): this interpreter's
    ``sslkit-pretrain`` first on PATH, one thread, unbuffered output."""
    job = env()
    job["PATH"] = f"{Path(sys.executable).parent}:{job['PATH']}"
    return job


def read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


@pytest.mark.slow
def test_a_job_runs_on_the_one_node_slurm(one_node_slurm, tmp_path):
    job = one_node_slurm.sbatch(f"--output={tmp_path}/%j.out", "--wrap", "echo $SLURM_JOB_ID ran", cwd=tmp_path)
    finished = one_node_slurm.wait(job, timeout=60)
    assert (finished["JobState"], finished["ExitCode"]) == ("COMPLETED", "0:0"), finished
    assert one_node_slurm.output(job) == f"{job} ran\n"


@pytest.mark.slow
def test_sbatch_says_why_it_refuses_a_job(one_node_slurm, tmp_path):
    refused = one_node_slurm.run("sbatch", "--partition=nosuch", "--wrap", "true", cwd=tmp_path)
    assert refused.returncode == 1
    assert "invalid partition specified: nosuch" in refused.stderr, refused.stderr


@pytest.mark.slow
def test_a_stopped_cluster_leaves_nothing_running(tmp_path):
    with started_slurm() as cluster:
        job = cluster.sbatch(f"--output={tmp_path}/%j.out", "--wrap", "echo $$; exec sleep 600", cwd=tmp_path)
        assert cluster.wait(job, 60, until=lambda _: bool(read(tmp_path / f"{job}.out")))["JobState"] == "RUNNING"
        pid, daemons, folder = int(read(tmp_path / f"{job}.out")), list(cluster.daemons), cluster.folder
        assert running(pid)
    assert [name for name, process in daemons if process.poll() is None] == []
    assert not running(pid), "the job's process outlived its cluster"
    assert not folder.exists()


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has: only its parent's wait is missing)."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.is_file() and read(stat).rsplit(")", 1)[-1].split()[0] != "Z"


def submit_beside_a_straight_run(cluster, folder: Path, epochs: int) -> tuple[int, list[subprocess.Popen]]:
    """Submits the script at test size, and starts the run nobody interrupts (two processes, started as srun starts
    them) once the job's run trains: its own start, alone, is then over before SLURM's signal."""
    folder.mkdir()
    script = folder / "quickstart.sbatch"
    script.write_text(script_at_test_size(folder, epochs))
    job = cluster.sbatch(f"--output={folder}/%j.out", str(script), cwd=folder, env=job_environment())
    training = cluster.wait(job, 180, until=lambda _: '"loss"' in read(folder / "quickstart" / "metrics.jsonl"))
    assert training["JobState"] == "RUNNING", f"no step logged: {cluster.output(job)[-4000:]}"
    return job, start(folder, "straight", f"train.epochs={epochs}", world=2)


@pytest.mark.slow
def test_the_batch_script_is_signalled_saves_requeues_and_resumes_bit_identically(one_node_slurm, tmp_path):
    for epochs in EPOCHS:
        folder = tmp_path / f"{epochs}-epochs"
        job, straight = submit_beside_a_straight_run(one_node_slurm, folder, epochs)
        saved = one_node_slurm.wait(job, 400, until=lambda _: bool(SAVED.search(one_node_slurm.output(job))))
        if saved["JobState"] not in FINAL_STATES:
            break
        assert saved["JobState"] == "COMPLETED", one_node_slurm.output(job)[-4000:]
        for process in straight:  # the run ended before SLURM's signal: again, twice as long
            process.kill()
            process.wait()
    else:
        raise AssertionError(f"the run ended before SLURM's signal at {EPOCHS} epochs: {one_node_slurm.output(job)}")
    # One save and requeue is what is tested: the requeued job is given ten minutes, so that the test takes two
    # starts of the job however slow the machine (docs/cluster.md measures a run requeued every minute).
    assert one_node_slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=10").returncode == 0

    finished = one_node_slurm.wait(job, timeout=900)
    output = one_node_slurm.output(job)
    assert (finished["JobState"], finished["ExitCode"]) == ("COMPLETED", "0:0"), output[-4000:]
    stopped = [int(step) for step in SAVED.findall(output)]
    # A requeue for each save; one more where the signal came before a first step or in the final evaluation.
    assert int(finished["Restarts"]) >= len(stopped), output[-4000:]
    assert "Exited with exit code 75" in output, output[-4000:]  # srun's word on the processes' status
    resumed = [int(step) for step in re.findall(r"resumed from .+? at step (\d+)", " ".join(output.split()))]
    assert set(stopped) <= set(resumed) and resumed == sorted(resumed), output
    assert 0 < stopped[0] and stopped[-1] < epochs * STEPS_PER_EPOCH, stopped

    assert [code for code, *_ in finish(straight)] == [0, 0]
    assert_same_backbone(folder / "straight", folder / "quickstart")
