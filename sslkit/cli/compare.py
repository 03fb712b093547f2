"""Compare pretraining recipes at equal training time: kNN, linear probe, fine-tune with few labels, images/s.

    sslkit-compare RECIPE [RECIPE ...] --minutes M [--seeds N] [--seeds-for NAME=N ...] [--out DIR]
                   [--fraction 0.01] [--finetune-recipe R] [--scratch-recipe R] [--no-finetune]
                   [--calibration-steps 30]
                   [--launcher "..."] [--finetune-override K=V ...] [key.sub=value ...]
    sslkit-compare fashion_mnist_simclr fashion_mnist_byol fashion_mnist_dino --minutes 10 \\
        --seeds-for fashion_mnist_simclr=2 train.threads=1

Every recipe (one per method) gets the same budget of training time, not the same epochs: a
method whose step costs twice as much trains half as many steps. For each recipe:

1. **calibration**: the recipe runs ``--calibration-steps`` steps after 10 warm-up steps (oneDNN
   builds its kernels on the first calls; the warm-up is not timed), and its training images/s is
   what the loop logged over the timed steps (``metrics.jsonl``);
2. **the budget**: ``steps = minutes x 60 x images/s / images per step`` (``train.batch_size x
   train.grad_accum_steps``), given to the run as
   ``train.max_steps`` (the learning-rate and momentum schedules span exactly those steps) and
   ``train.epochs`` (the epochs they need);
3. **pretraining**, one run per seed: its kNN and linear probe with every label, as the run
   evaluates itself;
4. **fine-tune** with ``--fraction`` of the labels (default 0.01), as ``sslkit-label-efficiency``'s
   fine-tune road builds it (its fine-tune recipe, ``run.init_from`` the pretrained run, the labelled
   subset of the seed), and the same network trained **from scratch** on the same labels, once per
   seed (``--scratch-recipe``, by default the fine-tune recipe): the baseline a fine-tune must beat.

Every run is the user's own command in its own process (``python -m sslkit.cli.pretrain RECIPE
<overrides> ...``, or ``--launcher`` with ``-m``), in ``OUT/runs``. The comparison is resumable:
a run whose ``results.json`` exists is skipped, any other one continues from its last checkpoint;
a finished calibration is read again, so a resumed comparison trains the steps it planned. Every
config is validated before anything runs (exit status 2, one line).

OUT receives, updated after every run:

- ``results.csv`` / ``results.json``: one row per recipe and seed: images/s of the calibration and of
  the training, steps, epochs, training seconds (the loop's timed windows: no evaluation or
  checkpoints), status, error, and the metrics (``knn_top1``, ``linear_top1``, ``finetune_top1``);
  the scratch runs are rows too;
- ``summary.csv``: mean and sample standard deviation over seeds, per recipe;
- ``logs/<run>.out`` / ``.err``: each run's stdout and stderr.

Training time is wall time: on a machine shared with other jobs, the images/s of the calibration
and of the training both go into the table, so that a point slowed down shows.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from sslkit.cli import label_efficiency, sweep
from sslkit.cli.label_efficiency import SAME_AS_PRETRAINED
from sslkit.config import Config, find_recipe, flatten, load_config, to_dict
from sslkit.console import console, print_table, print_user_error
from sslkit.errors import UserError

WARMUP_STEPS = 10  # untimed steps of a calibration
LOG_EVERY = 5  # the calibration's log window: every window after the warm-up is timed
METRICS = ("knn_top1", "linear_top1", "finetune_top1")
# Set by this tool for every run; an override of them would break its bookkeeping.
RESERVED_KEYS = (
    *label_efficiency.RESERVED_KEYS,
    "train.max_steps",
    "train.epochs",
    "run.seed",
)
# What a calibration leaves out: it times the training steps, its evaluation is not read.
CALIBRATION = [
    "train.knn_every_epochs=0",
    "eval.linear_epochs=0",
    "eval.compare_random_init=false",
    "eval.compare_raw_pixels=false",
    f"train.log_every_steps={LOG_EVERY}",
]


@dataclass(frozen=True)
class Entry:
    """One recipe of the comparison: its file, its name in the tables (the file's stem) and its seeds."""

    recipe: Path
    seeds: tuple[int, ...]
    images_per_step: int  # train.batch_size x train.grad_accum_steps
    steps_per_epoch: int  # training images // images_per_step

    @property
    def name(self) -> str:
        return self.recipe.stem


# --------------------------------------------------------------------------- the command line, checked


def parse_seeds_for(texts: list[str], names: list[str]) -> dict[str, int]:
    """``--seeds-for NAME=N`` (repeatable) -> ``{NAME: N}``; NAME is a recipe's name as the tables show it."""
    counts = {}
    for text in texts:
        name, _, count = text.partition("=")
        name = Path(name.strip()).stem
        if name not in names:
            raise UserError(f"--seeds-for '{text}': {name} is not one of the recipes ({', '.join(names)})")
        try:
            counts[name] = int(count)
        except ValueError:
            raise UserError(f"--seeds-for '{text}' must be NAME=N, e.g. --seeds-for {names[0]}=2") from None
        if counts[name] < 1:
            raise UserError(f"--seeds-for '{text}': a recipe runs at least 1 seed")
    return counts


def split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """The positional arguments: recipes (no ``=``) and ``key.sub=value`` overrides."""
    recipes = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    if not recipes:
        raise UserError("no recipe given: sslkit-compare RECIPE [RECIPE ...] --minutes M, e.g. quickstart")
    for text in overrides:
        if text.partition("=")[0].strip() in RESERVED_KEYS:
            raise UserError(
                f"override '{text}': compare sets {text.partition('=')[0].strip()} for every run "
                f"(the budget sets the steps; use --minutes, --seeds, --fraction or --out instead)"
            )
    return recipes, overrides


def steps_per_epoch(cfg: Config) -> int:
    """Optimizer steps in an epoch of the recipe's training set (the loader drops the last partial batch)."""
    from sslkit import methods
    from sslkit.datasets import build_splits

    splits = build_splits(cfg, labelled_training=methods.METHODS[cfg.method.name].needs_labels)
    return max(1, len(splits.train) // cfg.train.batch_size // cfg.train.grad_accum_steps)


def build_entries(args: argparse.Namespace, recipes: list[str], overrides: list[str]) -> list[Entry]:
    """Every recipe, loaded and validated, with its seeds; the recipes must train on the same images."""
    paths = [find_recipe(Path(text)).resolve() for text in recipes]
    names = [path.stem for path in paths]
    if len(set(names)) < len(names):
        raise UserError(f"two recipes have the same name ({', '.join(names)}): the tables tell them apart by name")
    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    counts = parse_seeds_for(args.seeds_for, names)
    entries, data = [], None
    for path in paths:
        try:
            cfg = load_config(path, overrides)
        except UserError as error:
            raise UserError(f"{path.name}: {error}") from None
        if data is not None and cfg.data.name != data[1]:
            raise UserError(
                f"{path.name} trains on data.name={cfg.data.name}, {data[0]} on {data[1]}: compare recipes on the "
                f"same images (or pass data.name=... for every recipe)"
            )
        data = data or (path.name, cfg.data.name)
        seeds = tuple(cfg.run.seed + i for i in range(counts.get(path.stem, args.seeds)))
        entries.append(Entry(path, seeds, cfg.train.batch_size * cfg.train.grad_accum_steps, steps_per_epoch(cfg)))
    return entries


# --------------------------------------------------------------------------- the runs


def calibration_run(entry: Entry, overrides: list[str], runs_dir: Path, args) -> label_efficiency.Run:
    steps = [f"train.max_steps={WARMUP_STEPS + args.calibration_steps}", f"train.epochs={entry.steps_per_epoch}"]
    own = [*overrides, *CALIBRATION, *steps]
    return label_efficiency.trained_run(
        f"calibrate-{entry.name}", "calibrate", entry.recipe, own, runs_dir, args.launcher
    )


def images_per_s(metrics_path: Path, images_per_step: int, after_step: int = 0) -> tuple[float, float] | None:
    """(images/s, seconds) over the log windows of ``metrics.jsonl`` that end after ``after_step``.

    A window's record holds its last step and its images/s; its images are the steps since the
    previous record times the images of a step (a window covers the steps since the last line).
    """
    try:
        lines = metrics_path.read_text().splitlines()
    except OSError:
        return None
    images = seconds = 0.0
    previous = 0
    for line in lines:
        record = json.loads(line)
        if "images_per_s" not in record:
            continue  # a kNN monitor line
        count = (record["step"] - previous) * images_per_step
        previous = record["step"]
        if record["step"] > after_step and record["images_per_s"] > 0:
            images, seconds = images + count, seconds + count / record["images_per_s"]
    return (images / seconds, seconds) if seconds else None


def budget_steps(minutes: float, speed: float, images_per_step: int) -> int:
    """Optimizer steps that take ``minutes`` at ``speed`` images/s (at least 1)."""
    return max(1, math.floor(minutes * 60 * speed / images_per_step))


def training_runs(entry: Entry, steps: int, overrides: list[str], runs_dir: Path, args, finetune: Path | None):
    """The pretraining runs of ``entry`` (one per seed) and their fine-tunes, in order."""
    budget = [f"train.max_steps={steps}", f"train.epochs={math.ceil(steps / entry.steps_per_epoch)}"]
    runs = []
    for seed in entry.seeds:
        name = f"{entry.name}-s{seed}"
        runs.append(
            label_efficiency.trained_run(
                name, "pretrain", entry.recipe, [*overrides, *budget, f"run.seed={seed}"], runs_dir, args.launcher
            )
        )
        if finetune is not None:
            runs.append(
                label_efficiency.trained_run(
                    f"finetune-{name}",
                    "finetune",
                    finetune,
                    [*overrides, *args.finetune_overrides],
                    runs_dir,
                    args.launcher,
                    (name,),
                    (args.fraction, seed),
                    **{"run.init_from": runs_dir / name},
                )
            )
    return runs


def scratch_runs(seeds: list[int], overrides: list[str], runs_dir: Path, args, scratch: Path):
    """The scratch recipe from random weights on each seed's labelled subset: the fine-tunes' baseline."""
    own = [*overrides, *args.finetune_overrides]
    return [
        label_efficiency.trained_run(
            f"scratch-s{seed}",
            "scratch",
            scratch,
            own,
            runs_dir,
            args.launcher,
            (),
            (args.fraction, seed),
            **{"run.init_from": "null"},
        )
        for seed in seeds
    ]


def check_run(run: label_efficiency.Run, encoder: dict | None = None, saved: bool = True) -> None:
    """Validate a run's config (the pretrained start, which may not exist yet, aside); a fine-tune must build
    the pretrained network on its images (``encoder``: the pretraining's config); with ``saved``, refuse a
    run directory made with other settings.

    Raises:
        UserError: naming the run and what is wrong.
    """
    kept = [o for o in run.overrides if not o.startswith("run.init_from=") or o == "run.init_from=null"]
    try:
        cfg = load_config(run.recipe, kept)
    except UserError as error:
        raise UserError(f"run {run.name}: {error}") from None
    if encoder is not None:
        own = to_dict(cfg)
        for key in SAME_AS_PRETRAINED:
            section, name = key.split(".")
            if (mine := own[section][name]) != (theirs := encoder[section][name]):
                raise UserError(
                    f"run {run.name}: {key}={mine}, but the pretrained encoder has {key}={theirs}; pass "
                    f"--finetune-override {key}={theirs} or another --{run.kind}-recipe"
                )
    if not saved:
        return
    wanted = flatten(to_dict(cfg))
    wanted.update(dict(o.split("=", 1) for o in run.overrides if o.startswith("run.init_from=")))
    sweep.refuse_changed_run(run.run_dir, wanted, label_efficiency.PATH_KEYS, "comparison")


# --------------------------------------------------------------------------- rows and tables


def point_row(entry: Entry, seed: int, plan: dict, by_name: dict[str, dict]) -> dict:
    """One recipe and seed: the pretraining's record, its fine-tune's metric, speeds and steps."""
    name = f"{entry.name}-s{seed}"
    row = {
        "recipe": entry.name,
        "seed": seed,
        "status": "failed",
        "error": None,
        "calibration_images_per_s": plan.get("images_per_s"),
        "steps": plan.get("steps"),
        "epochs": None if plan.get("steps") is None else math.ceil(plan["steps"] / entry.steps_per_epoch),
        "images_per_s": None,
        "train_s": None,
        "wall_s": None,
        "metrics": {},
    }
    calibration = by_name.get(f"calibrate-{entry.name}")
    if calibration is not None and calibration["status"] != "ok":
        return {**row, "error": f"calibration failed: {calibration['error']}"}
    record = by_name.get(name)
    if record is None:
        return {**row, "status": "not run", "error": plan.get("error")}
    speed = images_per_s(Path(record["result"]).parent / "metrics.jsonl", entry.images_per_step)
    row.update(
        status=record["status"], error=record["error"], wall_s=record["wall_s"], metrics=dict(record["metrics"])
    )
    if speed is not None:
        row.update(images_per_s=speed[0], train_s=speed[1])
    finetune = by_name.get(f"finetune-{name}")
    if finetune is not None:
        if finetune["status"] == "ok" and "finetune_top1" in finetune["metrics"]:
            row["metrics"]["finetune_top1"] = finetune["metrics"]["finetune_top1"]
        elif row["status"] == "ok":
            row.update(status="failed", error=f"fine-tune: {finetune['error']}")
    return row


def scratch_row(record: dict) -> dict:
    return {
        "recipe": "scratch",
        "seed": record["seed"],
        "status": record["status"],
        "error": record["error"],
        "calibration_images_per_s": None,
        "steps": None,
        "epochs": None,
        "images_per_s": None,
        "train_s": None,
        "wall_s": record["wall_s"],
        "metrics": {k: v for k, v in record["metrics"].items() if k == "finetune_top1"},
    }


SPEEDS = ("calibration_images_per_s", "images_per_s", "train_s", "steps")


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and sample standard deviation (None with one seed) over seeds, per recipe; failed rows are counted."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["recipe"], []).append(row)
    summary = []
    for recipe, members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        line = {"recipe": recipe, "n_ok": len(ok), "n_failed": len(members) - len(ok)}
        for key in (*METRICS, *SPEEDS):
            values = [r["metrics"].get(key) if key in METRICS else r[key] for r in ok]
            values = [v for v in values if v is not None]
            line[f"{key}_mean"] = statistics.fmean(values) if values else None
            line[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else None
        summary.append(line)
    return summary


def write_tables(out: Path, rows: list[dict], records: list[dict], header: dict) -> list[dict]:
    """results.csv, results.json and summary.csv; returns the summary rows."""
    columns = ["recipe", "seed", "status", "error", *SPEEDS[:2], "steps", "epochs", "train_s", "wall_s", *METRICS]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            cells = {**row, **row["metrics"], "error": row["error"] or ""}
            writer.writerow(
                [
                    sweep.csv_number(cells.get(c)) if c in (*METRICS, *SPEEDS[:3], "wall_s") else cells.get(c, "")
                    for c in columns
                ]
            )
    (out / "results.json").write_text(json.dumps({**header, "points": rows, "runs": records}, indent=2))
    summary = summarize(rows)
    keys = [f"{key}_{s}" for key in (*METRICS, *SPEEDS) for s in ("mean", "std")]
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["recipe", "n_ok", "n_failed", *keys])
        for line in summary:
            writer.writerow(
                [line["recipe"], line["n_ok"], line["n_failed"], *(sweep.csv_number(line[k]) for k in keys)]
            )
    return summary


def summary_table(summary: list[dict], minutes: float, fraction: float) -> Table:
    """Recipes down; kNN, linear probe, fine-tune at ``fraction``, images/s and training time across."""
    table = Table(title=f"comparison at {minutes:g} min of training: mean ± std over seeds")
    for title in ("recipe", "seeds ok", "kNN", "linear", f"fine-tune {fraction:g}", "img/s", "steps", "train s"):
        table.add_column(title, justify="left" if title == "recipe" else "right", no_wrap=title == "recipe")

    def cell(line: dict, key: str, digits: int = 4) -> str:
        mean, std = line[f"{key}_mean"], line[f"{key}_std"]
        if mean is None:
            return "-"
        return f"{mean:.{digits}f}" + ("" if std is None or digits == 0 else f" ± {std:.{digits}f}")

    for line in summary:
        seeds = f"{line['n_ok']}/{line['n_ok'] + line['n_failed']}"
        table.add_row(
            line["recipe"],
            seeds if not line["n_failed"] else f"[red]{seeds}",
            *(cell(line, key) for key in METRICS),
            cell(line, "images_per_s", 0),
            cell(line, "steps", 0),
            cell(line, "train_s", 0),
        )
    return table


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-compare",
        description="Train every recipe for the same time and tabulate kNN, linear probe, fine-tune and images/s.",
    )
    parser.add_argument(
        "items",
        nargs="+",
        metavar="RECIPE|key=value",
        help="recipes (files or bundled names, one per method) and dotted overrides for every run, "
        "e.g. fashion_mnist_simclr fashion_mnist_byol train.threads=1",
    )
    parser.add_argument("--minutes", type=float, required=True, help="training time per run, in minutes")
    parser.add_argument(
        "--seeds", type=int, default=1, help="seeds per recipe: run.seed = s, s+1, ... from its run.seed (default 1)"
    )
    parser.add_argument(
        "--seeds-for",
        action="append",
        default=[],
        metavar="NAME=N",
        help="another number of seeds for one recipe (its file name without .yaml), e.g. fashion_mnist_simclr=2",
    )
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: <run.output_dir>/compare)")
    parser.add_argument(
        "--fraction", type=float, default=0.01, help="the fine-tune's and scratch runs' labels (default 0.01)"
    )
    parser.add_argument(
        "--finetune-recipe",
        default=None,
        help="the fine-tune recipe (default: fashion_mnist_finetune or quickstart_finetune)",
    )
    parser.add_argument(
        "--scratch-recipe",
        default=None,
        help="the scratch runs' recipe (default: the fine-tune recipe), e.g. fashion_mnist_scratch",
    )
    parser.add_argument("--no-finetune", action="store_true", help="kNN and linear probe only")
    parser.add_argument(
        "--calibration-steps",
        type=int,
        default=30,
        help=f"timed steps of the calibration, after {WARMUP_STEPS} untimed ones (default 30)",
    )
    parser.add_argument(
        "--launcher", default=None, help='a prefix for multi-process runs, e.g. "accelerate launch --cpu"'
    )
    parser.add_argument(
        "--finetune-override",
        dest="finetune_overrides",
        action="append",
        default=[],
        metavar="KEY=V",
        help="an override for the fine-tune and scratch runs only (repeatable)",
    )
    return parser.parse_intermixed_args(argv)


