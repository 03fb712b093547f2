"""sslkit.experiments.runner and the local executor it runs jobs on: a job's record when it succeeds, fails, is
skipped or waits on a failed job; the error line; the refusal of a run directory made with other settings. Jobs
are tiny Python processes, ``python -m run_code CODE`` (a module of the test's own that runs its argument); the
tools' own tests run real sweeps."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
import yaml

from sslkit.errors import UserError
from sslkit.experiments import runner
from sslkit.experiments.executor import error_line
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
