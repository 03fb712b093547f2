"""Tune a recipe's settings with Optuna: trials of pretraining runs, pruned on their own online kNN.

    plan = plan_tuning("quickstart", ["optim.lr=log:1e-4,1e-2"], trials=8, workers=2)
    outcome = run_tuning(plan, LocalExecutor(jobs=2))  # its table and notes to show, and the exit status

is ``sslkit-tune quickstart --search optim.lr=log:1e-4,1e-2 --trials 8 --jobs 2`` (:mod:`sslkit.cli.tune`); every
keyword of :func:`plan_tuning` is the option of that name.

A trial is one pretraining run, the user's own command with the trial's values as overrides:

    python -m sslkit.cli.pretrain RECIPE key.sub=value ... optim.lr=0.00123
        run.output_dir=OUT/trials run.name=trial-0007 run.resume=auto

and its value is ``--metric`` from the run's ``results.json`` (``results.trained``). The study is Optuna's
(:mod:`sslkit.experiments.tune_storage`), its values drawn by TPE (``--sampler tpe``, seeded by ``--seed``) or at
random, and its trials run by workers (:mod:`sslkit.experiments.tune_worker`) that the command starts on an
executor, ``--jobs`` of them (each one trial at a time, on its share of the machine); they share the study, and
a worker of another command on another machine (``--storage URL``) joins it alike. A worker watches its run's
``metrics.jsonl``: every epoch's online kNN (``train.knn_every_epochs``) is reported to the trial, and a trial
the pruner stops (``--pruner median``: below the median of the finished trials at the same fraction of their
schedules, :mod:`sslkit.experiments.tune_pruner`) gets the run's stop signal (``train.stop_signals``: it saves
and exits). The pruner compares kNN top-1, which rises as a run
gets better: it needs ``--direction maximize``.

Everything is checked before a trial runs: every space against the recipe (each bound and choice loads as a
config), the metric against what the runs record where that is known from the recipe (a classifier's metric,
the linear probe's), the storage, and a study already there (the same search, metric and recipe). A metric that
only a finished run shows missing stops the study after its first trial, in one line.

OUT holds the study (``study.journal``, without ``--storage``), ``trials/`` (a run directory per trial),
``logs/`` (each worker's and each trial's output) and, at the end: ``trials.csv`` and ``results.json`` (every
trial), ``best.yaml`` (the recipe with the best trial's values, which ``sslkit-pretrain`` takes),
and the plots (:mod:`sslkit.experiments.tune_report`). The command run again continues the study: after Ctrl-C,
and after a kill -9 (a trial its worker left running is retried, continuing its run from its last checkpoint).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import optuna
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sslkit import methods
from sslkit.config import Config, find_recipe, flatten, load_config, to_dict
from sslkit.console import console
from sslkit.errors import UserError
from sslkit.experiments import tune_report
from sslkit.experiments.executor import Executor, Ran
from sslkit.experiments.experiment import Outcome, interrupted
from sslkit.experiments.jobs import Job
from sslkit.experiments.runs import PLACE_KEYS, refuse_reserved
from sslkit.experiments.tune_plan import Plan, validation_overrides
from sslkit.experiments.tune_space import check_metric_name, parse_search
from sslkit.experiments.tune_storage import Place, counted, fail_abandoned

VALIDATION_KEYS = ("data.val_fraction",)  # --validation's: the trials', not best.yaml's
STOPPED_ATTR = "stopped"  # a study attribute: the line that stopped every worker (a metric no run records)
POLL_S = 2.0  # how often the command reads the study for its progress
CLASSIFIER_METRICS = ("finetune_top1", "head_top1")


# --------------------------------------------------------------------------- the plan


def plan_tuning(
    recipe: str | Path,
    search: Sequence[str],
    *,
    metric: str = "knn_top1",
    direction: str = "maximize",
    trials: int = 20,
    workers: int = 1,
    sampler: str = "tpe",
    pruner: str = "median",
    seed: int = 0,
    validation: float | None = None,
    out: str | Path | None = None,
    storage: str | None = None,
    study: str | None = None,
    overrides: Sequence[str] = (),
) -> Plan:
    """The tuning resolved and checked, every extreme of the search loaded as a config, before anything runs.

    Args:
        recipe: a YAML recipe's path or a bundled recipe's name.
        search: ``KEY=SPACE`` each (:mod:`sslkit.experiments.tune_space`).
        metric: what the trials maximize, as the runs' ``results.json`` names it.
        trials: the study's trials, every worker together.
        workers: the workers the command starts (``--jobs``).
        validation: measure the trials on this fraction of the training images held out (``data.val_fraction``),
            not on the test split; ``best.yaml`` leaves it out.
        out: the output directory (default ``<run.output_dir>/tune-<recipe>-<searched keys>``).
        storage: an Optuna RDB URL; None: the journal file ``OUT/study.journal``.
        study: the study's name in the storage (default: the output directory's name).
        overrides: shared by every trial, e.g. ``["train.epochs=10"]``.

    Raises:
        UserError: a space that does not parse or names a key the recipe lacks; a value the config refuses; a
            metric no run of the search records; a pruner with ``--direction minimize``; a bad count.
    """
    overrides = list(overrides)
    for value, least, option in ((trials, 1, "--trials"), (workers, 1, "--jobs")):
        if value < least:
            raise UserError(f"{option} must be at least {least}, got {value}")
    check_metric_name(metric)
    if pruner != "none" and direction != "maximize":
        raise UserError(
            f"--pruner {pruner} compares the trials' online kNN top-1, which a good run raises: it needs --direction "
            "maximize; give --pruner none to minimize"
        )
    if validation is not None and not 0 < validation < 1:
        raise UserError(
            f"--validation must be in (0, 1), a fraction of the training images (e.g. 0.1), got {validation}"
        )
    spaces = parse_search(search)
    keep_out = "sslkit-tune sets {key} for every trial; use --out DIR instead"
    refuse_reserved(overrides, PLACE_KEYS, "override", keep_out)
    refuse_reserved([f"{space.key}={space.text()}" for space in spaces], PLACE_KEYS, "--search", keep_out)
    held_out = "sslkit-tune holds out {key} for the trials only: give --validation F instead"
    refuse_reserved([*overrides, *(f"{s.key}={s.text()}" for s in spaces)], VALIDATION_KEYS, "override", held_out)
    recipe = find_recipe(recipe).resolve()  # the runs get a path
    trial_overrides = [*overrides, *validation_overrides(validation)]
    base = load_config(recipe, trial_overrides)
    refuse_unrecorded(metric, base, "the recipe")
    for space in spaces:
        for override in space.overrides():
            try:
                cfg = load_config(recipe, [*trial_overrides, override])
            except UserError as error:
                raise UserError(f"--search {space.key}={space.text()}: with {override}: {error}") from None
            refuse_unrecorded(metric, cfg, override)
    keys = [space.key for space in spaces]
    out = (Path(out) if out else Path(base.run.output_dir) / "-".join(["tune", recipe.stem, *keys])).resolve()
    shared = {key: value for key, value in flatten(to_dict(base)).items() if key not in (*PLACE_KEYS, *keys)}
    return Plan(
        recipe=recipe,
        overrides=overrides,
        spaces=spaces,
        metric=metric,
        direction=direction,
        trials=trials,
        workers=workers,
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        validation=validation,
        place=Place(out, storage, study or out.name),
        base=json.loads(json.dumps(shared)),  # as the storage gives it back: lists, not tuples
        epochs=base.train.epochs,
        monitor_every=base.train.knn_every_epochs,
        stop_signals=list(base.train.stop_signals),
    )


def refuse_unrecorded(metric: str, cfg: Config, where: str) -> None:
    """A metric that a run of ``cfg`` cannot record, as the recipe shows it: a classifier's top-1 of a method
    without that classifier, the linear probe's without one."""
    own = methods.METHODS[cfg.method.name].classifier_metric
    if metric in CLASSIFIER_METRICS and metric != own:
        has = "no classifier of its own" if own is None else f"its classifier's top-1 as {own}"
        why = f"method.name={cfg.method.name} records {has}"
    elif metric.startswith("linear_") and cfg.eval.linear_epochs == 0:
        why = "eval.linear_epochs=0 trains no linear probe"
    else:
        return
    raise UserError(f"--metric {metric}: no run records it ({why}, with {where}); choose another --metric")


