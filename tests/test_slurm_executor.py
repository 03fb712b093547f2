"""``--executor slurm``: an ablation's points submitted through submitit to a real one-node SLURM (``slurm_utils``).

A 2 x 2 temperature ablation of a tiny quick start gives the same tables whether its points ran as a SLURM job array
or on this machine, also when the command that submitted them was killed (-9) and run again, which waits for the
tasks SLURM holds instead of submitting them twice; run once more, it finds every point finished and submits
nothing. A task that SLURM
signals (``scancel --signal=USR1``, as its time limit would) and that saves and exits 75 is requeued and finishes; a
job that needs another is submitted after it, and not at all after one that failed. A partition the cluster refuses,
sbatch missing, or a ``--slurm-option`` without ``=`` is one line and exit 2, with nothing written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from command_utils import jobs_in_this_process, read_csv, run_main
from slurm_utils import one_node_slurm_fixture  # noqa: F401 (the fixture)
from test_ablate import QUICKSTART, TINY

from sslkit.cli.ablate import main
from sslkit.errors import UserError
from sslkit.experiments.executor import Ran
from sslkit.experiments.jobs import Job
from sslkit.experiments.slurm import SlurmExecutor, slurm_settings, submitted_tasks

SWEEP = ["--sweep", "loss.temperature=0.1,0.5", "--seeds", "2"]
POINTS = 4  # two waves of the one-node cluster's two CPUs


def ablate(out: Path, *argv: str, **env: str):
    return run_main(main, [QUICKSTART, *TINY, *SWEEP, "--out", str(out), *argv], OMP_NUM_THREADS="1", **env)


def without_times(rows: list[dict]) -> list[dict]:
    return [{key: value for key, value in row.items() if key not in ("wall_s", "cpu_s", "skipped")} for row in rows]


def submit_and_kill_9(out: Path, slurm_conf: str) -> None:
    """Start the sweep on SLURM in a process of its own and kill it (-9) once SLURM holds all its points."""
    command = [sys.executable, "-m", "sslkit.cli.ablate", QUICKSTART, *TINY, *SWEEP, "--out", str(out)]
    command += ["--executor", "slurm", "--slurm-cpus", "1"]
    environment = {**os.environ, "SLURM_CONF": slurm_conf, "OMP_NUM_THREADS": "1"}
    sweep = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(submitted_tasks(out / "logs")) < POINTS:
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.stderr.read() if sweep.stderr else ""
        time.sleep(0.2)
    sweep.kill()
    sweep.wait()


@pytest.mark.slow
def test_a_sweep_on_slurm_gives_the_tables_of_a_local_sweep_and_a_rerun_submits_nothing(one_node_slurm, tmp_path):
    slurm_conf = str(one_node_slurm.conf)
    with jobs_in_this_process():  # the serial local run, its points without an interpreter's start each
        local = ablate(tmp_path / "local")
    assert local.returncode == 0, local.stdout + local.stderr
    # The command that submitted the points is killed; run again, it waits for the tasks SLURM still holds.
    submit_and_kill_9(tmp_path / "slurm", slurm_conf)
    on_slurm = ablate(tmp_path / "slurm", "--executor", "slurm", "--slurm-cpus", "1", SLURM_CONF=slurm_conf)
    assert on_slurm.returncode == 0, on_slurm.stdout + on_slurm.stderr
    # SLURM runs 2 of the points at a time, each seconds long: the command waited for some still running
    assert on_slurm.stdout.count("done, skipped") < POINTS, on_slurm.stdout
    for table in ("results.csv", "summary.csv"):
        slurm_rows, local_rows = read_csv(tmp_path / "slurm" / table), read_csv(tmp_path / "local" / table)
        assert without_times(slurm_rows) == without_times(local_rows), table
    assert len(read_csv(tmp_path / "slurm" / "results.csv")) == POINTS
    # every point ran as a task of one job array, its output in the point's own log
    submitted = list((tmp_path / "slurm" / "logs" / "slurm").glob("*_submitted.pkl"))
    assert len(submitted) == POINTS and len({path.name.split("_")[0] for path in submitted}) == 1, submitted
    points = json.loads((tmp_path / "slurm" / "results.json").read_text())["points"]
    assert all("run.resume=auto" in point["command"] for point in points)

    again = ablate(tmp_path / "slurm", "--executor", "slurm", SLURM_CONF=slurm_conf)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("done, skipped") == POINTS, again.stdout
    assert len(list((tmp_path / "slurm" / "logs" / "slurm").glob("*_submitted.pkl"))) == POINTS


@pytest.mark.slow
def test_a_partition_the_cluster_refuses_is_one_line_and_nothing_is_written(one_node_slurm, tmp_path):
    out = tmp_path / "refused"
    refused = ablate(out, "--executor", "slurm", "--slurm-partition", "nosuch", SLURM_CONF=str(one_node_slurm.conf))
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--partition=nosuch" in lines[0] and "Invalid partition" in lines[0], refused.stderr
    assert not out.exists()


def test_without_sbatch_on_the_path_the_command_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no sbatch
    out = tmp_path / "nothing"
    refused = ablate(out, "--executor", "slurm")
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "sbatch" in lines[0], refused.stderr
    assert not out.exists()


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch is not installed")
def test_a_slurm_option_without_a_value_is_one_line(tmp_path):
    refused = ablate(tmp_path / "nothing", "--executor", "slurm", "--slurm-option", "qos")
    assert refused.returncode == 2
    assert "--slurm-option qos: give KEY=VALUE" in refused.stderr, refused.stderr
    assert not (tmp_path / "nothing").exists()


def test_flags_yaml_and_options_make_the_sbatch_lines():
    executor = SlurmExecutor(partition="gpu", time="2:00:00", gpus=1, cpus=8, options={"signal": "USR1@300"})
    assert executor.parameters()["additional_parameters"] == {
        "requeue": True,
        "signal": "USR1@300",
        "partition": "gpu",
        "time": "2:00:00",
        "gpus_per_node": 1,
        "cpus_per_task": 8,
    }
    assert executor.alone().parameters()["array_parallelism"] == 1


SAVES_ON_USR1 = """\
import json, pathlib, signal, sys, time
result = pathlib.Path(sys.argv[-1])
saved = result.with_suffix(".saved")
if saved.exists():  # the requeued task: continue from what was saved
    result.write_text(json.dumps({"results": {"trained": {"knn_top1": 1.0}}}))
    sys.exit(0)
