"""What a study of ``sslkit-tune`` leaves: a line per trial, the table of the best, the best recipe, the plots.

At its end the command writes into OUT:

- ``trials.csv`` and ``results.json``: every trial, its values, how it ended (complete, pruned at an epoch,
  failed with its run's error line, stopped and retried), its metric, the epochs it trained, its wall and CPU
  seconds (every attempt together), and its run directory;
- ``best.yaml``: the recipe with the overrides and the best trial's values, named ``<run.name>-tuned``, which
  ``sslkit-pretrain best.yaml`` trains;
- ``history.png``: each complete trial's metric in the order they were made, and the best so far;
- ``values.png``: each complete trial's metric against its value of each searched key;
- ``curves.png``: each trial's online kNN top-1 by epoch, the pruned ones stopping where the pruner stopped them;
- ``importance.png``: how much of the metric's variation each searched key explains (Optuna's fANOVA
  evaluator), with two keys searched or more, once two trials or more are complete.

Pruning's saving is counted in CPU time: a trial pruned after e of its E epochs would have cost about E / e times
what it did, so it saved about (E / e - 1) times its CPU seconds (the final evaluation it skipped is not counted).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import yaml
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sslkit.config import replace_recipe_labels, replace_recipe_loss
from sslkit.experiments.experiment import Outcome
from sslkit.experiments.report import PLOT_HINT, new_figure
from sslkit.experiments.tables import csv_number, save_plot, write_csv, write_json
from sslkit.experiments.tune_space import override_value
from sslkit.experiments.tune_storage import ERROR_ATTR, RUN_ATTR, counted
from sslkit.files import written_whole
from sslkit.schema import apply_overrides, read_yaml

if TYPE_CHECKING:
    from sslkit.experiments.tune_plan import Plan

SHOWN_BEST = 5  # rows of the terminal table


def state_text(trial: FrozenTrial) -> str:
    """How a trial ended, in a word or three."""
    if trial.state == TrialState.PRUNED:
        return f"pruned at epoch {last_epoch(trial)}"
    if trial.state == TrialState.FAIL:
        return "failed" if ERROR_ATTR in trial.user_attrs else "stopped, retried"
    return {TrialState.COMPLETE: "complete", TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}[trial.state]


def last_epoch(trial: FrozenTrial) -> int | None:
    """The last epoch whose online kNN the trial reported (None: none)."""
    return max(trial.intermediate_values, default=None)


def values_text(trial: FrozenTrial) -> str:
    """``optim.lr=0.00123, train.epochs=20``: a trial's values, four significant digits."""
    return ", ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in trial.params.items()
    )


def trial_line(trial: FrozenTrial, plan: Plan) -> str:
    """One finished trial, as the command prints it."""
    head = f"trial {trial.number}: {values_text(trial)}"
    cost = trial.user_attrs.get("wall_s")
    after = "" if cost is None else f" after {cost:.0f} s"
    if trial.state == TrialState.COMPLETE:
        return f"{head} -> {plan.metric} {trial.value:.4f} ({trial.user_attrs.get('epochs', '?')} epochs{after})"
    if trial.state == TrialState.PRUNED:
        epoch = last_epoch(trial)
        knn = "" if epoch is None else f", kNN top-1 {trial.intermediate_values[epoch]:.4f}"
        return f"{head}: {state_text(trial)}{knn}{after}"
    if ERROR_ATTR in trial.user_attrs:
        return f"{head}: failed{after}: {trial.user_attrs[ERROR_ATTR]}"
    return f"{head}: stopped before its run ended; retried, continuing its run"


def record(trial: FrozenTrial, plan: Plan) -> dict[str, Any]:
    """A trial as ``results.json`` and ``trials.csv`` hold it."""
    return {
        "number": trial.number,
        "state": state_text(trial),
        "values": trial.params,
        "value": trial.value,
        "epochs": trial.user_attrs.get("epochs"),
        "wall_s": trial.user_attrs.get("wall_s"),
        "cpu_s": trial.user_attrs.get("cpu_s"),
        "error": trial.user_attrs.get(ERROR_ATTR),
        "run_dir": str(plan.out / "trials" / trial.user_attrs[RUN_ATTR]) if RUN_ATTR in trial.user_attrs else None,
        "knn_by_epoch": {str(epoch): value for epoch, value in sorted(trial.intermediate_values.items())},
    }


