"""sslkit-tune's parts that need no training run: the search spaces, the workers' command line, the mistakes named
before any trial (in one line, before torch where the schema suffices), a study's claims on its search, what a
dead worker leaves in a journal (real processes holding and losing the locks, kill -9 included), the reading of
a growing metrics.jsonl, and the tables, best recipe and plots of a real Optuna study.

The command's trials (two workers, pruning, kill -9 of the command, PostgreSQL) are in test_tune_e2e.py.
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
import pytest
import yaml
from command_utils import read_csv, run_main
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from sslkit.cli import tune as tune_cli
from sslkit.config import load_config
from sslkit.errors import UserError
from sslkit.experiments import tune_report, tune_storage
from sslkit.experiments.jobs import Job
from sslkit.experiments.tune import plan_tuning
from sslkit.experiments.tune_space import Space, check_in_schema, check_metric_name, override_value, parse_space
from sslkit.experiments.tune_worker import EpochValues, Objective
from sslkit.schema import find_recipe

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LR = "optim.lr=log:1e-4,1e-2"
CROPS = ("[0.08, 1.0]", "[0.2, 1.0]")
NO_CLASSIFIER = "no run records it (method.name=simclr records no classifier"


# --------------------------------------------------------------------------- search spaces


@pytest.mark.parametrize(
    "text, space",
    [
        ("optim.lr=log:1e-4,1e-2", Space("optim.lr", "log", 1e-4, 1e-2)),
        ("optim.weight_decay=uniform:0,0.1", Space("optim.weight_decay", "uniform", 0.0, 0.1)),
        ("train.epochs=int:10,300", Space("train.epochs", "int", 10, 300)),
        ("train.epochs=int:10,300,10", Space("train.epochs", "int", 10, 300, 10)),
        ("loss.name = choice: ntxent, dcl", Space("loss.name", "choice", choices=("ntxent", "dcl"))),
        ("augment.crop_scale=choice:[0.08,1.0],[0.2,1.0]", Space("augment.crop_scale", "choice", choices=CROPS)),
    ],
)
def test_a_space_parses_into_its_kind_and_bounds(text, space):
    assert parse_space(text) == space
    assert parse_space(f"{space.key}={space.text()}") == space  # as the study stores it, and the workers get it


@pytest.mark.parametrize(
    "text, words",
    [
        ("optim.lr", "must look like KEY=log:LOW,HIGH"),
        ("optim.lr=1e-4,1e-2", "must look like"),
        ("optim.lr=logx:1e-4,1e-2", "must look like"),
        ("lr=log:1e-4,1e-2", "must look like"),
        ("optim.lr=log:0,1", "a log space needs bounds above 0"),
        ("optim.lr=uniform:2,1", "LOW < HIGH"),
        ("optim.lr=uniform:0,1,2", "two bounds"),
        ("optim.lr=uniform:a,1", "'a' is not a number"),
        ("optim.lr=uniform:0,inf", "'inf' is not a finite number"),
        ("train.epochs=int:10,300,7", "a STEP of 1 or more that divides HIGH - LOW"),
        ("train.epochs=int:1.5,3", "'1.5' is not an integer"),
        ("loss.name=choice:ntxent", "two or more different choices"),
        ("loss.name=choice:ntxent,ntxent", "two or more different choices"),
    ],
)
def test_a_space_that_does_not_parse_is_one_line_naming_it(text, words):
    with pytest.raises(UserError) as error:
        parse_space(text)
    assert "\n" not in str(error.value) and f"--search '{text}'" in str(error.value) and words in str(error.value)


@pytest.mark.parametrize("value", [1e-05, 0.00123, 2.5e-10, 1e20, 3, 0.1])
def test_a_trial_value_as_an_override_reads_back_as_the_same_value(value):
    read = yaml.safe_load(override_value(value))
    assert read == value and type(read) is type(value)


def test_a_key_the_recipe_lacks_or_a_bound_of_the_wrong_type_is_named_by_the_schema():
    recipe = find_recipe("quickstart")
    with pytest.raises(UserError, match=r"--search optim.lrr=log:1,2: unknown key 'optim.lrr'; valid keys in 'optim'"):
        check_in_schema(recipe, [], [parse_space("optim.lrr=log:1,2")])
    with pytest.raises(UserError, match=r"'train.epochs' must be int, got 1.5"):
        check_in_schema(recipe, [], [parse_space("train.epochs=uniform:1.5,3")])
    check_in_schema(recipe, ["train.epochs=3"], [parse_space(LR), parse_space("loss.temperature=uniform:0.1,0.5")])


@pytest.mark.parametrize("metric", ["knn_top1", "linear_top1", "finetune_top1", "unseen_map@r", "unseen_recall@4"])
def test_the_metrics_runs_record_are_names_the_command_takes(metric):
    check_metric_name(metric)


@pytest.mark.parametrize("metric", ["accuracy", "knn_top5", "map@r", "unseen_recall@"])
def test_a_metric_no_run_records_is_one_line_listing_those_they_do(metric):
    with pytest.raises(UserError, match=rf"--metric {metric}: no run records it; a run records knn_top1, linear_top1"):
        check_metric_name(metric)


# --------------------------------------------------------------------------- the command line


def test_a_workers_command_line_reads_back_as_the_command_was_given(tmp_path):
    odd = tmp_path / "my runs" / "lr=0.1" / "-x"
    plan = plan_tuning(
        QUICKSTART,
        [LR, "loss.name=choice:ntxent,dcl"],
        metric="linear_top1",
        trials=5,
        sampler="random",
        pruner="hyperband",
        seed=3,
        validation=0.1,
        out=odd,
        storage="postgresql://me:secret@db.example/optuna",
        study="my study",
        overrides=["train.epochs=3", "data.root=/a b/c"],
    )
    args = tune_cli.parse_args(plan.worker_argv(1))
    again = tune_cli.plan_from(args)
    assert args.worker == 1 and again.place == plan.place and again.spaces == plan.spaces
    assert (again.recipe, again.overrides, again.metric, again.trials) == (
        plan.recipe,
        plan.overrides,
        "linear_top1",
        5,
    )
    assert (again.sampler, again.pruner, again.seed, again.direction) == ("random", "hyperband", 3, "maximize")
    assert again.validation == 0.1
    assert plan.place.shown() == "postgresql://me:***@db.example/optuna"


AS_CONSOLE_SCRIPT = """
import sys
from sslkit.cli.tune import main
sys.argv = ["sslkit-tune", *sys.argv[1:]]
try:
    status = main()
