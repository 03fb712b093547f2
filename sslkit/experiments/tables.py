"""An experiment's figures over seeds as its user reads them: CSV files, terminal cells and error-bar plots.

The ablation, the label-efficiency comparison and the recipe comparison write their results the
same way: a CSV file holds six significant digits and leaves a missing figure empty; the terminal
shows ``mean ± std`` over seeds and how many seeds succeeded; a plot draws the mean with one
standard deviation as its error bar. The files are rewritten after every job, and a second Ctrl-C may
come while they are: each is written whole or not at all (:mod:`sslkit.files`).

>>> mean_std_text(0.81234, 0.0123)
'0.8123 ± 0.0123'
>>> mean_std_text(812.4, 3.2, digits=0)
'812'
>>> csv_number(1 / 3), csv_number(None)
('0.333333', '')
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sslkit.files import written_whole


def csv_number(value: float | None) -> str:
    """A metric in a CSV cell: six significant digits, empty for None."""
    return "" if value is None else f"{value:.6g}"


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Write a CSV file, whole or not at all: a header of ``columns``, then one line per row."""
    with written_whole(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as an indented JSON file, whole or not at all."""
    text = json.dumps(value, indent=2)
    with written_whole(path) as tmp:
        tmp.write_text(text)


def mean_std_text(mean: float | None, std: float | None, digits: int = 4) -> str:
    """``mean ± std`` in a terminal cell; ``-`` without a mean, the mean alone without a std or with no decimals."""
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + ("" if std is None or digits == 0 else f" ± {std:.{digits}f}")


def seeds_text(n_ok: int, n_failed: int) -> str:
    """``ok/all`` seeds of a row (rich markup): red when any failed."""
    seeds = f"{n_ok}/{n_ok + n_failed}"
    return seeds if not n_failed else f"[red]{seeds}"


def error_bars(
    axes: Any, xs: Sequence[float], rows: Sequence[dict], metric: str, label: str | None, **style: Any
) -> None:
    """One line of ``rows``' ``<metric>_mean`` against ``xs`` on matplotlib ``axes``, one ``<metric>_std`` as error
    bars (``style``: matplotlib's ``errorbar`` keywords, e.g. ``color``); a row without a mean is a gap, and a
    line of gaps says in its label that every run failed."""
    ys = [math.nan if r[f"{metric}_mean"] is None else r[f"{metric}_mean"] for r in rows]
    errors = [r[f"{metric}_std"] or 0.0 for r in rows]
    if label and all(math.isnan(y) for y in ys):
        label += " (every run failed)"
    axes.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=label, **style)


def save_plot(figure: Any, title: str, seeds: int, path: Path, legend: bool = True) -> None:
    """Title (saying what the error bars are when there are several seeds), grid, legend; saved to ``path``.

    A figure of several panels gets the title above them all and the legend in its first panel.
    """
    first = figure.axes[0]
    text = title + (f" (error bars: std over {seeds} seeds)" if seeds > 1 else "")
    if len(figure.axes) > 1:
        figure.suptitle(text)
    else:
        first.set_title(text)
    for axes in figure.axes:
        axes.grid(alpha=0.3)
    if legend:
        first.legend()
    figure.savefig(path, dpi=110)