def ranked(trials: list[FrozenTrial], direction: StudyDirection) -> list[FrozenTrial]:
    """The complete trials, best first (the earlier of two equal ones first)."""
    sign = -1 if direction == StudyDirection.MAXIMIZE else 1
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    return sorted(complete, key=lambda trial: (sign * trial.value, trial.number))


def best_table(best: list[FrozenTrial], plan: Plan) -> Table:
    """The best complete trials: their values, metric, epochs and cost."""
    measured = "" if plan.validation is None else f" on data.val_fraction={plan.validation}"
    table = Table(title=f"best trials of {plan.place.name}: {plan.direction} {plan.metric}{measured}")
    table.add_column("trial", justify="right")
    for space in plan.spaces:
        table.add_column(space.key, justify="right")
    for column in (plan.metric, "epochs", "minutes", "CPU-min"):
        table.add_column(column, justify="right")
    for trial in best[:SHOWN_BEST]:
        minutes = [trial.user_attrs.get(key) for key in ("wall_s", "cpu_s")]
        table.add_row(
            str(trial.number),
            *(
                escape(
                    f"{trial.params[space.key]:.4g}"
                    if space.kind in ("log", "uniform")
                    else str(trial.params[space.key])
                )
                for space in plan.spaces
            ),
            f"{trial.value:.4f}",
            str(trial.user_attrs.get("epochs", "")),
            *("" if seconds is None else f"{seconds / 60:.1f}" for seconds in minutes),
        )
    return table


def pruning_saved(trials: list[FrozenTrial], plan: Plan) -> float:
    """The CPU seconds the pruned trials would have cost more, run to their end (see the module's docstring)."""
    saved = 0.0
    for trial in trials:
        epoch, cpu = last_epoch(trial), trial.user_attrs.get("cpu_s")
        if trial.state == TrialState.PRUNED and epoch and cpu is not None:
            epochs = trial.params.get("train.epochs", plan.epochs)
            saved += cpu * max(0.0, epochs / epoch - 1)
    return saved


def write_best_recipe(plan: Plan, trial: FrozenTrial, path: Path) -> None:
    """The recipe with the command's overrides and ``trial``'s values, as a recipe file: the command line's
    loss and labelled subset replace the recipe's as they do for a run (:func:`sslkit.config.load_config`)."""
    raw = read_yaml(plan.recipe)
    given = [*plan.overrides, *(f"{key}={override_value(value)}" for key, value in trial.params.items())]
    merged = apply_overrides(raw, given)
    replace_recipe_loss(raw, merged, given)
    replace_recipe_labels(merged, given)
    run = merged.setdefault("run", {})
    run["name"] = f"{run.get('name') or plan.recipe.stem}-tuned"
    header = (
        f"# The best trial of {plan.place.name} (sslkit-tune): trial {trial.number}, {plan.metric} {trial.value:.4f}\n"
        f"# {plan.recipe.name} with {' '.join(given)}\n"
    )
    if plan.validation is not None:
        header += (
            f"# The trials were measured on data.val_fraction={plan.validation} of the training images, held out; "
            f"this recipe trains on them all and measures on the test split\n"
        )
    text = header + yaml.safe_dump(merged, sort_keys=False)
    with written_whole(path) as tmp:  # a recipe sslkit-pretrain may be reading: the old one or the new, whole
        tmp.write_text(text)