finally:
    print("heavy:", *sorted({"torch", "numpy", "optuna"} & set(sys.modules)))
sys.exit(status)
"""


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--search", "optim.lr=log:0,1"], "--search 'optim.lr=log:0,1': a log space needs bounds above 0"),
        (
            ["--search", "optim.lrr=log:1,2"],
            "--search optim.lrr=log:1,2: unknown key 'optim.lrr'; valid keys in 'optim'",
        ),
        ([], "nothing to search: give --search KEY=log:LOW,HIGH"),
        (["--search", LR, "--metric", "accuracy"], "--metric accuracy: no run records it"),
        (["--search", LR, "--trials", "0"], "--trials must be at least 1, got 0"),
        (["--search", LR, "--jobs", "0"], "--jobs must be at least 1, got 0"),
    ],
)
def test_the_commands_mistakes_are_one_line_before_torch_or_optuna_is_imported(tmp_path, argv, line):
    command = [sys.executable, "-c", AS_CONSOLE_SCRIPT, QUICKSTART, *argv, "--out", str(tmp_path / "out")]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert result.returncode == 2 and result.stdout.splitlines()[-1] == "heavy:", result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {line}"), result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--metric", "finetune_top1"], f"--metric finetune_top1: {NO_CLASSIFIER}"),
        (
            ["--metric", "linear_top1", "eval.linear_epochs=0"],
            "(eval.linear_epochs=0 trains no linear probe, with the",
        ),
        (["--direction", "minimize"], "--pruner median compares the trials' online kNN top-1"),
        (["run.name=mine"], "override 'run.name=mine': sslkit-tune sets run.name for every trial"),
        (["--search", "run.output_dir=choice:a,b"], "'run.output_dir=choice:a,b': sslkit-tune sets run.output_dir"),
        (["--search", "loss.name=choice:ntxent,nosuch"], "loss.name=choice:ntxent,nosuch: with loss.name=nosuch:"),
        (["--search", "method.name=choice:simclr,finetune"], NO_CLASSIFIER),
        (["--validation", "1"], "--validation must be in (0, 1), a fraction of the training images"),
        (["data.val_fraction=0.1"], "sslkit-tune holds out data.val_fraction for the trials only: give --validation"),
        (["--validation", "0.1", "data.holdout_classes=[9]"], "cannot be combined with data.holdout_classes"),
    ],
)
def test_what_the_recipe_shows_wrong_is_one_line_before_any_trial(tmp_path, argv, words):
    search = [] if "--search" in argv else ["--search", LR]
    if "method.name=choice:simclr,finetune" in argv:
        argv = [*argv, "--metric", "finetune_top1"]
    result = run_main(tune_cli.main, [QUICKSTART, *search, *argv, "--out", str(tmp_path / "out")])
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_storage_that_cannot_be_reached_is_one_line_and_nothing_is_written(tmp_path):
    with __import__("socket").socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://me:secret@127.0.0.1:{port}/optuna"
    result = run_main(tune_cli.main, [QUICKSTART, "--search", LR, "--storage", url, "--out", str(tmp_path / "out")])
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--storage postgresql://me:***@127.0.0.1:{port}/optuna: cannot open it (" in lines[0]
    assert "secret" not in result.stderr and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- a study's claims


def test_a_study_refuses_another_search_recipe_or_direction_and_takes_another_metric_until_one_is_measured(tmp_path):
    out = tmp_path / "study"
    study = plan_tuning(QUICKSTART, [LR], out=out, overrides=["train.epochs=2"]).open_study(create=True)
    same = plan_tuning(QUICKSTART, [LR], out=out, overrides=["train.epochs=2"])
    same.open_study(create=True)
    minimize = {"direction": "minimize", "pruner": "none"}
    for search, overrides, keywords, words in [
        (["optim.lr=log:1e-4,1e-1"], [], {}, "searches optim.lr=log:0.0001,0.01, this command --search optim.lr="),
        ([LR], ["train.epochs=3"], {}, "was run with train.epochs=2, this command gives train.epochs=3"),
        ([LR], [], minimize, "is to maximize, this command --direction minimize"),
    ]:
        other = plan_tuning(QUICKSTART, search, out=out, overrides=overrides or ["train.epochs=2"], **keywords)
        with pytest.raises(UserError) as error:
            other.open_study(create=True)
        assert str(error.value).startswith(f"study 'study' in {out / 'study.journal'} {words}")
        assert str(error.value).endswith("; give the same, or another --out (or --study) for a new study")
    linear = plan_tuning(QUICKSTART, [LR], out=out, metric="linear_top1", overrides=["train.epochs=2"])
    assert linear.open_study(create=True).user_attrs["metric"] == "linear_top1"  # nothing measured yet
    distribution = {"optim.lr": FloatDistribution(1e-4, 1e-2, log=True)}
    study.add_trial(create_trial(params={"optim.lr": 1e-3}, distributions=distribution, value=0.5))
    with pytest.raises(UserError, match="measured its trials by linear_top1, this command --metric knn_top1"):
        same.open_study(create=True)


# --------------------------------------------------------------------------- what a dead worker leaves

HOLD_A_TRIAL = """
import subprocess, sys, time
import optuna
from optuna.storages.journal import JournalFileBackend
from sslkit.experiments import tune_storage
out, then = sys.argv[1], sys.argv[2]
storage = optuna.storages.JournalStorage(JournalFileBackend(out + "/study.journal"))
study = optuna.load_study(study_name="s", storage=storage)
trial = study.ask({"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
lock = tune_storage.take_lock(tune_storage.Path(out), "trial-0000")
trial.set_user_attr("run", "trial-0000")
orphan = None
if then == "orphan":  # as a trial's run: it inherits the lock, and outlives this process
    orphan = subprocess.Popen(["sleep", "60"], pass_fds=(lock,), start_new_session=True).pid
print("holding", orphan, flush=True)
time.sleep(60)
"""


def hold_a_trial(out: Path, then: str) -> tuple[subprocess.Popen, int | None]:
    """A process that asks the study in ``out`` for a trial and holds its run's lock, as a worker does; once it
    says so, it sleeps. ``then``: ``orphan``, it has also started a process that inherits the lock, whose pid comes
    second (else None)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_TRIAL, str(out), then], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    said, orphan = process.stdout.readline().split()
    assert said == "holding"
    return process, None if orphan == "None" else int(orphan)


def kill_9(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_a_trial_whose_worker_was_killed_is_failed_and_retried_once_and_a_live_one_is_left(tmp_path):
    place = tune_storage.Place(tmp_path, None, "s")
    study = optuna.create_study(storage=place.storage(), study_name="s", direction="maximize")
    worker, _ = hold_a_trial(tmp_path, "sleep")
    try:
        assert tune_storage.fail_abandoned(study, place, start_grace_s=0) == []  # alive: its lock is held
    finally:
        kill_9(worker)
    assert tune_storage.fail_abandoned(study, place, start_grace_s=3600) == []  # as young as a trial being started
    assert tune_storage.fail_abandoned(study, place, start_grace_s=0) == [0]
    assert tune_storage.fail_abandoned(study, place, start_grace_s=0) == []  # once
    first, retry = study.get_trials()
    assert first.state == TrialState.FAIL and retry.state == TrialState.WAITING
    assert retry.params == first.params and retry.user_attrs == {"run": "trial-0000"}  # it continues that run
    assert not tune_storage.counted(first)


def test_a_run_that_outlives_its_worker_keeps_its_trial_alive_until_it_ends(tmp_path):
    place = tune_storage.Place(tmp_path, None, "s")
    study = optuna.create_study(storage=place.storage(), study_name="s", direction="maximize")
    worker, orphan = hold_a_trial(tmp_path, "orphan")
    kill_9(worker)
    try:
        assert tune_storage.fail_abandoned(study, place, start_grace_s=0) == []  # the orphan holds the lock
    finally:
        os.kill(orphan, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (failed := tune_storage.fail_abandoned(study, place, start_grace_s=0)) == [] and time.monotonic() < deadline:
        time.sleep(0.2)  # the killed orphan's lock goes once the kernel has reaped it
    assert failed == [0]


WRITES_ITS_METRIC = """
import json, pathlib, sys
result = pathlib.Path(sys.argv[1])
result.parent.mkdir(parents=True, exist_ok=True)
result.write_text(json.dumps({"results": {"trained": {"knn_top1": 0.5}}}))
"""


def test_a_trials_lock_is_held_until_the_study_records_how_it_ended(tmp_path, monkeypatch):
    """Let go when the run ends, the lock would leave a moment in which the trial is RUNNING and its lock free: a
    worker looking for abandoned trials then would fail it and run it again, and its own worker could not record
    its end (two workers whose trials end together)."""
    plan = plan_tuning(QUICKSTART, [LR], out=tmp_path / "study", overrides=["train.epochs=1"])
    study = plan.open_study(create=True)
    (tmp_path / "writes_its_metric.py").write_text(WRITES_ITS_METRIC)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    def quick_job(run: str, values: dict) -> Job:  # a run that ends at once with its metric, for the pretraining
        result = plan.out / "trials" / run / "results.json"
        return Job(run, "writes_its_metric", (str(result),), result)

    monkeypatch.setattr(plan, "trial_job", quick_job)
    objective, held = Objective(plan), []

    def recorded(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:  # once the study has its end
        with tune_storage.lock_if_free(plan.out, "trial-0000") as free:
            held.append((trial.state, not free))

    study.optimize(objective, n_trials=1, callbacks=[recorded])
    assert held == [(TrialState.COMPLETE, True)] and study.trials[0].value == 0.5
    objective.release()
    assert tune_storage.fail_abandoned(study, plan.place, start_grace_s=0) == []
    with tune_storage.lock_if_free(plan.out, "trial-0000") as free:
        assert free


# --------------------------------------------------------------------------- a run's epochs


def test_the_epochs_of_a_growing_metrics_file_are_read_once_each_and_again_after_it_is_cut(tmp_path):
    path, values = tmp_path / "metrics.jsonl", EpochValues(tmp_path / "metrics.jsonl")
    assert values.new() == []  # not there yet
    lines = [
        {"step": 1, "epoch": 0, "loss": 5.0},
        {"step": 22, "epoch": 1, "knn_top1": 0.5},
        {"step": 44, "epoch": 2, "knn_top1": 0.6},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 50, "epo')
    assert values.new() == [(1, 0.5), (2, 0.6)] and values.last_epoch == 2
    with open(path, "a") as file:
        file.write('ch": 2, "loss": 4.0}\n{"step": 66, "epoch": 3, "final_knn_top1": 0.7}\n')
    assert values.new() == [] and values.last_epoch == 3
    path.write_text(json.dumps(lines[1]) + "\n")  # a resumed run cut it back to its checkpoint
    assert values.new() == [(1, 0.5)]


# --------------------------------------------------------------------------- the end of a study


def finished_study(tmp_path: Path, search: list[str], trials: list[dict], **options):
    """A plan of ``search`` on the quick start (30 epochs) and its study, holding ``trials`` (create_trial's
    keywords, the distributions the plan's)."""
    plan = plan_tuning(QUICKSTART, search, trials=len(trials), out=tmp_path / "tuned", **options)
    study = plan.open_study(create=True)
    distributions = {
        space.key: FloatDistribution(space.low, space.high, log=space.kind == "log") for space in plan.spaces
    }
    for keywords in trials:
        study.add_trial(create_trial(distributions=distributions, **keywords))
    return plan, study


def test_with_a_validation_split_the_trials_hold_it_out_and_the_best_recipe_does_not(tmp_path):
    plan, study = finished_study(tmp_path, [LR], [{"params": {"optim.lr": 2e-3}, "value": 0.9}], validation=0.2)
    trial = plan.trial_job("trial-0000", {"optim.lr": 2e-3}).argv
    assert trial.index("data.val_fraction=0.2") < trial.index("optim.lr=0.002")
    tune_report.write_best_recipe(plan, study.best_trial, plan.out / "best.yaml")
    best = plan.out / "best.yaml"
    assert load_config(best).data.val_fraction is None and load_config(best).optim.lr == 2e-3
    assert "measured on data.val_fraction=0.2 of the training images" in best.read_text()
    assert tune_report.conclude(study, plan, {}).tables[0].title.endswith("knn_top1 on data.val_fraction=0.2")
    other = plan_tuning(QUICKSTART, [LR], trials=1, out=tmp_path / "tuned")  # the same study, on the test split
    with pytest.raises(UserError, match="was run with data.val_fraction=0.2, this command gives data.val_fraction"):
        other.open_study(create=True)


def test_the_end_of_a_study_tabulates_its_trials_writes_the_best_recipe_and_draws_it(tmp_path):
    cost, diverged = {"wall_s": 100.0, "cpu_s": 60.0}, "loss became nan at step 3"
    plan, study = finished_study(
        tmp_path,
        [LR],
        [
            {"params": {"optim.lr": 1e-3}, "value": 0.80, "user_attrs": {**cost, "run": "trial-0000", "epochs": 30},
             "intermediate_values": {10: 0.7, 20: 0.75}},
            {"params": {"optim.lr": 4e-3}, "value": 0.85, "user_attrs": {**cost, "run": "trial-0001", "epochs": 30},
             "intermediate_values": {10: 0.72, 20: 0.8}},
            {"params": {"optim.lr": 1e-4}, "state": TrialState.PRUNED, "user_attrs": {**cost, "epochs": 10},
             "intermediate_values": {10: 0.4}},
            {"params": {"optim.lr": 9e-3}, "state": TrialState.FAIL, "user_attrs": {**cost, "error": diverged}},
            {"params": {"optim.lr": 2e-3}, "state": TrialState.FAIL, "user_attrs": {"run": "trial-0004"}},
        ],
    )  # fmt: skip
    plan.trials = 4  # the stopped trial does not count: its retry would
    outcome = tune_report.conclude(study, plan, {})
    notes = [note.plain for note in outcome.notes]
    assert outcome.exit_status == 0, notes
    # Pruned after 10 of 30 epochs at 60 CPU-s: 2 x 60 s more to its end.
    assert (
        notes[0]
        == "5 trials: 2 complete, 1 pruned, 1 failed, 1 stopped and retried; pruning saved about 2.0 CPU-minutes"
    )
    table = outcome.tables[0]
    assert [cell for cell in table.columns[0]._cells] == ["1", "0"] and table.columns[2]._cells == ["0.8500", "0.8000"]
    rows = read_csv(plan.out / "trials.csv")
    assert [row["state"] for row in rows] == [
        "complete",
        "complete",
        "pruned at epoch 10",
        "failed",
        "stopped, retried",
    ]
    assert rows[3]["error"] == diverged and rows[1]["run_dir"] == str(plan.out / "trials" / "trial-0001")
    assert json.loads((plan.out / "results.json").read_text())["best"] == {
        "number": 1,
        "value": 0.85,
        "values": {"optim.lr": 4e-3},
    }
    best = load_config(plan.out / "best.yaml")
    assert best.optim.lr == 4e-3 and best.run.name == "quickstart-tuned" and best.train.epochs == 30
    for name in ("history.png", "values.png", "curves.png"):
        assert (plan.out / name).read_bytes()[:8] == PNG_MAGIC, name
    assert not (plan.out / "importance.png").exists()  # one key explains everything there is to explain


@pytest.mark.slow  # fANOVA's forest: seconds
def test_with_two_keys_the_importance_of_each_is_drawn(tmp_path):
    values = [(1e-3, 0.1, 0.80), (4e-3, 0.2, 0.85), (1e-4, 0.3, 0.60), (5e-4, 0.15, 0.7)]
    plan, study = finished_study(
        tmp_path,
        [LR, "optim.weight_decay=uniform:0.05,0.5"],
        [{"params": {"optim.lr": lr, "optim.weight_decay": wd}, "value": value} for lr, wd, value in values],
    )
    outcome = tune_report.conclude(study, plan, {})
    assert outcome.exit_status == 0 and (plan.out / "importance.png").read_bytes()[:8] == PNG_MAGIC
    assert yaml.safe_load((plan.out / "best.yaml").read_text())["optim"] == {
        **yaml.safe_load(Path(QUICKSTART).read_text())["optim"], "lr": 4e-3, "weight_decay": 0.2
    }  # fmt: skip


def test_a_study_without_a_complete_trial_or_with_a_failed_worker_ends_with_status_1(tmp_path):
    plan, study = finished_study(
        tmp_path, [LR], [{"params": {"optim.lr": 9e-3}, "state": TrialState.FAIL, "user_attrs": {"error": "nan"}}]
    )
    outcome = tune_report.conclude(study, plan, {"worker-1": "killed by SIGKILL"})
    notes = [note.plain for note in outcome.notes]
    assert outcome.exit_status == 1 and not outcome.tables and not (plan.out / "best.yaml").exists()
    assert f"worker-1 failed: killed by SIGKILL (log: {plan.out / 'logs' / 'worker-1'}.err)" in notes
    assert notes[-1].startswith("no trial completed")