signal.signal(signal.SIGUSR1, lambda signum, frame: (saved.touch(), sys.exit(75)))
print("training", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_task_that_saves_on_slurms_signal_is_requeued_and_finishes(one_node_slurm, tmp_path, monkeypatch):
    script = tmp_path / "saves_on_usr1.py"
    script.write_text(SAVES_ON_USR1)
    # The launcher prefix stands in for a pretraining run: it saves on SIGUSR1 and exits 75, as sslkit's loop does.
    job = Job(
        "point",
        "unused",
        (str(tmp_path / "result.json"),),
        tmp_path / "result.json",
        launcher=f"{sys.executable} {script}",
    )
    monkeypatch.setenv("SLURM_CONF", str(one_node_slurm.conf))
    ended: list[Ran | None] = []
    runner = threading.Thread(
        target=SlurmExecutor().run,
        args=([job], tmp_path / "logs", lambda job: None, lambda job, ran: ended.append(ran) or True, lambda *_: None),
    )
    runner.start()
    deadline = time.monotonic() + 60
    log = tmp_path / "logs" / "point.out"
    while not (log.exists() and "training" in log.read_text()):
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.2)
    time.sleep(2)  # the first part trains two seconds at least
    [job_id] = [path.name.split("_")[0] for path in (tmp_path / "logs" / "slurm").glob("*_submitted.pkl")]
    signalled = one_node_slurm.run("scancel", "--signal=USR1", job_id)
    assert signalled.returncode == 0, signalled.stderr
    runner.join(90)
    assert not runner.is_alive()
    [ran] = ended
    assert ran is not None and ran.status == 0, ran
    assert one_node_slurm.job(int(job_id))["Restarts"] == "1"
    assert json.loads(job.result.read_text())["results"]["trained"]["knn_top1"] == 1.0
    # the part that ended reports the cost of both: the first part's, which it kept, and its own
    first = json.loads((tmp_path / "logs" / "slurm" / "point.cost.json").read_text())
    assert first["wall_s"] >= 2 and ran.wall_s > first["wall_s"] and ran.cpu_s > first["cpu_s"] > 0


