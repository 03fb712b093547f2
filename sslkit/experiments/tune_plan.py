"""A tuning study's plan: the recipe, the search space, the metric and where the study and its trials live.

What :mod:`sslkit.experiments.tune` builds from the command line, and what its workers
(:mod:`sslkit.experiments.tune_worker`) and its report (:mod:`sslkit.experiments.tune_report`) read.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from sslkit.command_lines import pretrain
from sslkit.command_lines import tune as tune_lines
from sslkit.errors import UserError
from sslkit.experiments import runner
from sslkit.experiments.jobs import Job
from sslkit.experiments.tune_pruner import ScheduleMedianPruner
from sslkit.experiments.tune_space import Space, override_value
from sslkit.experiments.tune_storage import Place


@dataclass
class Plan:
    """Everything the tuning is asked for, resolved and checked.

    Attributes:
        recipe: the recipe's file.
        overrides: shared by every trial.
        spaces: what is searched, in ``--search`` order.
        metric: what the trials maximize (or minimize), from each run's ``results.json``.
        direction: ``maximize`` or ``minimize``.
        trials: the trials the study runs, every worker together.
        workers: how many workers the command starts.
        sampler: ``tpe`` or ``random``.
        pruner: ``median``, ``hyperband`` or ``none``.
        seed: the sampler's seed.
        validation: ``data.val_fraction`` of every trial (``--validation``): the trials are measured on training
            images held out of training, not the test split; None: on the test split.
        place: the study's storage and name.
        base: the recipe with the overrides, flattened, but for the searched keys and where runs go: what the
            study's trials share.
        epochs: ``train.epochs`` with the overrides: a trial's length when it does not search it.
        monitor_every: ``train.knn_every_epochs`` with the overrides: the epochs the pruner hears of (0: none).
        stop_signals: the recipe's ``train.stop_signals``: the first stops a trial's run cleanly (SIGTERM when there
            is none), and each stops a worker as Ctrl-C does (a cluster's preemption notice).
    """

    recipe: Path
    overrides: list[str]
    spaces: list[Space]
    metric: str
    direction: str
    trials: int
    workers: int
    sampler: str
    pruner: str
    seed: int
    validation: float | None
    place: Place
    base: dict[str, Any]
    epochs: int
    monitor_every: int
    stop_signals: list[str]

    @property
    def out(self) -> Path:
        return self.place.out

    @property
    def stop_signal(self) -> str:
        """The signal that stops a trial's run: it saves and exits (SIGTERM, which ends it, without one)."""
        return (self.stop_signals or ["SIGTERM"])[0]

    def trial_job(self, run: str, values: dict[str, Any]) -> Job:
        """The pretraining run of a trial: the user's command with ``values`` (the trial's, by key) last."""
        run_dir = self.out / "trials" / run
        searched = [f"{key}={override_value(value)}" for key, value in values.items()]
        place = [f"run.output_dir={self.out / 'trials'}", f"run.name={run}", "run.resume=auto"]
        argv = pretrain.build_argv(self.recipe, [*self.trial_overrides, *searched, *place])
        return Job(run, pretrain.MODULE, tuple(argv), run_dir / "results.json", shown=(self.metric,))

    @property
    def trial_overrides(self) -> list[str]:
        """What every trial's run is given before its values: the overrides, and the validation split."""
        return [*self.overrides, *validation_overrides(self.validation)]

    def worker_jobs(self, count: int) -> list[Job]:
        """``count`` workers of the study, as the executor starts them."""
        return [
            Job(
                name=f"worker-{index}",
                module=tune_lines.MODULE,
                argv=tuple(self.worker_argv(index)),
                result=self.out / "workers" / f"worker-{index}.json",
                metrics_at=(),
                shown=(),
            )
            for index in range(count)
        ]

    def worker_argv(self, index: int) -> list[str]:
        return tune_lines.build_argv(
            self.recipe,
            self.overrides,
            search=[f"{space.key}={space.text()}" for space in self.spaces],
            out=self.out,
            study=self.place.name,
            worker=index,
            metric=self.metric,
            direction=self.direction,
            trials=self.trials,
            sampler=self.sampler,
            pruner=self.pruner,
            seed=self.seed,
            validation=self.validation,
            storage=self.place.url,
        )

    def attributes(self) -> dict[str, Any]:
        """What the study stores of this plan, and refuses to continue with another: the search, the metric and
        the recipe its trials share."""
        return {
            "search": {space.key: space.as_dict() for space in self.spaces},
            "metric": self.metric,
            "recipe": self.base,
        }

    def new_sampler(self, worker: int, trials_so_far: int) -> optuna.samplers.BaseSampler:
        """Worker ``worker``'s sampler, seeded by ``--seed``, the worker and the trials the study holds: workers
        draw apart, and a study continued after a stop does not draw its first values again."""
        import numpy as np

        seed = int(np.random.SeedSequence([self.seed, worker, trials_so_far]).generate_state(1)[0])
        if self.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # constant_liar: a trial still running counts as a poor one, so that workers asking at once spread out.
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True)

    def new_pruner(self) -> optuna.pruners.BasePruner:
        if self.pruner == "median":
            return ScheduleMedianPruner(lambda trial: trial.params.get("train.epochs", self.epochs))
        return {"hyperband": optuna.pruners.HyperbandPruner, "none": optuna.pruners.NopPruner}[self.pruner]()

    def open_study(self, create: bool, worker: int | None = None) -> optuna.Study:
        """The study, created when ``create`` and missing, and checked against this plan (:meth:`attributes`),
        with worker ``worker``'s sampler.

        Raises:
            UserError: the storage cannot be opened, the study is missing (a worker's), or it was made for another
                search, metric, direction or recipe.
        """
        storage = self.place.storage()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        name = self.place.name
        if create:
            study = optuna.create_study(
                storage=storage, study_name=name, direction=self.direction, load_if_exists=True
            )
        else:
            try:
                study = optuna.load_study(study_name=name, storage=storage)
            except KeyError:
                raise UserError(f"no study '{name}' in {self.place.shown()}: start it with sslkit-tune") from None
        claim(study, self)
        if worker is not None:
            sampler = self.new_sampler(worker, len(study.get_trials(deepcopy=False)))
            study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=self.new_pruner())
        return study


