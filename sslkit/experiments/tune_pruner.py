"""``--pruner median``: Optuna's median rule, at the same fraction of every trial's schedule.

A trial reports its online kNN top-1 by epoch. Optuna's :class:`~optuna.pruners.MedianPruner` compares a trial at
epoch ``e`` with the finished trials at epoch ``e``. Where ``train.epochs`` is searched, that compares a long trial
early in its schedule with short trials that have already decayed their learning rate there, and their kNN is
higher: long trials are pruned at their first epochs whatever they would have reached. This rule compares at the
same *fraction* of the schedules instead: trial ``t`` of ``E_t`` epochs at epoch ``e`` against each finished trial
``u`` at epoch ``e E_u / E_t`` (linear between the epochs ``u`` reported; ``u`` is left out where that falls
outside them). Otherwise it is Optuna's rule, and with every trial of one length its decisions are Optuna's:

    prune(t) = best_{s <= e} v_t(s) < median_u v_u(e E_u / E_t),  once ``startup`` trials have finished

(NaN values are left out; a trial that reported nothing else is pruned). Written here because Optuna's pruners
key a trial's values by step alone, and the step a schedule's fraction falls on differs from trial to trial.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

STARTUP_TRIALS = 5  # as Optuna's MedianPruner: no pruning before 5 trials have finished


class ScheduleMedianPruner(optuna.pruners.BasePruner):
    """Prune a trial whose best value so far is below the finished trials' median at the same fraction of their
    schedules (the module docstring). A study to maximize.

    Args:
        epochs_of: a trial's length in epochs (its ``train.epochs``, searched or the recipe's).
        startup: finished trials before the first pruning.
    """

    def __init__(self, epochs_of: Callable[[FrozenTrial], int], startup: int = STARTUP_TRIALS):
        self.epochs_of, self.startup = epochs_of, startup

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        epoch = trial.last_step
        if epoch is None or len(finished) < max(1, self.startup):
            return False
        reported = [value for value in trial.intermediate_values.values() if not math.isnan(value)]
        if not reported:
            return True  # nothing but NaN: as Optuna's rule
        best = max(reported)
        fraction = epoch / self.epochs_of(trial)
        others = [value_at(u, fraction * self.epochs_of(u)) for u in finished]
        others = [value for value in others if value is not None and not math.isnan(value)]
        return bool(others) and best < statistics.median(others)


def value_at(trial: FrozenTrial, epoch: float) -> float | None:
    """``trial``'s reported value at ``epoch``, linear between the epochs it reported; None outside them.

    >>> from optuna.trial import create_trial
    >>> t = create_trial(value=0.9, intermediate_values={2: 0.5, 4: 0.7, 6: 0.8})
    >>> value_at(t, 3), value_at(t, 6), value_at(t, 1)
    (0.6, 0.8, None)
    """
    points = sorted(trial.intermediate_values.items())
    for (low, below), (high, above) in zip(points, points[1:]):
        if low <= epoch <= high:
            return below + (above - below) * (epoch - low) / (high - low)
    if points and points[-1][0] == epoch:  # one report, or the last
        return points[-1][1]
    return None
