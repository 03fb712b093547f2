"""sslkit.experiments.runner and the local executor it runs jobs on: a job's record when it succeeds, fails, is
skipped or waits on a failed job; the error line; the refusal of a run directory made with other settings. Jobs
are tiny Python processes, ``python -m run_code CODE`` (a module of the test's own that runs its argument); the
tools' own tests run real sweeps."""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sslkit.errors import UserError
from sslkit.experiments import runner
from sslkit.experiments.executor import Ran, error_line
from sslkit.experiments.experiment import finished, interrupted
from sslkit.experiments.jobs import Job, command_line
from sslkit.experiments.local import LocalExecutor

PATHS = ("run.init_from", "method.teacher")


@pytest.fixture(autouse=True)
def run_code(tmp_path_factory, monkeypatch) -> None:
    """``python -m run_code CODE`` runs CODE, in every process these tests start."""
    folder = tmp_path_factory.mktemp("modules")
    (folder / "run_code.py").write_text("import sys\nexec(sys.argv[1])\n")
    monkeypatch.setenv("PYTHONPATH", str(folder))


def job(tmp_path, name: str, code: str, **changes) -> Job:
    """A job whose command is ``python -m run_code code``, its result ``tmp_path/<name>.json``."""
    result = tmp_path / f"{name}.json"
    return Job(name, "run_code", (code.format(result=str(result)),), result, **changes)


def run(tmp_path, jobs: list[Job], previous: dict | None = None, jobs_at_once: int = 1) -> list[dict]:
    """The records of ``jobs`` run (or skipped) by the runner on the local executor."""
    previous = {} if previous is None else previous
    return runner.run_jobs(jobs, tmp_path, previous, lambda records: None, "points", LocalExecutor(jobs_at_once))


WRITES = (
    "import json; json.dump({{'results': {{'trained': {{'knn_top1': 0.5, 'steps': 3, 'ok': True}}}}}}, "
    "open({result!r}, 'w'))"
)
FAILS = "import sys; print('error: the teacher ran away', file=sys.stderr); sys.exit(2)"


def test_a_job_that_writes_its_result_is_ok_and_a_rerun_skips_it(tmp_path):
    ok = job(tmp_path, "a", WRITES, fields={"seed": 3})
    (record,) = run(tmp_path, [ok])
    assert (record["status"], record["skipped"], record["seed"]) == ("ok", False, 3) and record["wall_s"] > 0
    assert record["cpu_s"] > 0  # the interpreter's start, at least
    assert record["metrics"] == {"knn_top1": 0.5, "steps": 3.0}  # numbers only, booleans left out
    (again,) = run(tmp_path, [ok], {"a": {"wall_s": 12.5, "cpu_s": 20.0}})
    assert (again["skipped"], again["wall_s"], again["cpu_s"]) == (True, 12.5, 20.0)
    assert again["metrics"] == record["metrics"]
    (unknown,) = run(tmp_path, [ok])  # skipped, made by a run nobody timed
    assert (unknown["skipped"], unknown["wall_s"], unknown["cpu_s"]) == (True, None, None)
    assert (tmp_path / "logs" / "a.out").is_file()


def test_a_result_written_before_the_job_ends_counts_once_it_says_complete(tmp_path):
    result = tmp_path / "meta.json"
    result.write_text(json.dumps({"count": 10, "complete": False}))  # an embedding stopped part-way
    embed = Job("embed", "run_code", ("pass",), result, metrics_at=(), complete_key="complete")
    assert embed.finished_metrics() is None
    (record,) = run(tmp_path, [embed])  # runs again; still incomplete: failed
    assert (record["skipped"], record["status"]) == (False, "failed")
    result.write_text(json.dumps({"count": 10, "complete": True}))
    assert run(tmp_path, [embed])[0]["skipped"] is True
    assert Job("x", "run_code", (), result, metrics_at=()).finished_metrics() == {"count": 10.0}


