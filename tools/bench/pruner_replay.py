"""A finished sslkit-tune study's pruning replayed under two median rules: Optuna's, which compares trials at the same
epoch, and sslkit's ``--pruner median``, at the same fraction of their schedules (``sslkit.experiments.tune_pruner``).

Each trial's own reports are played back epoch by epoch against the trials that had finished when it started
(what its pruner saw, but for those that finished while it ran); the table says where each rule stops it.

    python tools/bench/pruner_replay.py runs/tune-fixmatch
    python tools/bench/pruner_replay.py runs/tune-scratch --epochs 300     # the recipe's length, where not searched
"""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState, create_trial
from rich.console import Console
from rich.table import Table

from sslkit.experiments.tune_pruner import ScheduleMedianPruner


def pruned_at(pruner: optuna.pruners.BasePruner, seen: optuna.Study, trial: FrozenTrial) -> int | None:
    """The first of ``trial``'s reported epochs at which ``pruner`` stops it, against the finished trials of
    ``seen``; None: never."""
    for epoch in sorted(trial.intermediate_values):
        so_far = {e: v for e, v in trial.intermediate_values.items() if e <= epoch}
        partial = create_trial(
            state=TrialState.RUNNING,
            params=trial.params,
            distributions=trial.distributions,
            intermediate_values=so_far,
        )
        if pruner.prune(seen, partial):
            return epoch
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="an sslkit-tune output folder (its study.journal)")
    parser.add_argument("--epochs", type=int, default=5, help="a trial's length where train.epochs is not searched")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(args.study / "study.journal")))
    (name,) = optuna.get_all_study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).get_trials()
    length = lambda trial: trial.params.get("train.epochs", args.epochs)  # noqa: E731
    rules = {
        "same epoch (Optuna)": optuna.pruners.MedianPruner(),
        "same fraction (sslkit)": ScheduleMedianPruner(length),
    }
    table = Table(title=f"{name}: where each median rule stops a trial")
    for column in ("trial", "epochs", "state", "value", *rules):
        table.add_column(column, justify="right")
    agree = replayed = 0
    for trial in trials:
        if not trial.intermediate_values:
            continue
        seen = optuna.create_study(direction="maximize")
        for other in trials:
            if other.state == TrialState.COMPLETE and other.datetime_complete < trial.datetime_start:
                seen.add_trial(other)
        stops = [pruned_at(pruner, seen, trial) for pruner in rules.values()]
        replayed, agree = replayed + 1, agree + (stops[0] == stops[1])
        value = "" if trial.value is None else f"{trial.value:.4f}"
        shown = ["-" if stop is None else f"epoch {stop}" for stop in stops]
        table.add_row(str(trial.number), str(length(trial)), trial.state.name.lower(), value, *shown)
    console = Console()
    console.print(table)
    console.print(f"{agree} of {replayed} trials: the same decision under both rules")


if __name__ == "__main__":
    main()
