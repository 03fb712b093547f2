"""What an experiment runs: a job, a declared value of the command it starts and the file that says it finished.

A job is one of the user's own commands, ``python -m MODULE ARGV`` (or ``LAUNCHER -m MODULE ARGV``: accelerate
launch and torchrun take ``-m``), with ARGV built by that command's own builder (:mod:`sslkit.command_lines`),
the result file whose metrics say it finished, and the jobs it needs to have finished first (an embedding before
the selections that read it). Where it runs is the executor's business (:mod:`sslkit.experiments.executor`).

>>> job = Job("a", "sslkit.cli.pretrain", ("quickstart", "train.epochs=1"), Path("runs/a/results.json"))
>>> job.command()[1:]
['-m', 'sslkit.cli.pretrain', 'quickstart', 'train.epochs=1']
>>> Job("b", "sslkit.cli.pretrain", ("quickstart",), Path("b.json"), launcher="accelerate launch --cpu").command()
['accelerate', 'launch', '--cpu', '-m', 'sslkit.cli.pretrain', 'quickstart']
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRAINED = ("results", "trained")  # where a pretraining run's results.json holds the trained encoder's metrics
TIMES = ("wall_s", "cpu_s")  # what a job cost: wall seconds, and CPU seconds of all its processes together


def command_line(module: str, argv: list[str] | tuple[str, ...], launcher: str | None = None) -> list[str]:
    """``python -m MODULE ARGV``, or ``LAUNCHER -m MODULE ARGV``."""
    prefix = shlex.split(launcher) if launcher else [sys.executable]
    return [*prefix, "-m", module, *argv]


@dataclass(frozen=True)
class Job:
    """One command of an experiment, the file that says it finished, and the jobs it needs.

    Attributes:
        name: unique in its experiment; its logs are ``logs/<name>.out`` and ``.err``.
        module: the command's module, started as ``python -m MODULE``.
        argv: its arguments, built by the command's builder (:mod:`sslkit.command_lines`).
        result: the JSON file whose metrics say the job finished (the folder it is in is the job's output).
        metrics_at: the keys that lead to the metrics in ``result``.
        needs: the names of the jobs that must have finished well before this one starts.
        shown: the metrics printed when it finishes.
        fields: the experiment's own columns (swept values, seed, kind, ...), copied into the job's record.
        complete_key: a key at the top of ``result`` that must be true for the job to count as finished, for a
            result written before the job ends (an embeddings folder's meta.json says ``complete`` at its end).
        launcher: a prefix for a command of several processes (``accelerate launch --cpu``), or None: one.
    """

    name: str
    module: str
    argv: tuple[str, ...]
    result: Path
    metrics_at: tuple[str, ...] = TRAINED
    needs: tuple[str, ...] = ()
    shown: tuple[str, ...] = ("knn_top1", "linear_top1")
    fields: dict[str, Any] = field(default_factory=dict)
    complete_key: str | None = None
    launcher: str | None = None

    def command(self) -> list[str]:
        """The command line that runs the job."""
        return command_line(self.module, self.argv, self.launcher)

    def finished_metrics(self) -> dict[str, float] | None:
        """The metrics of the result file when it says the job finished (:func:`read_metrics`), else None."""
        metrics = read_metrics(self.result, self.metrics_at)
        if metrics is None or self.complete_key is None:
            return metrics
        try:
            complete = json.loads(self.result.read_text()).get(self.complete_key) is True
        except (OSError, ValueError, AttributeError):
            return None
        return metrics if complete else None


def read_metrics(path: Path, keys: tuple[str, ...] = TRAINED) -> dict[str, float] | None:
    """The numbers under ``keys`` in the JSON file at ``path``, or None when it (or that entry) is missing."""
    try:
        metrics = json.loads(path.read_text())
        for key in keys:
            metrics = metrics[key]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(metrics, dict):
        return None
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