def test_a_failing_job_is_recorded_with_its_error_and_what_needs_it_is_not_run(tmp_path):
    teacher, student = job(tmp_path, "teacher", FAILS), job(tmp_path, "student", WRITES, needs=("teacher",))
    grandchild = job(tmp_path, "grandchild", WRITES, needs=("student",))
    silent = job(tmp_path, "silent", "pass")
    records = run(tmp_path, [teacher, student, grandchild, silent])
    assert [(r["status"], r["error"], r["skipped"]) for r in records] == [
        ("failed", "the teacher ran away", False),
        ("failed", "not run: teacher failed", False),
        ("failed", "not run: student failed", False),
        ("failed", "finished without writing silent.json", False),
    ]
    assert records[0]["wall_s"] > 0 and "the teacher ran away" in (tmp_path / "logs" / "teacher.err").read_text()
    assert records[1]["wall_s"] is None and not (tmp_path / "logs" / "student.err").exists()


def test_run_jobs_calls_back_after_each_and_keeps_wall_times(tmp_path, capsys):
    jobs = [job(tmp_path, "a", WRITES), job(tmp_path, "b", FAILS), job(tmp_path, "c", WRITES, needs=("b",))]
    seen, previous = [], {"old": {"wall_s": 1.0, "cpu_s": 2.0}}
    records = runner.run_jobs(
        jobs, tmp_path, previous, lambda records: seen.append(len(records)), "points", LocalExecutor()
    )
    assert seen == [1, 2, 3] and [r["status"] for r in records] == ["ok", "failed", "failed"]
    assert set(previous) == {"old", "a", "b"}  # c never ran
    assert previous["a"] == {"wall_s": records[0]["wall_s"], "cpu_s": records[0]["cpu_s"]}
    out = capsys.readouterr().out
    assert "[1/3] a: ok in" in out and "knn_top1 0.5000" in out and "not run: b failed" in out
    assert records[0]["command"] == shlex.join(jobs[0].command())
    outcome = finished(records, tmp_path, "points", [], "results: here")
    assert outcome.exit_status == 1 and outcome.records is records
    assert [note.plain for note in outcome.notes] == [
        "results: here",
        f"2 of 3 points failed; rerunning the same command retries them (logs in {tmp_path / 'logs'})",
    ]
    assert finished(records[:1], tmp_path, "points", [], "results: here").exit_status == 0
    assert interrupted().exit_status == 130


def test_a_job_is_python_or_the_launcher_with_m():
    assert command_line("sslkit.cli.evaluate", ["runs/x"]) == [sys.executable, "-m", "sslkit.cli.evaluate", "runs/x"]
    launched = Job("p", "sslkit.cli.pretrain", ("r.yaml",), result=None, launcher="torchrun --nproc_per_node 2")
    assert launched.command() == ["torchrun", "--nproc_per_node", "2", "-m", "sslkit.cli.pretrain", "r.yaml"]


def test_error_line_prefers_sslkits_own_line_over_a_launchers_traceback():
    stderr = (
        'error: loss became nan at step 3\nTraceback (most recent call last):\n  File "x"\n'
        "subprocess.CalledProcessError: Command '...' returned non-zero exit status 2.\n"
    )
    assert error_line(stderr, 1) == "loss became nan at step 3"
    assert error_line("Traceback ...\nRuntimeError: boom\n\n", 1) == "RuntimeError: boom"
    assert error_line("", -9) == "killed by SIGKILL"
    assert error_line("", 3) == "exited with status 3 and printed nothing on stderr"


