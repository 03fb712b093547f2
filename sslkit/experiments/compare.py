"""Compare pretraining recipes at equal training time: kNN, linear probe, fine-tune with few labels, images/s.

    plan = plan_comparison(["fashion_mnist_simclr", "fashion_mnist_byol"], minutes=10, overrides=["train.threads=1"])
    outcome = run_comparison(plan, LocalExecutor(jobs=2))  # its table and notes to show, and the exit status

is ``sslkit-compare fashion_mnist_simclr fashion_mnist_byol --minutes 10 --jobs 2 train.threads=1``
(:mod:`sslkit.cli.compare`); every keyword of :func:`plan_comparison` is the option of that name, and
its errors name the options.

Every recipe (one per method) gets the same budget of training time, not the same epochs: a
method whose step costs twice as much trains half as many steps. For each recipe:

1. **calibration**: the recipe runs ``--calibration-steps`` steps after 10 warm-up steps (oneDNN
   builds its kernels on the first calls; the warm-up is not timed), and its training images/s is
   what the loop logged over the timed steps (``metrics.jsonl``; :mod:`sslkit.experiments.calibration`);
2. **the budget**: ``steps = minutes x 60 x images/s / images per step`` (``train.batch_size x
   train.grad_accum_steps``; FixMatch's steps load ``method.mu`` unlabelled images per labelled one
   besides), given to the run as
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
  checkpoints), the run's wall and CPU seconds (``wall_s``, ``cpu_s``), status, error, and the
  metrics (``knn_top1``, ``linear_top1``, ``finetune_top1``); the scratch runs are rows too;
- ``summary.csv``: mean and sample standard deviation over seeds, per recipe;
- ``logs/<run>.out`` / ``.err``: each run's stdout and stderr.

Training time is wall time: on a machine shared with other jobs, the images/s of the calibration
and of the training both go into the table, so that a point slowed down shows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from sslkit.config import Config, find_recipe, load_config, to_dict
from sslkit.console import console
from sslkit.errors import UserError
from sslkit.experiments import runner, runs
from sslkit.experiments.calibration import CALIBRATION, WARMUP_STEPS, budget_steps, images_per_s
from sslkit.experiments.executor import Executor
from sslkit.experiments.experiment import Experiment, Outcome, finished, interrupted, run_experiment
from sslkit.experiments.jobs import TIMES, Job
from sslkit.experiments.local import LocalExecutor
from sslkit.experiments.runs import SAME_AS_PRETRAINED, Run, first_difference, refuse_reserved, trained_run
from sslkit.experiments.stats import mean_std
from sslkit.experiments.tables import csv_number, mean_std_text, seeds_text, write_csv, write_json

METRICS = ("knn_top1", "linear_top1", "finetune_top1")
# Set by this tool for every run besides what every trained run is given: the budget, and the seeds.
RESERVED_KEYS = (*runs.RESERVED_KEYS, "train.max_steps", "train.epochs", "run.seed")


@dataclass(frozen=True)
class Entry:
    """One recipe of the comparison: its file, its name in the tables (the file's stem) and its seeds."""

    recipe: Path
    seeds: tuple[int, ...]
    images_per_step: int  # images loaded for one optimizer step (images_per_step())
    steps_per_epoch: int  # optimizer steps in an epoch (steps_per_epoch())

    @property
    def name(self) -> str:
        return self.recipe.stem


@dataclass
class Plan:
    """Everything the comparison is asked for, resolved: its recipes, overrides, budget and where it goes."""

    entries: list[Entry]
    overrides: list[str]
    out: Path
    finetune: Path | None  # None: no fine-tune (kNN and linear probe only)
    scratch: Path | None  # the scratch runs' recipe, else the fine-tune recipe
    minutes: float
    fraction: float
    calibration_steps: int
    launcher: str | None
    finetune_overrides: list[str]

    @property
    def runs_dir(self) -> Path:
        return self.out / "runs"

    def seeds(self) -> list[int]:
        """Every seed of any recipe: the scratch runs' seeds."""
        return sorted({seed for entry in self.entries for seed in entry.seeds})


# --------------------------------------------------------------------------- the plan, checked


def parse_seeds_for(texts: Sequence[str], names: list[str]) -> dict[str, int]:
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


def check_recipes_and_overrides(recipes: Sequence[str | Path], overrides: list[str]) -> None:
    """Refuse an empty comparison, and overrides of the keys this tool sets itself."""
    if not recipes:
        raise UserError("no recipe given: sslkit-compare RECIPE [RECIPE ...] --minutes M, e.g. quickstart")
    why = "compare sets {key} for every run (the budget sets the steps; use --minutes, --seeds, --fraction or --out)"
    refuse_reserved(overrides, RESERVED_KEYS, "override", why)


def steps_per_epoch(cfg: Config) -> int:
    """Optimizer steps in an epoch of the recipe, as its run counts them: the batches of its training loader
    (FixMatch's: a pass over the unlabelled images, :mod:`sslkit.datasets.two_streams`) in windows of
    ``train.grad_accum_steps`` (:class:`sslkit.loop.state.Schedule`)."""
    from sslkit import methods
    from sslkit.datasets import build_splits
    from sslkit.loop.build import make_train_loader

    splits = build_splits(cfg, labelled_training=methods.METHODS[cfg.method.name].needs_labels)
    loader, _ = make_train_loader(cfg, splits.train, cfg.train.batch_size)
    return max(1, math.ceil(len(loader) / cfg.train.grad_accum_steps))


def images_per_step(cfg: Config) -> int:
    """Images an optimizer step loads, as the run's images/s counts them: the images a batch of ``train.batch_size``
    loads (:meth:`~sslkit.methods.base.Method.images_per_batch`: FixMatch's ``method.mu`` unlabelled images per
    labelled one besides), ``train.grad_accum_steps`` times."""
    from sslkit import methods

    method = methods.METHODS[cfg.method.name]
    return method.images_per_batch(cfg, cfg.train.batch_size) * cfg.train.grad_accum_steps


def build_entries(recipes: Sequence[str | Path], overrides: list[str], seeds: int, seeds_for: Sequence[str]):
    """Every recipe, loaded and validated, with its seeds; the recipes must train on the same images."""
    paths = [find_recipe(Path(text)).resolve() for text in recipes]
    names = [path.stem for path in paths]
    if len(set(names)) < len(names):
        raise UserError(f"two recipes have the same name ({', '.join(names)}): the tables tell them apart by name")
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    counts = parse_seeds_for(seeds_for, names)
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
        own = tuple(cfg.run.seed + i for i in range(counts.get(path.stem, seeds)))
        entries.append(Entry(path, own, images_per_step(cfg), steps_per_epoch(cfg)))
    return entries


def plan_comparison(
    recipes: Sequence[str | Path],
    minutes: float,
    *,
    overrides: Sequence[str] = (),
    seeds: int = 1,
    seeds_for: Sequence[str] | Mapping[str, int] = (),
    out: str | Path | None = None,
    fraction: float = 0.01,
    finetune_recipe: str | Path | None = None,
    scratch_recipe: str | Path | None = None,
    finetune: bool = True,
    calibration_steps: int = 30,
    launcher: str | None = None,
    finetune_overrides: Sequence[str] = (),
) -> Plan:
    """The comparison resolved and checked, every run's config validated, before anything runs.

    Args:
        recipes: the recipes to compare (files or bundled names, one per method), on the same images.
        minutes: the training time of every pretraining run.
        overrides: for every run, e.g. ``["train.threads=1"]``.
        seeds: seeds per recipe: ``run.seed`` = s, s+1, ... from its recipe's; ``seeds_for`` another
            number for some recipes by name (``{"fashion_mnist_simclr": 2}`` or ``["fashion_mnist_simclr=2"]``).
        out: the output directory (default ``<run.output_dir>/compare``).
        fraction: the labels of the fine-tune and scratch runs.
        finetune_recipe: defaults to the bundled one for the recipes' dataset; ``scratch_recipe`` to it.
        finetune: False: kNN and linear probe only.
        calibration_steps: timed steps of each recipe's calibration, after ``WARMUP_STEPS`` untimed ones.
        launcher: a prefix for multi-process runs, e.g. ``"accelerate launch --cpu"``.
        finetune_overrides: for the fine-tune and scratch runs only.

    Raises:
        UserError: naming what is wrong: a bad budget, fraction, override, recipe or run config.
    """
    overrides, finetune_overrides = list(overrides), list(finetune_overrides)
    if isinstance(seeds_for, Mapping):
        seeds_for = [f"{name}={count}" for name, count in seeds_for.items()]
    check_recipes_and_overrides(recipes, overrides)
    if not minutes > 0 or math.isinf(minutes):
        raise UserError(f"--minutes must be a positive number of minutes, got {minutes:g}")
    if not 0 < fraction <= 1:
        raise UserError(f"--fraction must be in (0, 1] (0.01 keeps 1% of the labels), got {fraction:g}")
    if calibration_steps < 1:
        raise UserError(f"--calibration-steps must be at least 1, got {calibration_steps}")
    why = "compare sets {key} for every run (use --fraction, --seeds or --out)"
    refuse_reserved(finetune_overrides, runs.RESERVED_KEYS, "--finetune-override", why)
    entries = build_entries(recipes, overrides, seeds, seeds_for)
    base = load_config(entries[0].recipe, overrides)
    finetune_path = scratch_path = None
    if finetune:
        finetune_path = find_recipe(finetune_recipe) if finetune_recipe else None
        finetune_path = (finetune_path or runs.default_recipe("finetune", base.data.name)).resolve()
        scratch_path = find_recipe(scratch_recipe).resolve() if scratch_recipe else finetune_path
    out = (Path(out) if out else Path(base.run.output_dir) / "compare").resolve()
    plan = Plan(
        entries=entries,
        overrides=overrides,
        out=out,
        finetune=finetune_path,
        scratch=scratch_path,
        minutes=minutes,
        fraction=fraction,
        calibration_steps=calibration_steps,
        launcher=launcher,
        finetune_overrides=finetune_overrides,
    )
    check_plan(plan)
    return plan


# --------------------------------------------------------------------------- the runs


def calibration_run(plan: Plan, entry: Entry) -> Run:
    steps = [f"train.max_steps={WARMUP_STEPS + plan.calibration_steps}", f"train.epochs={entry.steps_per_epoch}"]
    own = [*plan.overrides, *CALIBRATION, *steps]
    return trained_run(f"calibrate-{entry.name}", "calibrate", entry.recipe, own, plan.runs_dir, plan.launcher)


def training_runs(plan: Plan, entry: Entry, steps: int) -> list[Run]:
    """The pretraining runs of ``entry`` (one per seed) and their fine-tunes, in order."""
    budget = [f"train.max_steps={steps}", f"train.epochs={math.ceil(steps / entry.steps_per_epoch)}"]
    runs_dir, found = plan.runs_dir, []
    for seed in entry.seeds:
        name = f"{entry.name}-s{seed}"
        own = [*plan.overrides, *budget, f"run.seed={seed}"]
        found.append(trained_run(name, "pretrain", entry.recipe, own, runs_dir, plan.launcher))
        if plan.finetune is not None:
            found.append(
                trained_run(
                    f"finetune-{name}",
                    "finetune",
                    plan.finetune,
                    [*plan.overrides, *plan.finetune_overrides],
                    runs_dir,
                    plan.launcher,
                    (name,),
                    (plan.fraction, seed),
                    **{"run.init_from": runs_dir / name},
                )
            )
    return found


def scratch_runs(plan: Plan) -> list[Run]:
    """The scratch recipe from random weights on each seed's labelled subset: the fine-tunes' baseline."""
    own = [*plan.overrides, *plan.finetune_overrides]
    return [
        trained_run(
            f"scratch-s{seed}",
            "scratch",
            plan.scratch,
            own,
            plan.runs_dir,
            plan.launcher,
            (),
            (plan.fraction, seed),
            **{"run.init_from": "null"},
        )
        for seed in plan.seeds()
    ]


def _without_paths(overrides: list[str]) -> list[str]:
    """The overrides but a pretrained start, which may not exist before its pretraining has run."""
    return [o for o in overrides if not o.startswith("run.init_from=") or o == "run.init_from=null"]


def check_run(run: Run, encoder: dict | None = None, saved: bool = True) -> None:
    """Validate a run's config (the pretrained start, which may not exist yet, aside); a fine-tune must build
    the pretrained network on its images (``encoder``: the pretraining's config); with ``saved``, refuse a
    run directory made with other settings.

    Raises:
        UserError: naming the run and what is wrong.
    """
    try:
        cfg = load_config(run.recipe, _without_paths(run.overrides))
    except UserError as error:
        raise UserError(f"run {run.name}: {error}") from None
    if encoder is not None and (differs := first_difference(to_dict(cfg), encoder, SAME_AS_PRETRAINED)):
        key, mine, theirs = differs
        raise UserError(
            f"run {run.name}: {key}={mine}, but the pretrained encoder has {key}={theirs}; pass "
            f"--finetune-override {key}={theirs} or another --{run.kind}-recipe"
        )
    if saved:
        runs.refuse_changed_run_dir(run, cfg)


def check_plan(plan: Plan) -> None:
    """Validate every run before anything runs. The training runs are checked with a stand-in budget (their
    steps come from the calibration) and checked again once it is known."""
    for entry in plan.entries:
        check_run(calibration_run(plan, entry))
    for entry in plan.entries:
        encoder = to_dict(load_config(entry.recipe, plan.overrides))
        for run in training_runs(plan, entry, 1):
            check_run(run, encoder if run.kind == "finetune" else None, saved=False)
    encoder = to_dict(load_config(plan.entries[0].recipe, plan.overrides))
    for run in scratch_runs(plan) if plan.scratch else []:
        check_run(run, encoder)
    # Every seed's subset has the same size: one fine-tune and one scratch run tell whether a batch fits.
    first_finetune = [run for run in training_runs(plan, plan.entries[0], 1) if run.kind == "finetune"][:1]
    for run in [*first_finetune, *(scratch_runs(plan)[:1] if plan.scratch else [])]:
        runs.check_labelled_batch(run, load_config(run.recipe, _without_paths(run.overrides)), "--fraction")


# --------------------------------------------------------------------------- rows and tables


def point_row(entry: Entry, seed: int, budget: dict, by_name: dict[str, dict]) -> dict:
    """One recipe and seed: the pretraining's record, its fine-tune's metric, speeds and steps (``budget``: its
    recipe's, from :func:`calibrated_budget`)."""
    name = f"{entry.name}-s{seed}"
    row = {
        "recipe": entry.name,
        "seed": seed,
        "status": "failed",
        "error": None,
        "calibration_images_per_s": budget.get("images_per_s"),
        "steps": budget.get("steps"),
        "epochs": None if budget.get("steps") is None else math.ceil(budget["steps"] / entry.steps_per_epoch),
        "images_per_s": None,
        "train_s": None,
        "wall_s": None,
        "cpu_s": None,
        "metrics": {},
    }
    calibration = by_name.get(f"calibrate-{entry.name}")
    if calibration is not None and calibration["status"] != "ok":
        return {**row, "error": f"calibration failed: {calibration['error']}"}
    record = by_name.get(name)
    if record is None:
        return {**row, "status": "not run", "error": budget.get("error")}
    speed = images_per_s(Path(record["result"]).parent / "metrics.jsonl", entry.images_per_step)
    row.update(
        status=record["status"],
        error=record["error"],
        wall_s=record["wall_s"],
        cpu_s=record["cpu_s"],
        metrics=dict(record["metrics"]),
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
        "cpu_s": record["cpu_s"],
        "metrics": {k: v for k, v in record["metrics"].items() if k == "finetune_top1"},
    }


SPEEDS = ("calibration_images_per_s", "images_per_s", "train_s", "steps")


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and sample standard deviation (None with one seed) over seeds, per recipe; failed rows are counted.

    A figure a run did measure counts even when a later step of its row failed: a pretraining whose
    fine-tune failed still has its kNN and linear probe.
    """
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["recipe"], []).append(row)
    summary = []
    for recipe, members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        line = {"recipe": recipe, "n_ok": len(ok), "n_failed": len(members) - len(ok)}
        for key in (*METRICS, *SPEEDS):
            values = [r["metrics"].get(key) if key in METRICS else r[key] for r in members]
            line[f"{key}_mean"], line[f"{key}_std"] = mean_std([v for v in values if v is not None])
        summary.append(line)
    return summary


def write_tables(out: Path, rows: list[dict], records: list[dict], header: dict) -> list[dict]:
    """results.csv, results.json and summary.csv; returns the summary rows."""
    columns = ["recipe", "seed", "status", "error", *SPEEDS[:2], "steps", "epochs", "train_s", *TIMES, *METRICS]
    numbers = (*METRICS, *SPEEDS[:3], *TIMES)
    cells = ({**row, **row["metrics"], "error": row["error"] or ""} for row in rows)
    write_csv(
        out / "results.csv",
        columns,
        ([csv_number(line.get(c)) if c in numbers else line.get(c, "") for c in columns] for line in cells),
    )
    write_json(out / "results.json", {**header, "points": rows, "runs": records})
    summary = summarize(rows)
    keys = [f"{key}_{s}" for key in (*METRICS, *SPEEDS) for s in ("mean", "std")]
    write_csv(
        out / "summary.csv",
        ["recipe", "n_ok", "n_failed", *keys],
        ([line["recipe"], line["n_ok"], line["n_failed"], *(csv_number(line[k]) for k in keys)] for line in summary),
    )
    return summary


def summary_table(summary: list[dict], minutes: float, fraction: float) -> Table:
    """Recipes down; kNN, linear probe, fine-tune at ``fraction``, images/s and training time across."""
    table = Table(title=f"comparison at {minutes:g} min of training: mean ± std over seeds")
    for title in ("recipe", "seeds ok", "kNN", "linear", f"fine-tune {fraction:g}", "img/s", "steps", "train s"):
        table.add_column(title, justify="left" if title == "recipe" else "right", no_wrap=title == "recipe")

    def cell(line: dict, key: str, digits: int = 4) -> str:
        return mean_std_text(line[f"{key}_mean"], line[f"{key}_std"], digits)

    for line in summary:
        table.add_row(
            line["recipe"],
            seeds_text(line["n_ok"], line["n_failed"]),
            *(cell(line, key) for key in METRICS),
            cell(line, "images_per_s", 0),
            cell(line, "steps", 0),
            cell(line, "train_s", 0),
        )
    return table


# --------------------------------------------------------------------------- the comparison


def header(plan: Plan) -> dict:
    """What ``results.json`` says the comparison was asked for, above its rows."""
    return {
        "recipes": [str(e.recipe) for e in plan.entries],
        "overrides": plan.overrides,
        "minutes": plan.minutes,
        "seeds": {e.name: list(e.seeds) for e in plan.entries},
        "fraction": plan.fraction,
        "finetune_recipe": None if plan.finetune is None else str(plan.finetune),
        "scratch_recipe": None if plan.scratch is None else str(plan.scratch),
        "finetune_overrides": plan.finetune_overrides,
        "calibration_steps": plan.calibration_steps,
        "launcher": plan.launcher,
    }


def calibrated_budget(plan: Plan, entry: Entry, calibration: dict) -> dict:
    """An entry's budget from its calibration's record: its measured images/s and the steps they allow, or the
    error that leaves it without one (none when the calibration failed: its row says so)."""
    if calibration["status"] != "ok":
        return {}
    metrics = plan.runs_dir / f"calibrate-{entry.name}" / "metrics.jsonl"
    speed = images_per_s(metrics, entry.images_per_step, WARMUP_STEPS)
    if speed is None:
        return {"error": "its calibration logged no timed steps; raise --calibration-steps"}
    return {"images_per_s": speed[0], "steps": budget_steps(plan.minutes, speed[0], entry.images_per_step)}


@dataclass
class AtEqualTime(Experiment):
    """The comparison's runs once its recipes are calibrated: each recipe's pretraining runs at the steps its
    speed allows and their fine-tunes, and the scratch runs; its tables hold the calibrations too."""

    plan: Plan
    calibrated: list[dict]  # the calibrations' records, in the order of the recipes
    budgets: dict[str, dict]  # by recipe: calibrated_budget()
    planned: list[Run]

    @property
    def out(self) -> Path:
        return self.plan.out

    def jobs(self) -> list[Job]:
        return [run.job() for run in self.planned]

    def write_tables(self, records: list[dict], times: dict[str, dict]) -> list[dict]:
        by_name = {r["name"]: r for r in [*self.calibrated, *records]}
        rows = [point_row(e, seed, self.budgets[e.name], by_name) for e in self.plan.entries for seed in e.seeds]
        rows += [scratch_row(r) for r in records if r["kind"] == "scratch"]
        saved = {**header(self.plan), "plans": self.budgets, "times": times}
        return write_tables(self.out, rows, [*self.calibrated, *records], saved)

    def conclusion(self, records: list[dict], summary: list[dict]) -> Outcome:
        out = self.out
        results = f"results: {out / 'results.csv'}, {out / 'summary.csv'}, {out / 'results.json'}"
        shown = [summary_table(summary, self.plan.minutes, self.plan.fraction)]
        return finished([*self.calibrated, *records], out, self.noun, shown, results)


def run_comparison(plan: Plan, executor: Executor | None = None) -> Outcome:
    """Calibrate every recipe alone, then run (or skip) its runs at the budget its speed allows on ``executor``
    (default: here, one at a time), rewriting the tables after each; the progress and each recipe's budget show
    as they come.

    The calibrations run one at a time, each on the share of the machine that a run gets on ``executor`` (with
    ``LocalExecutor(jobs=N)``: the CPU threads divided by N, or one GPU): the budget is the steps a run takes in
    ``plan.minutes`` alone on its share. Runs side by side then train those steps, slowed by one another: their
    own images/s in the table says by how much.

    Returns:
        The outcome: the summary table, where the results are, how many runs failed, and the exit status
        (0 when every run succeeded, 1 when any failed, 130 when interrupted).

    Raises:
        UserError: a run directory of ``plan.out`` was planned with another budget.
    """
    executor, out = executor or LocalExecutor(), plan.out
    out.mkdir(parents=True, exist_ok=True)
    console.print(
        f"comparison: {len(plan.entries)} recipes at {plan.minutes:g} min of training each -> {out}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    previous = runner.previous_times(out / "results.json", "runs")
    calibrations = [calibration_run(plan, entry).job() for entry in plan.entries]
    calibrated = runner.run_jobs(calibrations, out, previous, lambda _: None, "calibrations", executor.alone())
    if calibrated is None:
        return interrupted()

    budgets, planned = {}, []
    for entry, record in zip(plan.entries, calibrated):
        budgets[entry.name] = calibrated_budget(plan, entry, record)
        if (steps := budgets[entry.name].get("steps")) is None:
            continue
        console.print(
            f"{entry.name}: {budgets[entry.name]['images_per_s']:.0f} img/s over {plan.calibration_steps} "
            f"calibration steps -> {steps} steps ({steps / entry.steps_per_epoch:.1f} epochs)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        planned += training_runs(plan, entry, steps)
    if plan.finetune is not None:
        planned += scratch_runs(plan)
    for run in planned:
        check_run(run)  # a run directory of this comparison planned with another budget is refused
    return run_experiment(AtEqualTime(plan, calibrated, budgets, planned), executor, previous)
