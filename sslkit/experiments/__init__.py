"""Experiments over many runs, and what is written about runs: reports, tables, plots.

- :mod:`sslkit.experiments.report`  a run's ``report.md`` with its curves (``sslkit-report``).
"""