def test_config_differences_compare_paths_resolved_and_runs_of_the_sweep_by_name(tmp_path):
    wanted = {"run.init_from": str(tmp_path / "a" / ".." / "pre"), "run.output_dir": "x", "optim.lr": 0.1, "new": 1}
    saved = {"run.init_from": str(tmp_path / "pre"), "run.output_dir": "/abs/x", "optim.lr": 0.1}
    assert runner.config_differences(wanted, saved, PATHS) == []
    assert runner.config_differences(wanted, saved) == ["run.init_from"]  # not a path key: compared as text
    assert runner.config_differences({**wanted, "optim.lr": 0.2}, saved, PATHS) == ["optim.lr"]
    assert runner.config_differences({**wanted, "run.init_from": "null"}, saved, PATHS) == ["run.init_from"]
    assert runner.config_differences({"run.init_from": "null"}, {"run.init_from": None}, PATHS) == []
    # the sweep's folder moved from old/ to new/: its runs still start from its own pretraining and teacher
    moved = {"run.output_dir": "/new/runs", "run.init_from": "/new/runs/pretrain", "method.teacher": "/new/runs/ft"}
    before = {"run.output_dir": "/old/runs", "run.init_from": "/old/runs/pretrain", "method.teacher": "/old/runs/ft"}
    assert runner.config_differences(moved, before, PATHS) == []
    assert runner.config_differences({**moved, "method.teacher": "/new/runs/ft2"}, before, PATHS) == ["method.teacher"]
    assert runner.config_differences({**moved, "run.init_from": "/old/runs/pretrain"}, before, PATHS) == [
        "run.init_from"
    ]
    # ... and on the label file it wrote in a folder beside its runs, not on another
    keys = (*PATHS, "data.label_subset")
    labels = {**moved, "data.label_subset": "/new/labels/typiclust-n100-s0.json"}
    assert (
        runner.config_differences(labels, {**before, "data.label_subset": "/old/labels/typiclust-n100-s0.json"}, keys)
        == []
    )
    other = {**before, "data.label_subset": "/old/labels/typiclust-n100-s1.json"}
    assert runner.config_differences(labels, other, keys) == ["data.label_subset"]


def test_a_run_directory_made_with_other_settings_is_refused_in_one_line(tmp_path):
    runner.refuse_changed_run(tmp_path, {"optim.lr": 0.2}, (), "sweep")  # no config.yaml yet: nothing to refuse
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"optim": {"lr": 0.1, "momentum": 0.9}}))
    runner.refuse_changed_run(tmp_path, {"optim.lr": 0.1}, (), "sweep")
    with pytest.raises(UserError, match=r"was run with optim.lr=0.1, this sweep asks for optim.lr=0.2 \(and 1 more"):
        runner.refuse_changed_run(tmp_path, {"optim.lr": 0.2, "optim.momentum": 0.0}, (), "sweep")


def test_previous_times_take_the_records_and_the_saved_times(tmp_path):
    path = tmp_path / "points.json"
    assert runner.previous_times(path, "runs") == {}
    runs = [{"name": "a", "wall_s": 2.0, "cpu_s": 3.0}, {"name": "b", "wall_s": None, "cpu_s": None}]
    times = {"a": {"wall_s": 1.0, "cpu_s": 1.0}, "gone": {"wall_s": 5.0, "cpu_s": 9.0}}
    path.write_text(json.dumps({"runs": runs, "times": times}))
    assert runner.previous_times(path, "runs") == {"a": {"wall_s": 2.0, "cpu_s": 3.0}, "gone": times["gone"]}
    # a folder whose sweep kept wall seconds alone: its runs' CPU time is unknown, not zero
    path.write_text(json.dumps({"runs": [{"name": "a", "wall_s": 2.0}], "wall_times": {"gone": 5.0}}))
    assert runner.previous_times(path, "runs") == {
        "a": {"wall_s": 2.0, "cpu_s": None},
        "gone": {"wall_s": 5.0, "cpu_s": None},
    }


def test_a_stopped_jobs_cost_is_added_to_its_next_parts():
    ran = Ran(0, None, wall_s=10.0, cpu_s=4.0)
    assert runner.cost_after(None, ran) == {"wall_s": 10.0, "cpu_s": 4.0}
    # an earlier run that ended (finished or failed) is not part of this one
    assert runner.cost_after({"wall_s": 7.0, "cpu_s": 3.0}, ran) == {"wall_s": 10.0, "cpu_s": 4.0}
    stopped = {"wall_s": 7.0, "cpu_s": 3.0, runner.STOPPED: True}
    assert runner.cost_after(stopped, ran) == {"wall_s": 17.0, "cpu_s": 7.0}
    assert runner.cost_after({**stopped, "cpu_s": None}, ran) == {"wall_s": 17.0, "cpu_s": None}  # not known
    assert runner.cost_after({**stopped, runner.STOPPED: False}, ran) == {"wall_s": 10.0, "cpu_s": 4.0}