def write_tables(trials: list[FrozenTrial], plan: Plan, best: FrozenTrial | None) -> None:
    """``trials.csv`` and ``results.json``: every trial."""
    records = [record(trial, plan) for trial in trials]
    keys = [space.key for space in plan.spaces]
    write_csv(
        plan.out / "trials.csv",
        ["trial", "state", *keys, plan.metric, "epochs", "wall_s", "cpu_s", "error", "run_dir"],
        (
            [
                r["number"],
                r["state"],
                *(r["values"].get(key, "") for key in keys),
                csv_number(r["value"]),
                r["epochs"] if r["epochs"] is not None else "",
                *("" if r[key] is None else f"{r[key]:.1f}" for key in ("wall_s", "cpu_s")),
                r["error"] or "",
                r["run_dir"] or "",
            ]
            for r in records
        ),
    )
    header = {
        "study": plan.place.name,
        "storage": plan.place.shown(),
        "recipe": str(plan.recipe),
        "overrides": plan.overrides,
        "search": {space.key: space.text() for space in plan.spaces},
        "metric": plan.metric,
        "direction": plan.direction,
        "sampler": plan.sampler,
        "pruner": plan.pruner,
        "seed": plan.seed,
        "best": None if best is None else {"number": best.number, "value": best.value, "values": best.params},
    }
    write_json(plan.out / "results.json", {**header, "trials": records})


def plot_history(trials: list[FrozenTrial], plan: Plan, path: Path) -> bool:
    """``history.png``: each complete trial's metric by trial number, and the best so far; whether it was drawn."""
    figure = new_figure(6.5, 4.2)
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    if figure is None or not complete:
        return False
    axes = figure.axes[0]
    better = max if plan.direction == "maximize" else min
    best, so_far = [], None
    for trial in complete:
        so_far = trial.value if so_far is None else better(so_far, trial.value)
        best.append(so_far)
    numbers = [trial.number for trial in complete]
    axes.plot(numbers, [trial.value for trial in complete], "o", label="complete trial")
    axes.step(numbers, best, where="post", color="C1", label="best so far")
    others = {text: sum(state_text(t).startswith(text) for t in trials) for text in ("pruned", "failed")}
    axes.set_xlabel("trial")
    axes.set_ylabel(plan.metric)
    axes.xaxis.get_major_locator().set_params(integer=True)
    shown = ", ".join(f"{count} {text}" for text, count in others.items() if count)
    title = f"{plan.metric} of each complete trial" + (f" ({shown}: not drawn)" if shown else "")
    save_plot(figure, title, 1, path)
    return True


def plot_values(trials: list[FrozenTrial], plan: Plan, path: Path) -> bool:
    """``values.png``: each complete trial's metric against its value of each searched key, a panel per key (a log
    axis for a log space); whether it was drawn."""
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    figure = new_figure(2.0 + 3.5 * len(plan.spaces), 4.2, panels=len(plan.spaces))
    if figure is None or not complete:
        return False
    for axes, space in zip(figure.axes, plan.spaces):
        values = [trial.params[space.key] for trial in complete]
        axes.plot(values, [trial.value for trial in complete], "o")
        if space.kind == "log":
            axes.set_xscale("log")
        elif space.kind == "int":
            axes.xaxis.get_major_locator().set_params(integer=True)
        axes.set_xlabel(space.key)
    figure.axes[0].set_ylabel(plan.metric)
    save_plot(figure, f"{plan.metric} against the searched values, {len(complete)} complete trials", 1, path, False)
    return True


def plot_curves(trials: list[FrozenTrial], path: Path) -> bool:
    """``curves.png``: each trial's online kNN top-1 by epoch (pruned trials dashed; a stopped trial is drawn as its
    retry); whether it was drawn."""
    figure = new_figure(6.5, 4.2)
    reported = [trial for trial in trials if trial.intermediate_values and counted(trial)]
    if figure is None or not reported:
        return False
    axes = figure.axes[0]
    for trial in reported:
        epochs = sorted(trial.intermediate_values)
        pruned = trial.state == TrialState.PRUNED
        axes.plot(
            epochs,
            [trial.intermediate_values[e] for e in epochs],
            "--x" if pruned else "-o",
            color="0.6" if pruned else None,
            markersize=4,
            label=f"trial {trial.number}" + (" (pruned)" if pruned else ""),
        )
    axes.set_xlabel("epoch")
    axes.set_ylabel("online kNN top-1")
    axes.xaxis.get_major_locator().set_params(integer=True)
    save_plot(figure, "online kNN top-1 of each trial", 1, path, legend=len(reported) <= 12)
    return True


