"""``--pruner median``: Optuna's median rule at the same fraction of each trial's schedule."""

from __future__ import annotations

import math
import random

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from sslkit.experiments.tune import plan_tuning
from sslkit.experiments.tune_pruner import ScheduleMedianPruner

optuna.logging.set_verbosity(optuna.logging.WARNING)
EPOCHS = {"train.epochs": IntDistribution(1, 40)}


def study_of(trials: list[dict]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for keywords in trials:
        study.add_trial(create_trial(**keywords))
    return study


def running(values: dict[int, float], **params) -> optuna.trial.FrozenTrial:
    distributions = {key: EPOCHS[key] for key in params}
    return create_trial(
        state=TrialState.RUNNING, intermediate_values=values, params=params, distributions=distributions
    )


@pytest.mark.parametrize("seed", range(20))
def test_with_trials_of_one_length_it_decides_as_optunas_median_pruner(seed):
    draw = random.Random(seed)
    epochs = [2, 4, 6, 8, 10]
    finished = [
        {"value": draw.random(), "intermediate_values": {e: draw.random() for e in epochs[: draw.randint(1, 5)]}}
        for _ in range(draw.randint(3, 9))
    ]
    study = study_of(finished)
    ours, optunas = ScheduleMedianPruner(lambda trial: 10), optuna.pruners.MedianPruner()
    for _ in range(30):
        reported = {e: draw.random() for e in epochs[: draw.randint(1, 5)]}
        if draw.random() < 0.1:
            reported[max(reported)] = math.nan
        trial = running(reported)
        assert ours.prune(study, trial) == optunas.prune(study, trial), (finished, reported)


def short_trials(count: int = 5) -> list[dict]:
    """5-epoch trials: their learning rate has decayed by epoch 5, their kNN 0.60, 0.70, ... 0.80 there."""
    values = {1: 0.60, 2: 0.70, 3: 0.75, 4: 0.78, 5: 0.80}
    return [
        {"value": 0.8, "params": {"train.epochs": 5}, "distributions": EPOCHS, "intermediate_values": values}
        for _ in range(count)
    ]


def test_a_long_trial_is_compared_with_short_ones_at_the_same_fraction_of_its_schedule():
    study = study_of(short_trials())
    ours = ScheduleMedianPruner(lambda trial: trial.params.get("train.epochs", 5))
    optunas = optuna.pruners.MedianPruner()
    early = running({1: 0.50}, **{"train.epochs": 20})  # 5% of its schedule: before any short trial reported
    assert optunas.prune(study, early) and not ours.prune(study, early)
    # At epoch 4 of 20 (20%) the short trials were at epoch 1 (0.60); at 8 of 20, at epoch 2 (0.70).
    assert not ours.prune(study, running({1: 0.50, 2: 0.55, 3: 0.58, 4: 0.62}, **{"train.epochs": 20}))
    assert ours.prune(study, running({4: 0.59}, **{"train.epochs": 20}))
    assert ours.prune(study, running({4: 0.62, 8: 0.68}, **{"train.epochs": 20}))
    # Between the epochs a trial reported, linear: 6 of 20 is epoch 1.5 of 5, 0.65.
    assert not ours.prune(study, running({6: 0.66}, **{"train.epochs": 20}))
    assert ours.prune(study, running({6: 0.64}, **{"train.epochs": 20}))


def test_nothing_is_pruned_before_five_trials_finish():
    ours = ScheduleMedianPruner(lambda trial: trial.params["train.epochs"])
    assert not ours.prune(study_of(short_trials(4)), running({1: 0.1}, **{"train.epochs": 5}))
    assert ours.prune(study_of(short_trials(5)), running({1: 0.1}, **{"train.epochs": 5}))


def test_the_plans_median_pruner_reads_a_searched_length_or_the_recipes(tmp_path):
    searched = plan_tuning("quickstart", ["train.epochs=int:5,20"], out=tmp_path / "a").new_pruner()
    fixed = plan_tuning("quickstart", ["optim.lr=log:1e-4,1e-2"], out=tmp_path / "b").new_pruner()
    assert isinstance(searched, ScheduleMedianPruner) and isinstance(fixed, ScheduleMedianPruner)
    assert searched.epochs_of(running({1: 0.5}, **{"train.epochs": 20})) == 20
    lr = create_trial(
        state=TrialState.RUNNING, params={"optim.lr": 1e-3}, distributions={"optim.lr": FloatDistribution(1e-4, 1)}
    )
    assert fixed.epochs_of(lr) == 30  # the quick start's train.epochs