BUSY = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass"


def test_cpu_seconds_count_the_job_and_the_processes_it_waited_for(tmp_path):
    """A launcher's workers are its children: their CPU time is the job's too, as it is on a second core."""
    workers = (
        "import subprocess, sys, json; "
        f"procs = [subprocess.Popen([sys.executable, '-c', {BUSY.format(seconds=0.4)!r}]) for _ in range(2)]; "
        "[p.wait() for p in procs]; json.dump({{'results': {{'trained': {{'ok': 1}}}}}}, open({result!r}, 'w'))"
    )
    (record,) = run(tmp_path, [job(tmp_path, "launched", workers)])
    assert record["status"] == "ok", record["error"]
    assert record["cpu_s"] >= 0.8  # two workers of 0.4 CPU-s each (beside the interpreters' own starts)
    # Two such jobs side by side: each is charged its own processes, not its neighbour's too.
    for result in tmp_path.glob("*.json"):
        result.unlink()
    records = run(tmp_path, [job(tmp_path, name, workers) for name in ("a", "b")], jobs_at_once=2)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(0.8 <= r["cpu_s"] < 1.6 for r in records), [r["cpu_s"] for r in records]


# --------------------------------------------------------------------------- several jobs at once

# A job that says it has started, then waits (a minute at most) until another has: it finishes only when the two
# run at the same time.
MEETS = (
    "import json, os, pathlib, time\n"
    "folder = pathlib.Path({result!r}).parent\n"
    "(folder / (pathlib.Path({result!r}).stem + '.started')).touch()\n"
    "end = time.monotonic() + 60\n"
    "while time.monotonic() < end and len(list(folder.glob('*.started'))) < 2: time.sleep(0.05)\n"
    "met = len(list(folder.glob('*.started'))) >= 2\n"
    "threads = int(os.environ.get('OMP_NUM_THREADS') or 0)\n"
    "json.dump({{'results': {{'trained': {{'met': float(met), 'threads': threads}}}}}}, open({result!r}, 'w'))"
)
# A job that records whether the result of job "a" was there when it started.
AFTER_A = (
    "import json, pathlib\n"
    "seen = pathlib.Path({result!r}).with_name('a.json').is_file()\n"
    "json.dump({{'results': {{'trained': {{'a_was_done': float(seen)}}}}}}, open({result!r}, 'w'))"
)


