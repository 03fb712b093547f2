"""Run a grid of pretraining runs (sweeps x seeds) and tabulate and plot what they give.

    plan = plan_ablation("quickstart", ["loss.temperature=0.05,0.1,0.2,0.5"], seeds=2, overrides=["train.epochs=10"])
    outcome = run_ablation(plan, LocalExecutor(jobs=2))  # its table and notes to show, and the exit status

is ``sslkit-ablate quickstart --sweep loss.temperature=0.05,0.1,0.2,0.5 --seeds 2 --jobs 2 train.epochs=10``
(:mod:`sslkit.cli.ablate`); every keyword of :func:`plan_ablation` is the option of that name, and its
errors name the options.

The grid is the product of the variants, the sweeps and the seeds (``--seeds N``: ``run.seed`` =
s, s+1, ..., from the recipe's seed s). A sweep changes one key; a variant is a named set of
settings that belong together, for comparisons that a product of keys cannot express (a loss with
its own miner and margins against a head with its method): ``--variants FILE`` reads a YAML
mapping of names to settings,

    triplet-batch-hard: {loss.name: triplet, loss.mining: batch_hard}
    arcface: {method.name: supervised, loss.name: arcface, loss.scale: 16}

and the variant's name is the first column of the tables. Every point is the user's own command,
run as a subprocess:

    python -m sslkit.cli.pretrain RECIPE key.sub=value ... <swept values> run.seed=S
        run.output_dir=OUT/runs run.name=<point> run.resume=auto

(or ``--launcher -m sslkit.cli.pretrain`` and the same arguments), so a point that crashes or diverges cannot
take the others down, and each leaves a normal run directory that ``sslkit-evaluate`` and
``sslkit-report`` take as it is. Values are YAML, as in overrides; a value that holds a
comma goes in brackets: ``--sweep augment.crop_scale=[0.08,1.0],[0.2,1.0]``.

Every point's config is loaded and validated before anything runs, so a typo fails in a second
rather than after an hour (exit status 2, one line). The sweep is resumable: a point whose run
directory has ``results.json`` is skipped ("done, skipped"); any other point runs again,
continuing from its last checkpoint if it has one. A point that fails is recorded with its
error (the last line of its stderr) and the others still run; the exit status is then 1.

OUT receives, updated after every point:

- ``results.csv`` / ``results.json``: one row per point: swept values, seed, status, error,
  wall and CPU time (``wall_s``, ``cpu_s``: all the run's processes), and the final metrics of the trained
  encoder;
- ``summary.csv``: mean and standard deviation over seeds of every metric, per grid point;
- ``<metric>.png`` (with matplotlib): kNN and linear top-1 (or ``--metrics``) against the first swept key (a log
  axis for positive values spanning 10x or more), error bars one standard deviation over seeds,
  one line per value of the other swept keys;
- ``logs/<point>.out`` / ``.err``: each point's stdout and stderr.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape
from rich.table import Table

from sslkit.command_lines import pretrain
from sslkit.config import find_recipe, flatten, load_config, to_dict
from sslkit.errors import UserError
from sslkit.experiments import runner
from sslkit.experiments.executor import Executor
from sslkit.experiments.experiment import Experiment, Outcome, finished, run_experiment
from sslkit.experiments.jobs import TIMES, Job
from sslkit.experiments.local import LocalExecutor
from sslkit.experiments.report import PLOT_HINT, new_figure
from sslkit.experiments.runs import PLACE_KEYS, refuse_reserved
from sslkit.experiments.stats import mean_std
from sslkit.experiments.tables import (
    csv_number,
    error_bars,
    mean_std_text,
    save_plot,
    seeds_text,
    write_csv,
    write_json,
)
from sslkit.schema.reading import find_variants

PLOTTED_METRICS = ("knn_top1", "linear_top1")
VARIANT = "variant"  # the column of a point's variant name in the tables


@dataclass(frozen=True)
class Point:
    """One run of the grid: its variant's settings, a value for every swept key, and a seed."""

    values: tuple[tuple[str, str], ...]  # (key, value as the user typed it), in --sweep order; the variant first
    seed: int
    settings: tuple[str, ...] = ()  # the variant's key=value overrides

    @property
    def name(self) -> str:
        """The run directory's name, e.g. ``loss.temperature=0.1_seed=0``: readable, one per point."""
        # Values may hold '/' (paths) or brackets (lists): keep the name a plain file name.
        parts = [f"{key}={re.sub(r'[^A-Za-z0-9._+-]', '-', value)}" for key, value in self.values]
        return "_".join([*parts, f"seed={self.seed}"])

    def overrides(self) -> list[str]:
        swept = [f"{key}={value}" for key, value in self.values if key != VARIANT]
        return [*self.settings, *swept, f"run.seed={self.seed}"]


