"""The label-efficiency comparison's figures: one row per road and run, the summary over seeds, the paired gains,
the terminal tables and the plot (:mod:`sslkit.experiments.label_efficiency` runs the runs; the roads, their
figures and their lines are :mod:`sslkit.experiments.roads`').

Every row belongs to a selection (``balanced``, a strategy of :mod:`sslkit.selection`, or ``all`` at a
budget of every label) and a budget (``0.01`` of the labels or ``100`` labels, and ``labels``: the
images that makes). Two sets of gains are paired by seed:

- what pretraining buys (:data:`~sslkit.experiments.roads.PRETRAINING`): each road from the pretrained
  encoder minus ``scratch-best`` on the same labelled images, and FixMatch from the encoder minus FixMatch
  from scratch;
- what the unlabelled images buy (:data:`~sslkit.experiments.roads.UNLABELLED`): each road that learns from
  them minus the same start without them (FixMatch minus the fine-tune, FixMatch from scratch minus scratch
  best, the distilled students minus their teachers);
- what selection buys, when more than one selection ran and ``random`` or ``balanced`` is among them:
  each road with a selection minus the same road with ``random`` (else ``balanced``), the same
  budget and seed.

>>> column_header("scratch-long"), column_header("finetune")
('scratch\\nlong', 'fine\\ntune')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from sslkit.experiments.jobs import TIMES
from sslkit.experiments.label_budgets import BALANCED, EVERY_LABEL
from sslkit.experiments.report import new_figure
from sslkit.experiments.roads import PRETRAINING, ROADS, SELECTION_ROADS, UNLABELLED, colour, column_header, plotted
from sslkit.experiments.stats import mean_std, paired_difference
from sslkit.experiments.tables import csv_number, error_bars, mean_std_text, save_plot, write_csv, write_json

PLOT_FILE = "label_efficiency.png"

# What selection buys is measured against the first of these that ran.
SELECTION_BASELINES = ("random", BALANCED)
PANEL_TITLES = {BALANCED: "class-balanced random draw (reads the labels)"}
BUDGET_COLUMNS = ["selection", "budget", "fraction", "labels"]


# --------------------------------------------------------------------------- rows


def point_rows(records: list[dict], long_runs: bool = True) -> list[dict]:
    """One row per road, selection, budget and seed, from the runs' records.

    ``scratch-best`` follows the scratch run, or with ``long_runs`` (``--scratch-factor`` > 1) the
    scratch-long one, once both have a record (they may end in either order).
    """
    rows = []
    scratch = {label_key(r): r for r in records if r["kind"] == "scratch"}
    for record in records:
        kind = record["kind"]
        for road in (road for road in ROADS.values() if road.run == kind):
            rows.append(road_row(road.name, record, road.metric))
        if (kind == "scratch-long" and label_key(record) in scratch) or (kind == "scratch" and not long_runs):
            rows.append(best_of_scratch(scratch[label_key(record)], record if kind == "scratch-long" else None))
    return rows


def label_key(record: dict) -> tuple:
    """The labelled images a run trained on: its selection, budget and seed."""
    return record["selection"], record["budget"], record["seed"]


def road_row(road: str, record: dict, metric: str) -> dict:
    row = {
        "road": road,
        **{column: record[column] for column in BUDGET_COLUMNS},
        "seed": record["seed"],
        "run": record["name"],
        "status": record["status"],
        "skipped": record["skipped"],
        "error": record["error"],
        "wall_s": record["wall_s"],
        "cpu_s": record["cpu_s"],
        "metric": metric,
        "top1": None,
    }
    if record["status"] == "ok":
        if metric in record["metrics"]:
            row["top1"] = record["metrics"][metric]
        else:
            has = ", ".join(sorted(record["metrics"])) or "nothing"
            row.update(status="failed", error=f"its results have no {metric} (they have {has})")
    return row


def best_of_scratch(scratch: dict, long: dict | None) -> dict:
    """The better of scratch and scratch-long (or scratch alone with --scratch-factor 1)."""
    parts = [road_row("scratch", scratch, ROADS["scratch"].metric)]
    if long is not None:
        parts.append(road_row("scratch-long", long, ROADS["scratch-long"].metric))
    row = {**parts[0], "road": "scratch-best"}
    bad = [p for p in parts if p["status"] != "ok"]
    if bad:
        return {**row, "status": "failed", "top1": None, "error": f"{bad[0]['run']} failed: {bad[0]['error']}"}
    best = max(parts, key=lambda p: p["top1"])
    return {
        **best,
        "road": "scratch-best",
        "skipped": all(p["skipped"] for p in parts),
        **{key: total(p[key] for p in parts) for key in TIMES},  # what the figure cost: both runs
    }


def total(values) -> float | None:
    """The sum of ``values``, or None when any is unknown."""
    values = list(values)
    return None if None in values else sum(values)


def group_order(rows: list[dict]):
    """A sort key of (budget, selection, road): the budget's size, the selections in the order they ran (``all``
    after them), the roads as in :data:`~sslkit.experiments.roads.ROADS`."""
    selections = list(dict.fromkeys(r["selection"] for r in rows if r["selection"] != EVERY_LABEL))
    selections.append(EVERY_LABEL)
    roads = list(ROADS)
    return lambda budget, selection, road: (float(budget), selections.index(selection), roads.index(road))


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and sample standard deviation (None with one seed) over seeds, per budget, selection and road; failed
    rows are counted, not averaged. Ordered by budget, then selection, then road as in the registry."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["budget"], row["selection"], row["road"]), []).append(row)
    order = group_order(rows)
    summary = []
    for key in sorted(groups, key=lambda key: order(*key)):
        members = groups[key]
        ok = [r["top1"] for r in members if r["status"] == "ok"]
        mean, std = mean_std(ok)
        summary.append(
            {
                **{column: members[0][column] for column in BUDGET_COLUMNS},
                "road": key[2],
                "n_ok": len(ok),
                "n_failed": len(members) - len(ok),
                "top1_mean": mean,
                "top1_std": std,
                **{f"{key}_mean": mean_std([r[key] for r in members if r[key] is not None])[0] for key in TIMES},
            }
        )
    return summary


def by_seed(rows: list[dict]) -> dict[tuple[str, str, str], dict[int, float]]:
    """Test top-1 by (budget, selection, road), then by seed, of the rows that have one."""
    top1: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in rows:
        if r["top1"] is not None:
            top1.setdefault((r["budget"], r["selection"], r["road"]), {})[r["seed"]] = r["top1"]
    return top1


def paired_gains(rows: list[dict], pairs: tuple[tuple[str, str], ...] = PRETRAINING) -> list[dict]:
    """Per budget and selection, each ``(road, versus)`` of ``pairs``: the road minus ``versus`` on the same seed
    (the same labelled images), :func:`~sslkit.experiments.stats.paired_difference`. Pairing by seed takes
    out what the choice of labelled images does to both."""
    top1, gains = by_seed(rows), []
    for budget, selection in labelled_groups(rows):
        for road, versus in pairs:
            ours, theirs = top1.get((budget, selection, road), {}), top1.get((budget, selection, versus), {})
            if (gain := paired_difference(ours, theirs)) is not None:
                columns = budget_columns(rows, budget, selection)
                gains.append({**columns, "road": road, "versus": versus, **gain})
    return gains


def selection_baseline(rows: list[dict]) -> str | None:
    """What selections are measured against: ``random``, else ``balanced``; None with a single selection."""
    selections = {r["selection"] for r in rows} - {EVERY_LABEL}
    if len(selections) < 2:
        return None
    return next((s for s in SELECTION_BASELINES if s in selections), None)


def selection_gains(rows: list[dict]) -> list[dict]:
    """Per budget, each road with each selection minus the same road with :func:`selection_baseline`'s, paired by
    seed (the same run seeds, on other labelled images); nothing when no baseline ran."""
    baseline = selection_baseline(rows)
    if baseline is None:
        return []
    top1, gains = by_seed(rows), []
    for budget, selection in labelled_groups(rows):
        if selection in (baseline, EVERY_LABEL):
            continue
        for road in SELECTION_ROADS:
            ours, theirs = top1.get((budget, selection, road), {}), top1.get((budget, baseline, road), {})
            if (gain := paired_difference(ours, theirs)) is not None:
                gains.append({**budget_columns(rows, budget, selection), "road": road, "versus": baseline, **gain})
    return gains


def labelled_groups(rows: list[dict]) -> list[tuple[str, str]]:
    """The (budget, selection) pairs of ``rows``, ordered as the summary orders them."""
    order = group_order(rows)
    return sorted(dict.fromkeys((r["budget"], r["selection"]) for r in rows), key=lambda g: order(*g, "linear"))


def budget_columns(rows: list[dict], budget: str, selection: str) -> dict:
    """The selection and budget columns of the rows of that budget and selection."""
    row = next(r for r in rows if (r["budget"], r["selection"]) == (budget, selection))
    return {column: row[column] for column in BUDGET_COLUMNS}


# --------------------------------------------------------------------------- files


def write_tables(out: Path, records: list[dict], header: dict, long_runs: bool = True) -> list[dict]:
    """Write points.csv, points.json, summary.csv and gains.csv; returns the summary rows."""
    rows = point_rows(records, long_runs)
    write_csv(
        out / "points.csv",
        ["road", *BUDGET_COLUMNS, "seed", "run", "status", "skipped", "error", *TIMES, "metric", "top1"],
        (
            [
                r["road"],
                *budget_cells(r),
                *(r[c] for c in ("seed", "run", "status", "skipped")),
                r["error"] or "",
                *("" if r[key] is None else f"{r[key]:.1f}" for key in TIMES),
                r["metric"],
                csv_number(r["top1"]),
            ]
            for r in rows
        ),
    )
    write_json(out / "points.json", {**header, "runs": records, "points": rows})
    summary = summarize(rows)
    means = ["top1_mean", "top1_std", *(f"{key}_mean" for key in TIMES)]
    budget_csv(out / "summary.csv", summary, ["road", "n_ok", "n_failed"], means)
    gains = paired_gains(rows, PRETRAINING + UNLABELLED) + selection_gains(rows)
    budget_csv(out / "gains.csv", gains, ["road", "versus", "n_seeds"], ["gain_mean", "gain_std", "seeds_ahead"])
    return summary


def budget_cells(row: dict) -> list:
    """The selection, budget, fraction (empty for a budget in labels) and labels of a row, as CSV cells."""
    fraction = row["fraction"]
    return [row["selection"], row["budget"], "" if fraction is None else f"{fraction:g}", row["labels"]]


def budget_csv(path: Path, rows: list[dict], counts: list[str], numbers: list[str]) -> None:
    """A CSV file of ``rows``: their budget columns, ``counts`` as they are and ``numbers`` to six digits."""
    write_csv(
        path,
        [*BUDGET_COLUMNS, *counts, *numbers],
        ([*budget_cells(r), *(r[c] for c in counts), *(csv_number(r[c]) for c in numbers)] for r in rows),
    )


# --------------------------------------------------------------------------- terminal tables


def budget_grid(title: str, rows: list[dict], roads: list[str], header, cell, caption: str | None = None) -> Table:
    """Budgets down (and under each its selections, when any is a strategy), ``roads`` across (``header(road)``
    their titles); ``cell(row)`` writes the cell of the row of that budget, selection and road, and a missing one
    stays empty."""
    table = Table(title=title, caption=caption)
    table.add_column("labels", justify="right")
    chosen = any(r["selection"] not in (BALANCED, EVERY_LABEL) for r in rows)
    if chosen:
        table.add_column("selection")
    for road in roads:
        table.add_column(header(road), justify="right")
    cells = {(r["budget"], r["selection"], r["road"]): r for r in rows}
    groups = list(dict.fromkeys((r["budget"], r["selection"]) for r in rows))
    for index, (budget, selection) in enumerate(groups):
        first = next(r for r in rows if (r["budget"], r["selection"]) == (budget, selection))
        labels = budget if first["fraction"] is None else f"{budget}\n[dim]{first['labels']} images[/]"
        line = [cell(cells[budget, selection, road]) if (budget, selection, road) in cells else "" for road in roads]
        last_of_budget = index + 1 == len(groups) or groups[index + 1][0] != budget
        table.add_row(labels, *([selection] if chosen else []), *line, end_section=chosen and last_of_budget)
    return table


def summary_table(summary: list[dict], pretrain: dict | None) -> Table:
    """Budgets (and selections) down, roads across: mean ± std over seeds, and under it a run's wall time and
    CPU-minutes (all its processes' CPU time: what it costs on a shared machine, where wall time varies)."""
    caption = None
    if pretrain is not None and pretrain.get("wall_s") is not None:
        cost = cost_text(pretrain["wall_s"], pretrain["cpu_s"])
        caption = f"pretraining: {cost}, once for every road from the pretrained encoder"

    def cell(row: dict) -> str:
        text = mean_std_text(row["top1_mean"], row["top1_std"])
        if row["n_failed"]:
            text += f"\n[red]{row['n_failed']} failed[/]"
        if row["wall_s_mean"] is not None:
            text += f"\n[dim]{cost_text(row['wall_s_mean'], row['cpu_s_mean'])}[/]"
        return text

    roads = [road for road in ROADS if any(row["road"] == road for row in summary)]
    title = "label efficiency: test top-1, mean ± std over seeds (wall time and CPU-minutes per run)"
    return budget_grid(title, summary, roads, column_header, cell, caption)


def cost_text(wall_s: float, cpu_s: float | None) -> str:
    """A run's cost in a few characters, ``"301 s, 10.7 CPU-min"``; the wall seconds alone when CPU time is unknown."""
    return f"{wall_s:.0f} s" + ("" if cpu_s is None else f", {cpu_s / 60:.1f} CPU-min")


def gain_cell(row: dict) -> str:
    """A paired gain: green when ahead on every seed, red when behind on average; on how many seeds it leads."""
    mean, std = row["gain_mean"], row["gain_std"]
    colour = "green" if mean > 0 and row["seeds_ahead"] == row["n_seeds"] else "red" if mean < 0 else "yellow"
    text = f"[{colour}]{mean:+.4f}[/]" + ("" if std is None else f" ± {std:.4f}")
    return text + f"\n[dim]ahead on {row['seeds_ahead']} of {row['n_seeds']} seeds[/]"


GAINS_TITLES = {
    PRETRAINING: "what pretraining buys: from the encoder - from scratch, on the same labelled images",
    UNLABELLED: "what the unlabelled images buy: the road that learns from them - its start without them",
}


def gains_table(gains: list[dict], pairs: tuple[tuple[str, str], ...] = PRETRAINING) -> Table:
    """Budgets (and selections) down; across, each pair of ``pairs`` that ``gains`` holds: its paired gain, mean
    ± std over seeds, and the seeds it leads on."""
    shown = [pair for pair in pairs if any((g["road"], g["versus"]) == pair for g in gains)]
    cells = [{**g, "road": f"{g['road']} - {g['versus']}"} for g in gains if (g["road"], g["versus"]) in shown]
    columns = [f"{road} - {versus}" for road, versus in shown]
    title = f"{GAINS_TITLES[pairs]}, mean ± std"
    return budget_grid(title, cells, columns, lambda column: column.replace(" - ", "\n- "), gain_cell)


def selection_table(gains: list[dict]) -> Table | None:
    """Budgets and selections down, roads across: each road with the selection minus with the baseline selection
    (paired by seed); None when no selection was measured against another."""
    gains = [g for g in gains if g["versus"] in SELECTION_BASELINES]
    if not gains:
        return None
    roads = [road for road in SELECTION_ROADS if any(row["road"] == road for row in gains)]
    title = f"what selection buys: road with the selection - with {gains[0]['versus']}, same budget and seed"
    return budget_grid(title, gains, roads, column_header, gain_cell)


# --------------------------------------------------------------------------- plot


def plot(summary: list[dict], seeds: int, path: Path, scratch_factor: int = 3) -> Any:
    """Save test top-1 against the budget (log axis), one line per plotted road, one panel per selection (the
    budget of every label, made once, closes every panel's lines).

    Returns:
        The matplotlib Figure, or None without matplotlib.
    """
    selections = list(dict.fromkeys(r["selection"] for r in summary if r["selection"] != EVERY_LABEL))
    selections = selections or [EVERY_LABEL]
    figure = new_figure(max(6.5, 4.2 * len(selections)), 4.2, panels=len(selections))
    if figure is None:
        return None
    by_fraction = all(r["fraction"] is not None for r in summary)
    budgets = sorted({float(r["budget"]) for r in summary})
    labels = {road.name: road.label.format(factor=scratch_factor) for road in plotted()}
    if scratch_factor == 1:
        labels["scratch-best"] = "scratch"
    for axes, selection in zip(figure.axes, selections):
        for road, label in labels.items():
            rows = [r for r in summary if r["road"] == road and r["selection"] in (selection, EVERY_LABEL)]
            rows.sort(key=lambda r: float(r["budget"]))
            style = {"color": colour(road)}
            if ROADS[road].twin is not None:  # from random weights: beside its pretrained twin
                style.update(linestyle="--", markerfacecolor="white")
            if rows:
                error_bars(axes, [float(r["budget"]) for r in rows], rows, "top1", label, **style)
        axes.set_xscale("log")
        axes.set_xticks(budgets, [f"{b:g}" for b in budgets])
        axes.minorticks_off()
        axes.set_xlabel("fraction of the training labels" if by_fraction else "labelled training images")
        if len(selections) > 1:
            axes.set_title(PANEL_TITLES.get(selection, f"labels chosen by {selection}"), fontsize="medium")
    figure.axes[0].set_ylabel("test top-1")
    save_plot(figure, "test top-1 against labels", seeds, path)
    return figure