def validation_overrides(fraction: float | None) -> list[str]:
    """``--validation F`` as the trials' override."""
    return [] if fraction is None else [f"data.val_fraction={fraction}"]


def claim(study: optuna.Study, plan: Plan) -> None:
    """Store the plan's :meth:`~Plan.attributes` in a new study, or check them against those stored.

    A study whose trials have no value yet (none finished) takes another metric: nothing was measured with the
    old one. Everything is checked before anything is written.

    Raises:
        UserError: the first difference, both sides, and what to do.
    """
    where, wanted = f"study '{plan.place.name}' in {plan.place.shown()}", plan.attributes()
    new_study = "; give the same, or another --out (or --study) for a new study"
    if study.direction != StudyDirection[plan.direction.upper()]:
        raise UserError(
            f"{where} is to {study.direction.name.lower()}, this command --direction {plan.direction}" + new_study
        )
    stored = study.user_attrs
    measured = any(trial.state == TrialState.COMPLETE for trial in study.get_trials(deepcopy=False))
    if stored.get("search") not in (None, wanted["search"]):
        given = ", ".join(f"{key}={Space(**space).text()}" for key, space in stored["search"].items())
        asked = " ".join(f"--search {space.key}={space.text()}" for space in plan.spaces)
        raise UserError(f"{where} searches {given}, this command {asked}" + new_study)
    if stored.get("metric") not in (None, plan.metric) and measured:
        raise UserError(
            f"{where} measured its trials by {stored['metric']}, this command --metric {plan.metric}" + new_study
        )
    if stored.get("recipe") is not None and (differ := runner.config_differences(wanted["recipe"], stored["recipe"])):
        key = differ[0]
        raise UserError(
            f"{where} was run with {key}={stored['recipe'][key]}, this command gives {key}={wanted['recipe'][key]}"
            + new_study
        )
    for key, value in wanted.items():
        if stored.get(key) != value:
            study.set_user_attr(key, value)