def split_values(text: str) -> list[str]:
    """``0.1,[0.08,1.0],x`` -> ``['0.1', '[0.08,1.0]', 'x']``: commas inside brackets stay."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    return values


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """``loss.temperature=0.1,0.2`` -> ``("loss.temperature", ["0.1", "0.2"])``."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    values = split_values(raw) if sep else []
    if (
        not sep
        or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", key)
        or not values
        or "" in values
    ):
        raise UserError(
            f"--sweep '{text}' must look like section.key=V1,V2,... e.g. --sweep loss.temperature=0.05,0.1,0.2"
        )
    if key in (*PLACE_KEYS, "run.seed"):  # run.seed may be overridden: it is the first of the --seeds
        hint = "use --seeds N for seeds" if key == "run.seed" else "use --out DIR to choose where the runs go"
        raise UserError(f"--sweep '{key}': ablate sets {key} for every point; {hint}")
    if len(set(values)) < len(values):
        raise UserError(f"--sweep '{text}': a value appears twice")
    return key, values


def override_text(value: Any) -> str:
    """A YAML value as an override's right-hand side: ``[0.2, 1.0]``, ``0.001``, ``batch_hard``."""
    return value if isinstance(value, str) else json.dumps(value)


def read_variants(path: Path, swept: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """``--variants FILE``: ``[(name, ("key=value", ...)), ...]`` in the file's order.

    Raises:
        UserError: the file is missing or not a mapping of names to mappings of dotted keys, or a
            variant sets a key that ablate sets or that a --sweep also changes.
    """
    example = "e.g. 'triplet: {loss.name: triplet, loss.mining: batch_hard}'"
    try:
        variants = yaml.safe_load(path.read_text())
    except OSError as error:
        raise UserError(f"--variants {path}: cannot read it ({error.strerror}); give a YAML file") from None
    except yaml.YAMLError as error:
        raise UserError(f"--variants {path}: not valid YAML ({' '.join(str(error).split())})") from None
    if not isinstance(variants, dict) or not variants:
        raise UserError(f"--variants {path} must map variant names to their settings, {example}")
    read = []
    for name, settings in variants.items():
        if not isinstance(settings, dict) or not settings:
            raise UserError(f"--variants {path}: variant '{name}' must map dotted keys to values, {example}")
        for key in settings:
            parse_sweep(f"{key}=x")  # the same rules for the key as a --sweep's (dotted, not reserved)
            if key in swept:
                raise UserError(f"--variants {path}: variant '{name}' sets {key}, which --sweep {key} also changes")
        read.append((str(name), tuple(f"{key}={override_text(value)}" for key, value in settings.items())))
    return read


def build_grid(
    sweeps: list[tuple[str, list[str]]],
    seeds: list[int],
    variants: list[tuple[str, tuple[str, ...]]] | None = None,
) -> list[Point]:
    """Every combination of the variants and the swept values, each with every seed (seeds innermost)."""
    keys = [key for key, _ in sweeps]
    if len(set(keys)) < len(keys):
        raise UserError(f"--sweep: a key is swept twice ({', '.join(keys)}); give all its values in one --sweep")
    combos = list(product(*(values for _, values in sweeps)))
    points = [
        Point((((VARIANT, name),) if variants else ()) + tuple(zip(keys, combo)), seed, settings)
        for name, settings in (variants or [("", ())])
        for combo in combos
        for seed in seeds
    ]
    names = [p.name for p in points]
    if len(set(names)) < len(names):
        raise UserError(
            "--sweep or --variants: two values give the same run directory name once '/' and the like are "
            "replaced; write them differently"
        )
    return points


def point_overrides(point: Point, overrides: list[str], out: Path) -> list[str]:
    """Everything a point's run is given after the recipe: the user's overrides, then the point's own."""
    # resume=auto: a point stopped midway (Ctrl-C, a crash) continues from its last checkpoint on the rerun.
    return [
        *overrides,
        *point.overrides(),
        f"run.output_dir={out / 'runs'}",
        f"run.name={point.name}",
        "run.resume=auto",
    ]


def point_job(
    point: Point,
    recipe: Path,
    overrides: list[str],
    out: Path,
    launcher: str | None,
    shown: tuple[str, ...] = PLOTTED_METRICS,
) -> Job:
    """One point as the sweep runs it: the user's pretrain command with the point's values."""
    run_dir = out / "runs" / point.name
    return Job(
        name=point.name,
        module=pretrain.MODULE,
        argv=tuple(pretrain.build_argv(recipe, point_overrides(point, overrides, out))),
        result=run_dir / "results.json",
        shown=shown,
        fields={
            "values": {k: parse_value(v) for k, v in point.values},
            "values_text": dict(point.values),
            "seed": point.seed,
            "run_dir": str(run_dir),
        },
        launcher=launcher,
    )


def check_points(recipe: Path, overrides: list[str], points: list[Point], out: Path) -> None:
    """Load and validate every point's config before anything runs; refuse a run directory made with another config.

    Raises:
        UserError: a point's config is invalid, or a run directory of this sweep was made with
            other settings (skipping or resuming it would mix two experiments).
    """
    for point in points:
        try:
            cfg = load_config(recipe, point_overrides(point, overrides, out))
        except UserError as error:
            raise UserError(f"point {point.name}: {error}") from None
        runner.refuse_changed_run(out / "runs" / point.name, flatten(to_dict(cfg)), (), "sweep")


# --------------------------------------------------------------------------- results


def parse_value(text: str) -> Any:
    """A swept value as the config reads it (YAML), with ``1e-3`` (a string to YAML 1.1) read as a number."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value):
        return float(value)
    return value


def metric_names(records: list[dict]) -> list[str]:
    names = {m for r in records for m in r["metrics"]}
    return sorted(
        names, key=lambda m: (m not in PLOTTED_METRICS, PLOTTED_METRICS.index(m) if m in PLOTTED_METRICS else 0, m)
    )


def summarize(records: list[dict], keys: list[str]) -> list[dict]:
    """Mean and standard deviation over seeds, per grid point (points that failed are counted, not averaged).

    The standard deviation is the sample one (n - 1); with a single successful seed it is None.
    """
    metrics = metric_names(records)
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault(tuple(record["values_text"][k] for k in keys), []).append(record)
    rows = []
    for texts, members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        row = {
            "values": {k: parse_value(t) for k, t in zip(keys, texts)},
            "values_text": dict(zip(keys, texts)),
            "n_ok": len(ok),
            "n_failed": len(members) - len(ok),
        }
        for metric in metrics:
            values = [r["metrics"][metric] for r in ok if metric in r["metrics"]]
            row[f"{metric}_mean"], row[f"{metric}_std"] = mean_std(values)
        rows.append(row)
    return rows


def write_tables(out: Path, records: list[dict], keys: list[str], header: dict) -> list[dict]:
    """Write results.csv, results.json and summary.csv; returns the summary rows."""
    metrics = metric_names(records)
    write_csv(
        out / "results.csv",
        ["name", *keys, "seed", "status", "skipped", "error", *TIMES, *metrics],
        (
            [
                r["name"],
                *(r["values_text"][k] for k in keys),
                r["seed"],
                r["status"],
                r["skipped"],
                r["error"] or "",
                *("" if r[key] is None else f"{r[key]:.1f}" for key in TIMES),
                *(csv_number(r["metrics"].get(m)) for m in metrics),
            ]
            for r in records
        ),
    )
    write_json(out / "results.json", {**header, "points": records})
    summary = summarize(records, keys)
    numbers = [f"{m}_{s}" for m in metrics for s in ("mean", "std")]
    counts = ["n_ok", "n_failed"]
    write_csv(
        out / "summary.csv",
        [*keys, *counts, *numbers],
        (
            [*(row["values_text"][k] for k in keys), *(row[c] for c in counts), *(csv_number(row[n]) for n in numbers)]
            for row in summary
        ),
    )
    return summary


def summary_table(summary: list[dict], keys: list[str], metrics: list[str]) -> Table:
    """Mean ± std over seeds per grid point, as a rich table."""
    table = Table(title="ablation: mean ± std over seeds")
    for key in keys:
        table.add_column(key, justify="right")
    table.add_column("seeds ok", justify="right")
    for metric in metrics:
        table.add_column(metric, justify="right")
    for row in summary:
        table.add_row(
            *(escape(row["values_text"][k]) for k in keys),
            seeds_text(row["n_ok"], row["n_failed"]),
            *(mean_std_text(row[f"{metric}_mean"], row[f"{metric}_std"]) for metric in metrics),
        )
    return table


def plot_metric(summary: list[dict], keys: list[str], metric: str, path: Path) -> Any:
    """Save ``metric`` against the first swept key, one line per combination of the others.

    Numeric values go on a numeric axis (logarithmic when they are positive and span 10x or
    more, as temperatures and learning rates do); other values are evenly spaced categories.

    Returns:
        The matplotlib Figure, or None without matplotlib or without a swept key.
    """
    figure = new_figure(6.5, 4.2)
    if figure is None or not keys:
        return None
    axes = figure.axes[0]
    x_key, other_keys = keys[0], keys[1:]
    x_texts = list(dict.fromkeys(row["values_text"][x_key] for row in summary))
    x_values = [parse_value(t) for t in x_texts]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x_values)
    position = dict(zip(x_texts, x_values if numeric else range(len(x_texts))))
    lines: dict[tuple, list[dict]] = {}
    for row in summary:
        lines.setdefault(tuple(row["values_text"][k] for k in other_keys), []).append(row)
    for line_key, rows in lines.items():
        rows = sorted(rows, key=lambda r: position[r["values_text"][x_key]])
        label = ", ".join(f"{k}={v}" for k, v in zip(other_keys, line_key)) or None
        error_bars(axes, [position[r["values_text"][x_key]] for r in rows], rows, metric, label)
    if numeric and min(x_values) > 0 and max(x_values) / min(x_values) >= 10:
        axes.set_xscale("log")
    if numeric:
        axes.set_xticks(x_values, x_texts)
        axes.minorticks_off()
    else:
        axes.set_xticks(range(len(x_texts)), x_texts)
    seeds = max(r["n_ok"] + r["n_failed"] for r in summary)
    axes.set_xlabel(x_key)
    axes.set_ylabel(metric)
    save_plot(figure, f"{metric} vs {x_key}", seeds, path, legend=bool(other_keys))
    return figure


# --------------------------------------------------------------------------- the plan and the sweep


@dataclass
class Plan(Experiment):
    """Everything the ablation is asked for, resolved and checked: the recipe, the grid and where it goes."""

    noun = "points"
    records_key = "points"

    recipe: Path
    overrides: list[str]
    sweeps: list[tuple[str, list[str]]]
    variants: list[tuple[str, tuple[str, ...]]] | None
    keys: list[str]  # the tables' columns: "variant" (with variants), then the swept keys
    seeds: list[int]
    points: list[Point]
    out: Path
    shown: tuple[str, ...]  # the metrics of the terminal table and the plots
    launcher: str | None

    def jobs(self) -> list[Job]:
        recipe = self.recipe.resolve()
        return [point_job(point, recipe, self.overrides, self.out, self.launcher, self.shown) for point in self.points]

    def intro(self, jobs: list[Job]) -> str:
        seeds = len(self.seeds)
        grid = f"{len(jobs) // seeds} grid points x {seeds} seed{'s' if seeds > 1 else ''}"
        return f"ablation: {len(jobs)} runs ({grid}) -> {self.out}"

    def header(self) -> dict:
        """What ``results.json`` says the ablation was asked for, above its points."""
        return {
            "recipe": str(self.recipe),
            "overrides": self.overrides,
            "sweeps": dict(self.sweeps),
            "variants": dict(self.variants or []),
            "seeds": self.seeds,
            "launcher": self.launcher,
        }

    def write_tables(self, records: list[dict], times: dict[str, dict]) -> list[dict]:
        return write_tables(self.out, records, self.keys, {**self.header(), "times": times})

    def conclusion(self, records: list[dict], summary: list[dict]) -> Outcome:
        """The summary table (its headline metrics; the CSV files have them all) and the plots."""
        out, keys, metrics = self.out, self.keys, metric_names(records)
        table = summary_table(summary, keys, [m for m in self.shown if m in metrics] or metrics)
        plotted = [
            m for m in self.shown if m in metrics and plot_metric(summary, keys, m, out / f"{m}.png") is not None
        ]
        results = f"results: {out / 'results.csv'}, {out / 'summary.csv'}, {out / 'results.json'}" + (
            f"; plots: {', '.join(str(out / f'{m}.png') for m in plotted)}"
            if plotted
            else f"; no plots ({PLOT_HINT})"
            if keys and metrics
            else ""
        )
        return finished(records, out, self.noun, [table], results)


def plan_ablation(
    recipe: str | Path,
    sweeps: Sequence[str] = (),
    *,
    variants: str | Path | None = None,
    seeds: int = 1,
    out: str | Path | None = None,
    overrides: Sequence[str] = (),
    metrics: str | Sequence[str] | None = None,
    launcher: str | None = None,
) -> Plan:
    """The grid resolved and checked, every point's config validated, before anything runs.

    Args:
        recipe: a YAML recipe's path or a bundled recipe's name.
        sweeps: ``KEY=V1,V2,...`` each; the grid is their product.
        variants: a YAML file of named variants (mappings of dotted keys to values), crossed with the sweeps.
        seeds: seeds per grid point: ``run.seed`` = s, s+1, ... from the recipe's seed.
        out: the output directory (default ``<run.output_dir>/ablate-<recipe>-<swept keys>``).
        overrides: shared by every point, e.g. ``["train.epochs=10"]``.
        metrics: the metrics of the terminal table and the plots (default kNN and linear top-1), e.g.
            ``"unseen_map@r,unseen_recall@1"``; the CSV files hold them all.
        launcher: a prefix for multi-process points, e.g. ``"accelerate launch --cpu --num_processes 2"``.

    Raises:
        UserError: a bad sweep, variants file, seed count or override; nothing to sweep; a point's config
            that is invalid; a run directory of ``out`` made with other settings.
    """
    overrides = list(overrides)
    parsed = [parse_sweep(text) for text in sweeps]
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    named = read_variants(find_variants(variants), [key for key, _ in parsed]) if variants else None
    if not parsed and not named and seeds == 1:
        raise UserError("nothing to sweep: give --sweep KEY=V1,V2,..., --variants FILE and/or --seeds N (N > 1)")
    refuse_reserved(overrides, PLACE_KEYS, "override", "ablate sets {key} for every point; use --out DIR instead")
    recipe = find_recipe(recipe)  # a bundled recipe's name becomes its file: the runs get a path
    base = load_config(recipe, overrides)
    keys = [VARIANT] * bool(named) + [key for key, _ in parsed]
    out = (Path(out) if out else Path(base.run.output_dir) / "-".join(["ablate", recipe.stem, *keys])).resolve()
    grid_seeds = [base.run.seed + i for i in range(seeds)]
    points = build_grid(parsed, grid_seeds, named)
    check_points(recipe, overrides, points, out)
    if isinstance(metrics, str):
        metrics = metrics.split(",")
    shown = tuple(metrics) if metrics else PLOTTED_METRICS
    return Plan(
        recipe=recipe,
        overrides=overrides,
        sweeps=parsed,
        variants=named,
        keys=keys,
        seeds=grid_seeds,
        points=points,
        out=out,
        shown=shown,
        launcher=launcher,
    )


def run_ablation(plan: Plan, executor: Executor | None = None) -> Outcome:
    """Run (or skip) every point on ``executor`` (default: here, one at a time), rewriting the tables after each;
    the progress shows as it goes.

    Returns:
        The outcome: the summary table, where the results and plots are, how many points failed, and the
        exit status (0 when every point succeeded, 1 when any failed, 130 when interrupted).
    """
    return run_experiment(plan, executor or LocalExecutor())