@dataclass
class Plan:
    """What the command line resolves to."""

    entries: list[Entry]
    overrides: list[str]
    out: Path
    finetune: Path | None  # None: --no-finetune
    scratch: Path | None  # --scratch-recipe, else the fine-tune recipe


def build_plan(args: argparse.Namespace) -> Plan:
    """Check the command line and every recipe; raises UserError naming what is wrong."""
    recipes, overrides = split_items(args.items)
    if not args.minutes > 0 or math.isinf(args.minutes):
        raise UserError(f"--minutes must be a positive number of minutes, got {args.minutes:g}")
    if not 0 < args.fraction <= 1:
        raise UserError(f"--fraction must be in (0, 1] (0.01 keeps 1% of the labels), got {args.fraction:g}")
    if args.calibration_steps < 1:
        raise UserError(f"--calibration-steps must be at least 1, got {args.calibration_steps}")
    for text in args.finetune_overrides:
        if text.partition("=")[0].strip() in label_efficiency.RESERVED_KEYS:
            raise UserError(f"--finetune-override '{text}': compare sets {text.partition('=')[0]} for every run")
    entries = build_entries(args, recipes, overrides)
    base = load_config(entries[0].recipe, overrides)
    finetune = scratch = None
    if not args.no_finetune:
        finetune = find_recipe(args.finetune_recipe) if args.finetune_recipe else None
        finetune = (finetune or label_efficiency.default_recipe("finetune", base.data.name)).resolve()
        scratch = find_recipe(args.scratch_recipe).resolve() if args.scratch_recipe else finetune
    out = (args.out or Path(base.run.output_dir) / "compare").resolve()
    return Plan(entries, overrides, out, finetune, scratch)


