"""Experiments over many runs, and what is written about runs: reports, tables, plots.

Every experiment has one shape: plan -> jobs -> executor -> records -> tables. Callable from Python with plain
arguments, each ``plan_*`` function resolves and checks what is asked (every run's config validated, a
:class:`~sslkit.errors.UserError` naming the first mistake); the plan declares its jobs, each ``run_*``
function runs them on an executor (by default here, one at a time), showing the progress as it goes, and
returns an :class:`~sslkit.experiments.experiment.Outcome`: the tables and notes to show, and the exit status.
The commands (:mod:`sslkit.cli`) parse their options into these calls and print what they return.

- :mod:`sslkit.experiments.ablate`  a grid of pretraining runs (sweeps x variants x seeds) (``sslkit-ablate``).
- :mod:`sslkit.experiments.label_efficiency`  pretrained against scratch at few labels (``sslkit-label-efficiency``).
- :mod:`sslkit.experiments.compare`  recipes at equal training time (``sslkit-compare``).
- :mod:`sslkit.experiments.tune`  a recipe's settings searched with Optuna, trials pruned (``sslkit-tune``); its
  search spaces (``tune_space``), study storage (``tune_storage``), workers (``tune_worker``) and tables
  (``tune_report``).
- :mod:`sslkit.experiments.experiment`  the shape they share, and how an experiment ended.
- :mod:`sslkit.experiments.jobs`  a job: the command it starts, its result file, the jobs it needs.
- :mod:`sslkit.experiments.runner`  runs an experiment's jobs on an executor, resumably, and records each one.
- :mod:`sslkit.experiments.executor`  where jobs run: the interface of an executor.
- :mod:`sslkit.experiments.local`  the local executor: N jobs at once on this machine (``--jobs N``).
- :mod:`sslkit.experiments.calibration`  a recipe's images/s from a short run, and the steps a time budget allows.
- :mod:`sslkit.experiments.runs`  the pretraining, fine-tune and scratch runs the last two build alike.
- :mod:`sslkit.experiments.roads`  the roads of the label-efficiency comparison, one registry.
- :mod:`sslkit.experiments.stats`  mean and spread over seeds, and paired differences.
- :mod:`sslkit.experiments.tables`  CSV files, terminal cells and error-bar plots of figures over seeds.
- :mod:`sslkit.experiments.report`  a run's ``report.md`` with its curves (``sslkit-report``).
"""