def test_jobs_run_side_by_side_on_their_share_of_the_cpus_each_after_what_it_needs(tmp_path, capsys):
    jobs = [job(tmp_path, "a", MEETS), job(tmp_path, "b", AFTER_A, needs=("a",)), job(tmp_path, "c", MEETS)]
    records = run(tmp_path, jobs, jobs_at_once=2)
    assert [r["name"] for r in records] == ["a", "b", "c"]  # in the jobs' order, whatever order they ended in
    assert [r["status"] for r in records] == ["ok"] * 3, [r["error"] for r in records]
    # a and c ran at once (each waited for the other); b, which needs a, started after a had finished
    assert [r["metrics"].get("met") for r in records] == [1.0, None, 1.0] and records[1]["metrics"]["a_was_done"]
    cpus = len(os.sched_getaffinity(0))
    assert [records[i]["metrics"]["threads"] for i in (0, 2)] == [max(1, cpus // 2)] * 2
    assert "[3/3]" in capsys.readouterr().out


def test_a_job_whose_need_fails_beside_others_is_not_run_and_the_others_go_on(tmp_path):
    jobs = [job(tmp_path, "teacher", FAILS), job(tmp_path, "student", WRITES, needs=("teacher",))]
    jobs += [job(tmp_path, name, WRITES) for name in ("x", "y")]
    records = run(tmp_path, jobs, jobs_at_once=2)
    assert [(r["name"], r["status"]) for r in records] == [
        ("teacher", "failed"),
        ("student", "failed"),
        ("x", "ok"),
        ("y", "ok"),
    ]
    assert records[1]["error"] == "not run: teacher failed"


def test_jobs_at_once_are_at_least_one_and_a_calibration_runs_alone_on_a_runs_share():
    with pytest.raises(UserError, match=r"^--jobs must be at least 1, got 0$"):
        LocalExecutor(0)
    alone = LocalExecutor(4).alone()
    assert alone.jobs == 1 and alone.environments() == LocalExecutor(4).environments()[:1]
    assert LocalExecutor(1).environments() == [{}]  # one job at a time: the environment as it is


# The runner in a process of its own, as a command runs it: jobs "slow-*" wait until they are stopped (unless
# QUICK is set), "ignores" ignores SIGINT too, "last" waits for a free place; the exit status is the outcome's.
# The times are kept in times.json, as an experiment keeps them with its tables, and the records in records.json.
SWEEP = """
import json, os, sys
from pathlib import Path
from sslkit.experiments import runner
from sslkit.experiments.experiment import interrupted
from sslkit.experiments.jobs import Job
from sslkit.experiments.local import LocalExecutor

out = Path(sys.argv[1])
WAITS = (
    "import json, os, signal, sys, time, pathlib\\n"
    "result = pathlib.Path(sys.argv[2])\\n"
    "if sys.argv[3] == 'ignore': signal.signal(signal.SIGINT, signal.SIG_IGN)\\n"
    "result.with_suffix('.pid').write_text(str(os.getpid()))\\n"
    "while not os.environ.get('QUICK'): time.sleep(0.05)\\n"
    "json.dump({'results': {'trained': {'ok': 1}}}, open(result, 'w'))"
)
names = sys.argv[2:]
jobs = [Job(n, "run_code", (WAITS, str(out / f"{n}.json"), "ignore" if n == "ignores" else ""), out / f"{n}.json")
        for n in names]
times_file = out / "times.json"
times = json.loads(times_file.read_text()) if times_file.exists() else {}
def keep(records):
    times_file.write_text(json.dumps(times))
    (out / "records.json").write_text(json.dumps(records))
records = runner.run_jobs(jobs, out, times, keep, "points", LocalExecutor(len(names) - 1))
sys.exit(130 if records is None else 0)
"""


def sweep(folder: Path, names: list[str], ctrl_c_ignored: bool = False, **env: str) -> subprocess.Popen:
    """:data:`SWEEP` in a process of its own, over the jobs ``names``; with ``ctrl_c_ignored``, started as a script
    starts a command in the background (SIGINT ignored, which a child inherits)."""
    command = [sys.executable, "-c", SWEEP, str(folder), *names]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **env}  # no GPU to count: the runner needs no torch
    disposition = signal.SIG_IGN if ctrl_c_ignored else signal.SIG_DFL
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )  # fmt: skip