def check_plan(plan: Plan, args) -> list[label_efficiency.Run]:
    """Validate every run before anything runs; returns the calibrations. The training runs are checked with a
    stand-in budget (their steps come from the calibration) and checked again once it is known."""
    runs_dir = plan.out / "runs"
    calibrations = [calibration_run(e, plan.overrides, runs_dir, args) for e in plan.entries]
    for run in calibrations:
        check_run(run)
    for entry in plan.entries:
        encoder = to_dict(load_config(entry.recipe, plan.overrides))
        for run in training_runs(entry, 1, plan.overrides, runs_dir, args, plan.finetune):
            check_run(run, encoder if run.kind == "finetune" else None, saved=False)
    encoder = to_dict(load_config(plan.entries[0].recipe, plan.overrides))
    for run in scratch_runs(all_seeds(plan), plan.overrides, runs_dir, args, plan.scratch) if plan.scratch else []:
        check_run(run, encoder)
    return calibrations


def all_seeds(plan: Plan) -> list[int]:
    return sorted({seed for entry in plan.entries for seed in entry.seeds})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = build_plan(args)
        calibrations = check_plan(plan, args)
    except UserError as error:
        print_user_error(error)
        return 2
    out, runs_dir = plan.out, plan.out / "runs"
    out.mkdir(parents=True, exist_ok=True)
    header = {
        "recipes": [str(e.recipe) for e in plan.entries],
        "overrides": plan.overrides,
        "minutes": args.minutes,
        "seeds": {e.name: list(e.seeds) for e in plan.entries},
        "fraction": args.fraction,
        "finetune_recipe": None if plan.finetune is None else str(plan.finetune),
        "scratch_recipe": None if plan.scratch is None else str(plan.scratch),
        "finetune_overrides": args.finetune_overrides,
        "calibration_steps": args.calibration_steps,
        "launcher": args.launcher,
    }
    console.print(
        f"comparison: {len(plan.entries)} recipes at {args.minutes:g} min of training each -> {out}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    previous = sweep.previous_wall_times(out / "results.json", "runs")
    calibrated = sweep.run_jobs([run.job() for run in calibrations], out, previous, lambda _: None, "calibrations")
    if calibrated is None:
        return 130

    # ------------------------------------------------------------------ the budget: steps from the measured speed
    plans, runs = {}, []
    for entry, record in zip(plan.entries, calibrated):
        if record["status"] != "ok":
            plans[entry.name] = {}
            continue
        metrics = runs_dir / f"calibrate-{entry.name}" / "metrics.jsonl"
        speed = images_per_s(metrics, entry.images_per_step, WARMUP_STEPS)
        if speed is None:
            plans[entry.name] = {"error": "its calibration logged no timed steps; raise --calibration-steps"}
            continue
        steps = budget_steps(args.minutes, speed[0], entry.images_per_step)
        plans[entry.name] = {"images_per_s": speed[0], "steps": steps}
        console.print(
            f"{entry.name}: {speed[0]:.0f} img/s over {args.calibration_steps} calibration steps -> {steps} steps "
            f"({steps / entry.steps_per_epoch:.1f} epochs)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        runs += training_runs(entry, steps, plan.overrides, runs_dir, args, plan.finetune)
    if plan.finetune is not None:
        runs += scratch_runs(all_seeds(plan), plan.overrides, runs_dir, args, plan.scratch)
    try:
        for run in runs:
            check_run(run)  # a run directory of this comparison planned with another budget is refused
    except UserError as error:
        print_user_error(error)
        return 2

    def tables(records: list[dict]) -> list[dict]:
        by_name = {r["name"]: r for r in [*calibrated, *records]}
        rows = [point_row(e, seed, plans[e.name], by_name) for e in plan.entries for seed in e.seeds]
        rows += [scratch_row(r) for r in records if r["kind"] == "scratch"]
        return write_tables(out, rows, [*calibrated, *records], {**header, "plans": plans, "wall_times": previous})

    records = sweep.run_jobs([run.job() for run in runs], out, previous, tables, "runs")
    if records is None:
        return 130
    summary = tables(records)
    print_table(summary_table(summary, args.minutes, args.fraction))
    console.print(
        f"results: {out / 'results.csv'}, {out / 'summary.csv'}, {out / 'results.json'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return sweep.exit_status([*calibrated, *records], out, "runs")


if __name__ == "__main__":
    sys.exit(main())