def plot_importance(study: optuna.Study, plan: Plan, path: Path) -> bool:
    """``importance.png``: each searched key's share of the metric's variation (fANOVA); whether it was drawn
    (two keys searched or more, two complete trials or more, and a variation to explain)."""
    figure = new_figure(6.5, 1.5 + 0.5 * len(plan.spaces))
    if figure is None or len(plan.spaces) < 2:  # one key explains all the variation there is
        return False
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=plan.seed)
    try:
        importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ValueError, RuntimeError):  # fewer than two complete trials, or every value the same
        return False
    if not importances or any(math.isnan(value) for value in importances.values()):
        return False
    keys = list(importances)[::-1]  # the most important at the top
    axes = figure.axes[0]
    axes.barh(keys, [importances[key] for key in keys], color="C0")
    axes.set_xlabel(f"share of the variation of {plan.metric} (fANOVA)")
    axes.set_xlim(0, 1)
    complete = sum(trial.state == TrialState.COMPLETE for trial in study.get_trials(deepcopy=False))
    save_plot(figure, f"importance of the searched keys, {complete} complete trials", 1, path, legend=False)
    return True


def conclude(study: optuna.Study, plan: Plan, failures: dict[str, str]) -> Outcome:
    """Write the study's tables, best recipe and plots; its table of the best trials, where the results are, and
    the exit status (0: the study holds its trials and one completed; 1: otherwise, or a worker failed)."""
    trials = study.get_trials(deepcopy=False)
    best = ranked(trials, study.direction)
    write_tables(trials, plan, best[0] if best else None)
    out, notes = plan.out, []
    counts = {
        text: sum(state_text(trial).startswith(text) for trial in trials) for text in ("complete", "pruned", "failed")
    }
    stopped = sum(state_text(trial).startswith("stopped") for trial in trials)
    summary = f"{len(trials)} trials: " + ", ".join(f"{count} {text}" for text, count in counts.items())
    summary += f", {stopped} stopped and retried" if stopped else ""
    if counts["pruned"]:
        summary += f"; pruning saved about {pruning_saved(trials, plan) / 60:.1f} CPU-minutes"
    notes.append(Text(summary))
    if best:
        write_best_recipe(plan, best[0], out / "best.yaml")
        notes.append(Text(f"best recipe: {out / 'best.yaml'} (sslkit-pretrain {out / 'best.yaml'} trains it)"))
    drawn = [
        name
        for name, draw in (
            ("history.png", lambda path: plot_history(trials, plan, path)),
            ("values.png", lambda path: plot_values(trials, plan, path)),
            ("curves.png", lambda path: plot_curves(trials, path)),
            ("importance.png", lambda path: plot_importance(study, plan, path)),
        )
        if draw(out / name)
    ]
    plots = f"; plots: {', '.join(str(out / name) for name in drawn)}" if drawn else ""
    if new_figure() is None:
        plots = f"; no plots ({PLOT_HINT})"
    notes.append(Text(f"results: {out / 'trials.csv'}, {out / 'results.json'}{plots}"))
    for worker, error in failures.items():
        notes.append(
            Text.from_markup(
                f"[red]{escape(worker)} failed[/]: {escape(error)} (log: {escape(str(out / 'logs' / worker))}.err)"
            )
        )
    tried = sum(counts.values())
    if tried < plan.trials and not failures:
        notes.append(Text(f"{tried} of {plan.trials} trials tried; the same command continues the study"))
    status = 0 if best and not failures and tried >= plan.trials else 1
    if not best:
        notes.append(
            Text.from_markup("[red]no trial completed[/]: the trials' logs are in " + escape(str(out / "logs")))
        )
    records = [record(trial, plan) for trial in trials]
    return Outcome(records, [best_table(best, plan)] if best else [], notes, status)
