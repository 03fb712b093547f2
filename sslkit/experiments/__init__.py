"""Experiments over many runs, and what is written about runs: reports, tables, plots.

Callable from Python with plain arguments; each ``plan_*`` function resolves and checks what is
asked (every run's config validated, a :class:`~sslkit.errors.UserError` naming the first mistake)
and each ``run_*`` function runs the plan, showing its progress as it goes, and returns an
:class:`~sslkit.experiments.runner.Outcome`: the tables and notes to show, and the exit status. The
commands (:mod:`sslkit.cli`) parse their options into these calls and print what they return.

- :mod:`sslkit.experiments.ablate`  a grid of pretraining runs (sweeps x variants x seeds) (``sslkit-ablate``).
- :mod:`sslkit.experiments.label_efficiency`  pretrained against scratch at few labels (``sslkit-label-efficiency``).
- :mod:`sslkit.experiments.compare`  recipes at equal training time (``sslkit-compare``).
- :mod:`sslkit.experiments.calibration`  a recipe's images/s from a short run, and the steps a time budget allows.
- :mod:`sslkit.experiments.runs`  the pretraining, fine-tune and scratch runs the last two build alike.
- :mod:`sslkit.experiments.runner`  runs the jobs of an experiment, each in its own process, resumably.
- :mod:`sslkit.experiments.stats`  mean and spread over seeds, and paired differences.
- :mod:`sslkit.experiments.tables`  CSV files, terminal cells and error-bar plots of figures over seeds.
- :mod:`sslkit.experiments.report`  a run's ``report.md`` with its curves (``sslkit-report``).
"""