SAVES_ON_SIGTERM = """\
import json, os, pathlib, signal, sys, time
result = pathlib.Path(sys.argv[-1])
saved = result.with_suffix(".saved")
if saved.exists() or os.environ.get("TRAINS_FOR_S") == "0":
    result.write_text(json.dumps({"results": {"trained": {"knn_top1": 1.0}}, "continued": saved.exists()}))
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda signum, frame: (saved.touch(), sys.exit(75)))
print("training", flush=True)
time.sleep(120)
"""


def run_in_thread(executor: SlurmExecutor, jobs: list[Job], logs: Path, ended: list) -> threading.Thread:
    runner = threading.Thread(
        target=executor.run,
        args=(jobs, logs, lambda job: None, lambda job, ran: ended.append((job.name, ran)) or True, lambda *_: None),
    )
    runner.start()
    return runner


@pytest.mark.slow
def test_a_sweep_cancelled_by_scancel_stays_cancelled_and_the_next_command_continues_it(
    one_node_slurm, tmp_path, monkeypatch
):
    script = tmp_path / "saves_on_sigterm.py"
    script.write_text(SAVES_ON_SIGTERM)
    # Two jobs, one at a time: the first runs (and saves on SIGTERM, as sslkit's loop does), the second waits.
    stand_in = f"{sys.executable} {script}"
    jobs = [
        Job(name, "unused", (str(tmp_path / f"{name}.json"),), tmp_path / f"{name}.json", launcher=stand_in)
        for name in ("first", "second")
    ]
    monkeypatch.setenv("SLURM_CONF", str(one_node_slurm.conf))
    ended: list[tuple[str, Ran | None]] = []
    runner = run_in_thread(SlurmExecutor(one_at_a_time=True), jobs, tmp_path / "logs", ended)
    deadline = time.monotonic() + 60
    log = tmp_path / "logs" / "first.out"
    while not (log.exists() and "training" in log.read_text()):
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.2)
    [job_id] = {path.name.split("_")[0] for path in (tmp_path / "logs" / "slurm").glob("*_submitted.pkl")}
    cancelled = one_node_slurm.run("scancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    runner.join(60)  # a cluster without accounting (sacct) tells nothing of a task cancelled before it ran
    assert not runner.is_alive()
    outcomes = dict(ended)
    assert outcomes["first"] is not None and outcomes["first"].status == 75, outcomes  # saved, not requeued
    assert outcomes["second"] is not None and "ended without a result" in outcomes["second"].error, outcomes
    assert (tmp_path / "first.saved").exists() and not (tmp_path / "first.json").exists()

    ended.clear()  # the same jobs again, whose stand-in now trains at once: the first continues what it saved
    monkeypatch.setenv("TRAINS_FOR_S", "0")
    run_in_thread(SlurmExecutor(), jobs, tmp_path / "logs", ended).join(90)
    assert sorted((name, ran.status) for name, ran in ended) == [("first", 0), ("second", 0)], ended
    assert [json.loads((tmp_path / f"{name}.json").read_text())["continued"] for name in ("first", "second")] == [
        True,
        False,
    ]


@pytest.mark.slow
def test_the_yaml_file_gives_the_resources_and_the_flags_win(one_node_slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(one_node_slurm.conf))
    config = tmp_path / "slurm.yaml"
    config.write_text("partition: debug\ntime: '0:10:00'\ncpus: 2\noptions:\n  signal: USR1@30\n  comment: sweep\n")
    executor = slurm_settings(config, partition=None, time="0:05:00", gpus=None, cpus=None, options={"comment": "x"})
    assert executor == SlurmExecutor("debug", "0:05:00", None, 2, {"signal": "USR1@30", "comment": "x"})
    config.write_text("partitions: debug\n")
    with pytest.raises(UserError, match="unknown key partitions; the keys are partition, time, gpus, cpus, options"):
        slurm_settings(config, partition=None, time=None, gpus=None, cpus=None, options={})


WRITES_RESULT = """\
import json, pathlib, sys
result, fails, *needs = sys.argv[sys.argv.index("-m") + 2:]
if fails == "fails" or not all(pathlib.Path(need).exists() for need in needs):
    sys.exit(1)
pathlib.Path(result).write_text(json.dumps({"results": {"trained": {}}}))
"""


def writes_result(job: str, tmp_path: Path, needs: tuple[str, ...] = (), fails: bool = False) -> Job:
    """A job that writes its result file when the results of ``needs`` are there, else exits 1."""
    script = tmp_path / "writes_result.py"
    script.write_text(WRITES_RESULT)
    result = tmp_path / f"{job}.json"
    argv = (str(result), "fails" if fails else "ok", *(str(tmp_path / f"{need}.json") for need in needs))
    return Job(job, "unused", argv, result, needs=needs, launcher=f"{sys.executable} {script}")


@pytest.mark.slow
def test_a_job_runs_after_the_job_it_needs_and_not_after_one_that_failed(one_node_slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(one_node_slurm.conf))
    jobs = [
        writes_result("embed", tmp_path),
        writes_result("broken", tmp_path, fails=True),
        writes_result("select", tmp_path, needs=("embed",)),
        writes_result("after-broken", tmp_path, needs=("broken",)),
    ]
    ended: dict[str, int | None] = {}
    SlurmExecutor().run(
        jobs,
        tmp_path / "logs",
        lambda job: None,
        lambda job, ran: ended.setdefault(job.name, None if ran is None else ran.status) == 0,
        lambda *_: None,
    )
    assert ended == {"embed": 0, "broken": 1, "select": 0, "after-broken": None}
    assert (tmp_path / "select.json").exists() and not (tmp_path / "after-broken.json").exists()
    # the two that needed nothing were one array; the one that needed "embed" came after it
    arrays = {path.name.split("_")[0] for path in (tmp_path / "logs" / "slurm").glob("*_submitted.pkl")}
    assert len(arrays) == 2


LEAVES_A_SAVING_PROCESS = """\
import subprocess, sys
# A launcher that dies of SLURM's signal at once, as accelerate launch --cpu and torchrun do, while the training
# process it started still saves.
subprocess.Popen([sys.executable, "-c", "import pathlib, sys, time; time.sleep(1); pathlib.Path(sys.argv[1]).touch()",
                  sys.argv[1]])
sys.exit(138)
"""


def test_a_task_ends_once_the_processes_its_launcher_left_have_ended(tmp_path):
    """A task is requeued (and so its processes killed) only after every process of it has ended."""
    script = tmp_path / "launcher.py"
    script.write_text(LEAVES_A_SAVING_PROCESS)
    saved, out, err, cost = (str(tmp_path / name) for name in ("saved", "task.out", "task.err", "cost.json"))
    task = f"SlurmJobRun([{sys.executable!r}, {str(script)!r}, {saved!r}], {out!r}, {err!r}, {cost!r})"
    # In a process of its own: the task adopts whatever its command leaves, and waits for all its children.
    check = f"from sslkit.experiments.slurm import SlurmJobRun; import os; ran = {task}()\n"
    check += f"print(os.path.exists({saved!r}), ran.status)"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["True", "138"], result.stdout + result.stderr