def wait_for(path: Path) -> int:
    """The pid a job writes to ``path`` once it has started (a minute at most)."""
    for _ in range(1200):
        if path.is_file() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never came")


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").is_dir() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_ctrl_c_stops_every_running_job_and_the_same_command_continues(tmp_path):
    names = ["slow-1", "ignores", "last"]
    runner_process = sweep(tmp_path, names)
    slow, ignores = wait_for(tmp_path / "slow-1.pid"), wait_for(tmp_path / "ignores.pid")
    runner_process.send_signal(signal.SIGINT)  # to the runner alone: it passes Ctrl-C on to the running jobs
    for _ in range(1200):
        if not alive(slow):
            break
        time.sleep(0.05)
    assert not alive(slow) and alive(ignores) and runner_process.poll() is None  # waiting for the one left
    runner_process.send_signal(signal.SIGINT)  # a second Ctrl-C kills it
    output, _ = runner_process.communicate(timeout=60)
    assert runner_process.returncode == 130 and "interrupted: the same command continues" in output, output
    assert not alive(ignores) and not (tmp_path / "last.pid").exists()  # nothing started after Ctrl-C
    stopped = json.loads((tmp_path / "times.json").read_text())  # what the stopped jobs had cost, kept
    assert set(stopped) == {"slow-1", "ignores"} and all(stopped[name][runner.STOPPED] for name in stopped)
    assert all(stopped[name]["wall_s"] > 0 and stopped[name]["cpu_s"] > 0 for name in stopped)

    again = sweep(tmp_path, names, QUICK="1")  # the same command, its jobs now quick
    output, _ = again.communicate(timeout=120)
    assert again.returncode == 0, output
    assert all((tmp_path / f"{name}.json").is_file() for name in names)
    records = {r["name"]: r for r in json.loads((tmp_path / "records.json").read_text())}
    times = json.loads((tmp_path / "times.json").read_text())
    for name in stopped:  # both parts: the stopped one and the one that finished
        assert records[name]["wall_s"] > stopped[name]["wall_s"] and records[name]["cpu_s"] > stopped[name]["cpu_s"]
        assert times[name] == {key: records[name][key] for key in ("wall_s", "cpu_s")}
    (tmp_path / "slow-1.pid").unlink()
    third = sweep(tmp_path, names, QUICK="1")
    output, _ = third.communicate(timeout=120)
    assert third.returncode == 0 and output.count("done, skipped") == 3 and not (tmp_path / "slow-1.pid").exists()
    skipped = {r["name"]: r for r in json.loads((tmp_path / "records.json").read_text())}
    for name in names:  # the skipped jobs keep their cost, both parts
        assert skipped[name]["wall_s"] == records[name]["wall_s"] and runner.STOPPED not in skipped[name]


def test_sigterm_to_the_runner_stops_its_jobs_as_ctrl_c_does(tmp_path):
    """The jobs run in sessions of their own, which a terminal's hangup or a kill of the runner does not reach."""
    runner_process = sweep(tmp_path, ["slow-1", "slow-2"])
    slow = wait_for(tmp_path / "slow-1.pid")
    runner_process.send_signal(signal.SIGTERM)
    output, _ = runner_process.communicate(timeout=60)
    assert runner_process.returncode == 130 and "interrupted" in output, output
    assert not alive(slow)


TGKILL = {"x86_64": 234, "aarch64": 131}  # the system call's number: Python wraps it only for its own threads


@pytest.mark.skipif(os.uname().machine not in TGKILL, reason="tgkill's number on this machine is not listed")
def test_ctrl_c_that_lands_on_another_thread_of_the_runner_still_stops_its_jobs(tmp_path):
    """Linux may hand a signal for the process to any of its threads (on a busy machine it does); Python runs the
    handler in the main thread only, which must not be blocked in a wait that nothing else ends."""
    runner_process = sweep(tmp_path, ["slow-1", "slow-2"])
    slow = wait_for(tmp_path / "slow-1.pid")
    tasks = Path(f"/proc/{runner_process.pid}/task")
    other = next(int(task.name) for task in tasks.iterdir() if int(task.name) != runner_process.pid)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(TGKILL[os.uname().machine], runner_process.pid, other, signal.SIGINT) == 0
    output, _ = runner_process.communicate(timeout=60)
    assert runner_process.returncode == 130 and "interrupted" in output, output
    assert not alive(slow)


def test_a_runner_started_with_ctrl_c_ignored_still_stops_its_jobs(tmp_path):
    """``nohup sslkit-ablate ... &`` from a script: the command and, through it, its jobs would inherit SIGINT
    ignored, and the Ctrl-C that a SIGTERM passes on would stop none of them."""
    runner_process = sweep(tmp_path, ["slow-1", "slow-2"], ctrl_c_ignored=True)
    slow = wait_for(tmp_path / "slow-1.pid")
    runner_process.send_signal(signal.SIGTERM)
    output, _ = runner_process.communicate(timeout=60)
    assert runner_process.returncode == 130 and "interrupted" in output, output
    assert not alive(slow)
