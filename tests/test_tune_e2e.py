"""sslkit-tune end to end on digits: real workers running real tiny pretraining runs (a width-4 ResNet-18 on 8x8
crops, an epoch of 22 steps).

A kill -9 of the command stops its two workers, and the same command continues the study to its trials, the
stopped runs from their checkpoints, and writes a best recipe that sslkit-pretrain trains; a trial whose online kNN
falls behind is pruned by its stop signal; the study lives in a PostgreSQL server the test
starts (tests/postgres_utils.py); the workers run as a job array of a one-node SLURM (tests/slurm_utils.py); a
metric no run records stops the study after its first trial. The command runs
as its ``main(argv)`` in this process (its workers and their runs are processes), but where it is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from command_utils import read_csv, run_main
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from postgres_utils import postgres_server
from slurm_utils import one_node_slurm_fixture  # noqa: F401 (the fixture)

from sslkit.cli import pretrain as pretrain_cli
from sslkit.cli import tune as tune_cli
from sslkit.config import load_config
from sslkit.experiments.tune import plan_tuning

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")
TINY = [
    "model.width=4",
    "model.projector_hidden=32",
    "model.projector_out=16",
    "augment.image_size=8",
    "train.batch_size=64",
    "train.log_every_steps=5",
    "train.threads=1",
    "train.knn_every_epochs=1",
    "eval.linear_epochs=2",
    "eval.compare_random_init=false",
    "eval.compare_raw_pixels=false",
    "optim.warmup_epochs=0",
]
LR = "optim.lr=log:1e-4,1e-2"


def tune(out: Path, *argv: str, trials: int = 2) -> subprocess.CompletedProcess:
    """``sslkit-tune quickstart TINY --search LR --trials N --out OUT ARGV`` in this process, one-thread runs."""
    command = [QUICKSTART, *TINY, "--search", LR, "--trials", str(trials), "--out", str(out), *argv]
    return run_main(tune_cli.main, command, OMP_NUM_THREADS="1")


def trials_of(out: Path, storage: str | None = None) -> list[optuna.trial.FrozenTrial]:
    study_storage = storage or optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "study.journal"))
    )
    return optuna.load_study(study_name=out.name, storage=study_storage).get_trials()


@pytest.mark.slow
def test_a_trial_behind_the_others_at_an_epoch_is_stopped_by_its_stop_signal_and_pruned(tmp_path):
    out = tmp_path / "pruned"
    plan = plan_tuning(QUICKSTART, [LR], trials=6, out=out, overrides=[*TINY, "train.epochs=20"])
    study = plan.open_study(create=True)
    for lr in (1e-3, 2e-3, 3e-3, 4e-3, 5e-3):  # five trials far ahead at every epoch: the median pruner starts
        study.add_trial(
            create_trial(
                params={"optim.lr": lr},
                distributions={"optim.lr": FloatDistribution(1e-4, 1e-2, log=True)},
                value=0.99,
                intermediate_values={epoch: 0.99 for epoch in range(1, 4)},
            )
        )
    result = tune(out, "train.epochs=20", trials=6)  # 20: pruned long before its end
    assert result.returncode == 0, result.stdout + result.stderr
    pruned = trials_of(out)[5]
    assert pruned.state == TrialState.PRUNED and list(pruned.intermediate_values) == [1], pruned
    assert "trial 5: optim.lr=" in result.stdout and ": pruned at epoch 1, kNN top-1 0." in result.stdout
    assert "6 trials: 5 complete, 1 pruned, 0 failed; pruning saved about" in result.stdout
    log = (out / "logs" / "trial-0005.err").read_text()
    assert "stopped by SIGTERM after step" in log and "exit status 75" in log  # saved, not killed
    assert not (out / "trials" / "trial-0005" / "results.json").exists()


def running_processes_under(folder: Path) -> list[str]:
    """The command lines of the processes that name ``folder`` (the command's workers and their runs), read whole
    (``ps`` cuts them at the terminal's width)."""
    command_lines = (" ".join(process.info["cmdline"] or []) for process in psutil.process_iter(["cmdline"]))
    return [line for line in command_lines if str(folder) in line]


@pytest.mark.slow
def test_after_a_kill_9_the_same_command_finishes_the_study_and_its_best_recipe_trains(tmp_path):
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "sslkit.cli.tune", QUICKSTART, *TINY, "train.epochs=2"]
    command += ["train.checkpoint_every_epochs=1", "--search", LR, "--trials", "2", "--jobs", "2", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while not list(out.glob("trials/*/checkpoints/step-*")) and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)  # mid-run: an epoch saved, the trials still training
    process.wait()
    while running_processes_under(out) and time.monotonic() < deadline:  # its workers stop their runs, which save
        time.sleep(0.2)
    assert not running_processes_under(out)
    for worker in ("worker-0", "worker-1"):  # the command's end reached them as a stop signal
        assert "stopped by SIGTERM" in (out / "logs" / f"{worker}.err").read_text(), worker
    stopped = trials_of(out)
    assert TrialState.RUNNING not in [trial.state for trial in stopped]
    retries = [trial for trial in stopped if trial.state == TrialState.WAITING]
    saved = {path.parent.parent.name for path in out.glob("trials/*/checkpoints/step-*")}
    assert retries and all(trial.user_attrs["run"] in {"trial-0000", "trial-0001"} for trial in retries)

    result = tune(out, "--jobs", "2", "train.epochs=2", "train.checkpoint_every_epochs=1")
    assert result.returncode == 0, result.stdout + result.stderr
    trials = trials_of(out)
    assert sum(trial.state == TrialState.COMPLETE for trial in trials) == 2
    assert "stopped and retried" in result.stdout
    for retry in retries:  # each continued its run where it stopped, or started it again if it had saved nothing
        run = retry.user_attrs["run"]
        checkpoints = out / "trials" / run / "checkpoints"
        expected = f"resumed from {checkpoints}" if run in saved else f"no checkpoint in {checkpoints}: starting fresh"
        log = (out / "logs" / f"{run}.out").read_text()
        assert expected in log, log
    assert_a_finished_study(out, result, trials)

    again = run_main(pretrain_cli.main, [str(out / "best.yaml"), f"run.output_dir={tmp_path}", "train.max_steps=2"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp_path / "quickstart-tuned" / "results.json").is_file()

    done = tune(out, "--jobs", "2", "train.epochs=2", "train.checkpoint_every_epochs=1")  # nothing left to run
    assert done.returncode == 0 and "2 of 2 trials done" in done.stdout, done.stdout + done.stderr
    assert len(trials_of(out)) == 4  # nothing new: the two stopped trials and their two retries


def assert_a_finished_study(out: Path, result: subprocess.CompletedProcess, trials: list) -> None:
    """Two complete trials (their runs those of the two stopped ones), their table, the best trial's recipe and the
    study's plots."""
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    assert {trial.user_attrs["run"] for trial in complete} == {"trial-0000", "trial-0001"}
    assert "best trials of killed: maximize knn_top1" in result.stdout
    assert "4 trials: 2 complete, 0 pruned, 0 failed, 2 stopped and retried" in result.stdout
    assert sum(json.loads((out / "workers" / f"worker-{i}.json").read_text())["trials_run"] for i in (0, 1)) == 2
    rows = read_csv(out / "trials.csv")
    assert [row["state"] for row in rows] == ["stopped, retried"] * 2 + ["complete"] * 2, rows
    best = max(complete, key=lambda trial: trial.value)
    tuned = load_config(out / "best.yaml")
    assert (
        tuned.optim.lr == best.params["optim.lr"] and tuned.model.width == 4 and tuned.run.name == "quickstart-tuned"
    )
    assert (out / "history.png").is_file() and (out / "values.png").is_file() and (out / "curves.png").is_file()


@pytest.fixture(scope="module")
def postgres():
    with postgres_server() as url:
        yield url


@pytest.mark.slow
def test_workers_share_a_study_in_postgresql_which_refuses_another_search(tmp_path, postgres):
    out = tmp_path / "in-postgres"
    result = tune(out, "--jobs", "2", "--storage", postgres, "train.epochs=1", "train.max_steps=4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"study 'in-postgres' in {postgres}" in result.stdout and not (out / "study.journal").exists()
    assert [trial.state for trial in trials_of(out, postgres)] == [TrialState.COMPLETE] * 2
    other = run_main(
        tune_cli.main,
        [QUICKSTART, *TINY, "--search", "optim.lr=log:1e-3,1e-1", "--storage", postgres, "--out", str(out)],
    )
    assert other.returncode == 2 and other.stderr.strip().splitlines() == [
        f"error: study 'in-postgres' in {postgres} searches optim.lr=log:0.0001,0.01, this command --search "
        "optim.lr=log:0.001,0.1; give the same, or another --out (or --study) for a new study"
    ]


@pytest.mark.slow
def test_a_metric_that_the_finished_runs_do_not_record_stops_the_study_in_one_line(tmp_path):
    out = tmp_path / "retrieval"
    result = tune(out, "--metric", "unseen_map@r", "train.epochs=1", "train.max_steps=2", trials=3)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --metric unseen_map@r: the runs record knn_top1, linear_top1, linear_top5, linear_train_top1, not "
        "unseen_map@r; choose one of those (the same command with it continues the study)"
    ]
    assert len(trials_of(out)) == 1 and not (out / "best.yaml").exists()


@pytest.mark.slow
def test_the_workers_run_as_a_slurm_job_array_as_they_run_here(tmp_path, one_node_slurm):
    out = tmp_path / "on-slurm"
    conf = str(one_node_slurm.conf)
    result = run_main(
        tune_cli.main,
        [QUICKSTART, *TINY, "--search", LR, "--trials", "2", "--jobs", "2", "--out", str(out), "train.epochs=1"]
        + ["--executor", "slurm", "--slurm-cpus", "1"],
        OMP_NUM_THREADS="1",
        SLURM_CONF=conf,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert [trial.state for trial in trials_of(out)] == [TrialState.COMPLETE] * 2
    submitted = sorted(path.name for path in (out / "logs" / "slurm").glob("*_submitted.pkl"))
    assert len(submitted) == 2 and len({name.split("_")[0] for name in submitted}) == 1, submitted  # one array
    assert (out / "best.yaml").is_file()