# --------------------------------------------------------------------------- the study


def run_tuning(plan: Plan, executor: Executor) -> Outcome:
    """Create (or continue) the study, run its workers on ``executor`` until it holds ``plan.trials`` trials, and
    write its tables, best recipe and plots; the progress shows as it goes, a line per trial.

    Returns:
        The outcome: the table of the best trials, where the results are, and the exit status (0 when the study
        is complete, 1 when a worker failed or no trial completed, 130 when interrupted).

    Raises:
        UserError: the storage or the study refused (:meth:`Plan.open_study`), or a metric that the first trials
            showed no run records.
    """
    study = plan.open_study(create=True)
    study.set_user_attr(STOPPED_ATTR, None)
    retried = fail_abandoned(study, plan.place)
    done = sum(map(counted, study.get_trials(deepcopy=False)))
    workers = min(plan.workers, max(0, plan.trials - done))
    console.print(intro(plan, done, workers, retried), markup=False, highlight=False, soft_wrap=True)
    failures: dict[str, str] = {}
    if workers:

        def ended(job: Job, ran: Ran | None) -> bool:
            if ran is None or ran.status != 0:
                failures[job.name] = "not started" if ran is None else ran.error or f"exit status {ran.status}"
            return ran is not None and ran.status == 0

        try:
            with Watch(plan, study):
                # A worker's cost is its trials' (tune_report): nothing to keep of a stopped one here.
                executor.run(plan.worker_jobs(workers), plan.out / "logs", lambda job: None, ended, lambda *_: None)
        except KeyboardInterrupt:
            console.print(
                f"interrupted: the same command continues the study (stopped trials are retried, each from its "
                f"run's last checkpoint); results so far in {plan.out}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            return interrupted()
    if stopped := study.user_attrs.get(STOPPED_ATTR):
        raise UserError(stopped)
    return tune_report.conclude(study, plan, failures)


def intro(plan: Plan, done: int, workers: int, retried: list[int]) -> str:
    """The line before the first trial: what is tuned, how, where, and how far the study is."""
    searched = ", ".join(f"{space.key}={space.text()}" for space in plan.spaces)
    line = (
        f"tuning {plan.recipe.name}: {searched}; {plan.direction} {plan.metric}"
        + ("" if plan.validation is None else f" on data.val_fraction={plan.validation} of the training images")
        + f", {plan.sampler} sampler, {plan.pruner} pruner; study '{plan.place.name}' in {plan.place.shown()}"
    )
    line += f"; {done} of {plan.trials} trials done" if done else f"; {plan.trials} trials"
    if workers:
        line += f", {workers} worker{'s' if workers > 1 else ''}"
    searched = {space.key for space in plan.spaces}
    if plan.pruner != "none" and plan.monitor_every == 0 and "train.knn_every_epochs" not in searched:
        line += "\nno trial is pruned: its runs measure no online kNN (train.knn_every_epochs=0; set it to prune)"
    if retried:
        numbers = ", ".join(map(str, retried))
        line += f"\ntrial{'s' if len(retried) > 1 else ''} {numbers} left running by a stopped worker: retried"
    return line


class Watch:
    """While the workers run: a progress bar of the study's counted trials and a line per trial as it ends, read
    from the storage every :data:`POLL_S` seconds by a thread of its own."""

    def __init__(self, plan: Plan, study: optuna.Study) -> None:
        self.plan, self.study = plan, study
        self.seen = {trial.number for trial in study.get_trials(deepcopy=False) if trial.state.is_finished()}
        self.progress = Progress(
            TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        )
        done = sum(map(counted, study.get_trials(deepcopy=False)))
        self.task = self.progress.add_task("trials", total=plan.trials, completed=done)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, name="tune-progress", daemon=True)

    def __enter__(self) -> Watch:
        self.progress.start()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.read()
        self.progress.stop()

    def watch(self) -> None:
        while not self.stop.wait(POLL_S):
            self.read()

    def read(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        for trial in trials:
            if trial.state.is_finished() and trial.number not in self.seen:
                self.seen.add(trial.number)
                line = tune_report.trial_line(trial, self.plan)
                self.progress.console.print(escape(line), highlight=False, soft_wrap=True)
        self.progress.update(self.task, completed=min(self.plan.trials, sum(map(counted, trials))))
