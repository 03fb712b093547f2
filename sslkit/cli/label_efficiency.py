"""Label efficiency: what pretraining buys at 1%, 10%, 100% of the labels, against training from scratch.

    sslkit-label-efficiency RECIPE --fractions 0.01,0.1,1 --seeds 3 [--out DIR]
        [--pretrained RUN_DIR] [--finetune-recipe R] [--distill-recipe R] [--no-distill]
        [--scratch-recipe R] [--scratch-factor 3] [--epochs F=E,...] [--launcher "..."]
        [--pretrain-override K=V ...] [--finetune-override K=V ...]
        [key.sub=value ...]
    sslkit-label-efficiency quickstart --fractions 0.05,0.1,1 --seeds 3 train.threads=2

RECIPE is a self-supervised pretraining recipe. It is pretrained once (or ``--pretrained RUN_DIR``
names a finished run to start from), then, for every label fraction f and seed s, the same
labelled images (``data.label_fraction=f data.label_seed=s``, chosen by :mod:`sslkit.datasets.label_subset`)
go down every road:

- ``linear``, ``knn``: the frozen pretrained encoder, evaluated with f of the labels
  (``sslkit-evaluate PRE eval.label_fraction=f data.label_seed=s run.seed=s``);
- ``finetune``: the whole network fine-tuned from the pretrained backbone on those labels
  (``--finetune-recipe``, ``run.init_from=PRE``); its own classifier's test top-1, ``finetune_top1``;
- ``distill``: a student started from the pretrained backbone, taught by that fine-tuned network on
  every training image and trained with the same labels (``--distill-recipe``,
  ``method.teacher=<the finetune run>``), as SimCLRv2; not at f = 1 (nothing unlabelled to distill
  on), nor with ``--no-distill``;
- ``scratch``, ``scratch-long``: the same network from random weights on the same labelled images,
  for the recipe's epochs and for ``--scratch-factor`` times as many; ``scratch-best`` is the better
  of the two, per seed. The recipe is the fine-tune recipe (the same augmentation and optimizer), or
  ``--scratch-recipe``: a schedule tuned for training from scratch (``fashion_mnist_scratch``).

``--epochs 1=3`` gives the fine-tune and scratch runs at a fraction their own epochs (here 3 with
all the labels, where the recipe's 30 would cost ten times the 10% runs): the steps a fine-tune
takes grow with its labelled images, and the budget that suits 600 of them is not the one for 60,000.

The fine-tune and distill recipes default to the bundled ``<dataset>_finetune`` / ``<dataset>_distill``
(``fashion_mnist_*`` for data.name=fashion_mnist, ``quickstart_*`` otherwise). Seeds are s, s+1, ...
from the recipe's ``run.seed``. Overrides after RECIPE apply to every run (``train.threads=2``);
``--pretrain-override`` to the pretraining only, ``--finetune-override`` to the fine-tune, distill
and scratch runs only (``train.epochs=5``). Every run is its own subprocess, the user's command:

    python -m sslkit.cli.pretrain RECIPE <overrides> run.output_dir=OUT/runs run.name=pretrain run.resume=auto
    python -m sslkit.cli.evaluate OUT/runs/pretrain <overrides> eval.label_fraction=F data.label_seed=S run.seed=S
        --out OUT/points/frozen-fF-sS.json
    python -m sslkit.cli.pretrain FINETUNE <overrides> run.init_from=OUT/runs/pretrain data.label_fraction=F
        data.label_seed=S run.seed=S run.output_dir=OUT/runs run.name=finetune-fF-sS run.resume=auto
    ...

(``--launcher`` in place of ``python`` when given). Every run's config is validated before anything runs (a typo
fails in a second, exit status 2, one line). The comparison is resumable: a run whose result
file exists (``results.json`` in its run directory; the frozen evaluation's JSON) is skipped
("done, skipped"), any other runs again, continuing from its last checkpoint. A run that fails is
recorded with its error (the last line of its stderr), the runs that need it are recorded as not
run, and the others go on; the exit status is then 1.

OUT receives, updated after every run:

- ``points.csv`` / ``points.json``: one row per road, fraction and seed: test top-1, status,
  error, the run it comes from and its wall time (``points.json`` also lists the runs);
- ``summary.csv``: mean and sample standard deviation over seeds of every road at every fraction,
  and the mean wall time of its runs;
- ``gains.csv``: fine-tune and distill minus scratch best, paired by seed (the same labelled
  images): mean, sample standard deviation and the number of seeds on which pretraining is ahead;
- ``label_efficiency.png`` (with matplotlib): test top-1 against the label fraction on a log axis,
  one line per road (linear probe, fine-tune, fine-tune + distill, scratch best), error bars one
  standard deviation over seeds;
- ``logs/<run>.out`` / ``.err``: each run's stdout and stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from sslkit.cli import sweep
from sslkit.config import Config, find_recipe, flatten, load_config, to_dict
from sslkit.console import console, error_console, print_table, print_user_error
from sslkit.errors import UserError
from sslkit.experiments.report import PLOT_HINT, new_figure

PLOT_FILE = "label_efficiency.png"

# Roads in table order; the kind of run each comes from and the metric read from its results.
ROADS = ("linear", "knn", "finetune", "distill", "scratch", "scratch-long", "scratch-best")
ROAD_METRIC = {
    "linear": "linear_top1",
    "knn": "knn_top1",
    "finetune": "finetune_top1",
    "distill": "finetune_top1",
    "scratch": "finetune_top1",
    "scratch-long": "finetune_top1",
}
GAIN_ROADS = ("finetune", "distill")  # compared with scratch-best seed by seed (gains.csv, the table's last column)
PLOTTED_ROADS = {
    "linear": "linear probe (frozen)",
    "finetune": "fine-tune",
    "distill": "fine-tune + distill",
    "scratch-best": "scratch (better of 1x and {factor}x epochs)",
}
# Set by this tool for every run (or every run of a kind); an override of them would break its bookkeeping.
RESERVED_KEYS = (
    "run.name",
    "run.output_dir",
    "run.resume",
    "run.init_from",
    "method.teacher",
    "data.label_fraction",
    "data.labels_per_class",
    "data.label_seed",
    "eval.label_fraction",
    "eval.labels_per_class",
)
# Paths: the same place may be spelled differently (relative, absolute); compared resolved.
PATH_KEYS = ("run.init_from", "method.teacher")
# What a trained run must share with the pretrained encoder: the network its backbone loads into, and the images.
SAME_AS_PRETRAINED = ("data.name", "model.backbone", "model.width", "model.cifar_stem", "model.kwargs")
# ... and, for a fine-tune that keeps pretrained projector layers, the projector they come from
SAME_PROJECTOR = ("model.projector_hidden", "model.projector_out", "model.projector_layers")


@dataclass
class Run:
    """One subprocess of the comparison: its command, the file that says it finished, and the runs it needs."""

    name: str
    kind: str  # pretrain, frozen, finetune, distill, scratch, scratch-long
    fraction: float | None  # None: the pretraining
    seed: int | None
    command: list[str]
    result: Path  # results.json in its run directory, or the frozen evaluation's JSON
    needs: tuple[str, ...] = ()
    # What validation loads: the recipe and the overrides the command gives it.
    recipe: Path | None = None
    overrides: list[str] = field(default_factory=list)
    run_dir: Path | None = None  # for pretraining runs: where its config.yaml is saved

    def job(self) -> sweep.Job:
        """The run as the sweep runner runs it; its record keeps the kind, fraction and seed."""
        frozen = self.kind == "frozen"
        return sweep.Job(
            name=self.name,
            command=self.command,
            result=self.result,
            metrics_at=("results",) if frozen else sweep.TRAINED,
            needs=self.needs,
            shown=("linear_top1", "knn_top1") if frozen else ("finetune_top1",),
            fields={"kind": self.kind, "fraction": self.fraction, "seed": self.seed},
        )


@dataclass
class Plan:
    """Everything the command line decides, resolved: recipes, overrides, the grid and where it goes."""

    recipe: Path
    finetune_recipe: Path
    distill_recipe: Path | None  # None: no distill road
    overrides: list[str]
    pretrain_overrides: list[str]
    finetune_overrides: list[str]
    fractions: list[float]
    seeds: list[int]
    out: Path
    pretrained: Path | None
    scratch_factor: int
    finetune_epochs: int  # the fine-tune recipe's own
    scratch_recipe: Path  # the scratch runs' recipe: --scratch-recipe, else the fine-tune recipe
    scratch_epochs: int  # the scratch recipe's own
    epochs: dict[str, int]  # --epochs: fraction_text(f) -> fine-tune epochs at f, where it differs
    launcher: str | None


def fraction_text(fraction: float) -> str:
    """``0.01`` -> ``0.01``, ``1.0`` -> ``1``: as run names and tables show it."""
    return f"{fraction:g}"


def run_name(kind: str, fraction: float, seed: int) -> str:
    return f"{kind}-f{fraction_text(fraction)}-s{seed}"


# --------------------------------------------------------------------------- the command line, checked


def parse_fractions(text: str) -> list[float]:
    """``0.01,0.1,1`` -> ``[0.01, 0.1, 1.0]``, sorted; each in (0, 1], none twice."""
    fractions = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise UserError(
                f"--fractions '{text}': '{part.strip()}' is not a number; give fractions of the labels, "
                f"e.g. --fractions 0.01,0.1,1"
            ) from None
        if not 0 < value <= 1 or math.isnan(value):
            raise UserError(
                f"--fractions '{text}': {part.strip()} is outside (0, 1]; 0.01 keeps 1% of the labels, 1 all of them"
            )
        fractions.append(value)
    texts = [fraction_text(f) for f in fractions]
    if len(set(texts)) < len(texts):
        raise UserError(f"--fractions '{text}': a fraction appears twice")
    return sorted(fractions)


def parse_epochs(text: str | None, fractions: list[float]) -> dict[str, int]:
    """``--epochs 0.01=60,1=3`` -> ``{"0.01": 60, "1": 3}``: positive epochs at fractions of ``--fractions``."""
    if not text:
        return {}
    epochs = {}
    for part in text.split(","):
        fraction, _, count = part.partition("=")
        try:
            key, value = fraction_text(float(fraction)), int(count)
        except ValueError:
            raise UserError(
                f"--epochs '{text}': '{part.strip()}' is not FRACTION=EPOCHS; e.g. --epochs 1=3 trains 3 epochs "
                f"with all the labels"
            ) from None
        if key not in {fraction_text(f) for f in fractions}:
            known = ",".join(map(fraction_text, fractions))
            raise UserError(f"--epochs '{text}': {key} is not one of --fractions {known}")
        if value < 1:
            raise UserError(f"--epochs '{text}': {key}={value}; a run trains at least 1 epoch")
        epochs[key] = value
    return epochs


def check_overrides(texts: list[str], option: str, also_reserved: tuple[str, ...] = ()) -> None:
    """Refuse overrides of the keys this tool sets itself, with what to use instead."""
    for text in texts:
        key = text.partition("=")[0].strip()
        if key in (*RESERVED_KEYS, *also_reserved):
            raise UserError(
                f"{option} '{text}': label_efficiency sets {key} for every run it concerns "
                f"(use --fractions, --seeds, --out or --pretrained instead)"
            )


def default_recipe(kind: str, data_name: str) -> Path:
    """The bundled fine-tune or distill recipe for the dataset: ``fashion_mnist_<kind>`` or ``quickstart_<kind>``."""
    prefix = "fashion_mnist" if data_name == "fashion_mnist" else "quickstart"
    try:
        return find_recipe(f"{prefix}_{kind}")
    except UserError:
        raise UserError(
            f"the bundled recipe '{prefix}_{kind}' (the default --{kind}-recipe for data.name={data_name}) "
            f"is not installed; pass --{kind}-recipe with a {kind} recipe"
        ) from None


def pretrained_run(path: Path) -> Path:
    """``--pretrained``: a finished run directory (config.yaml and results.json in it)."""
    if not (path / "config.yaml").is_file():
        raise UserError(
            f"--pretrained '{path}' is not a run directory (no config.yaml in it); give the directory of a "
            f"finished pretraining run, e.g. runs/quickstart"
        )
    if not (path / "results.json").is_file():
        raise UserError(
            f"--pretrained '{path}' has not finished (no results.json); finish it first "
            f"(the same pretrain command with run.resume=auto)"
        )
    return path.resolve()


def build_plan(args: argparse.Namespace) -> Plan:
    """The command line resolved and checked (everything but the runs' own configs).

    Raises:
        UserError: a bad fraction, seed count, factor, override or recipe.
    """
    fractions = parse_fractions(args.fractions)
    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    if args.scratch_factor < 1:
        raise UserError(f"--scratch-factor must be at least 1 (1: no longer scratch run), got {args.scratch_factor}")
    check_overrides(args.overrides, "override")
    check_overrides(args.pretrain_overrides, "--pretrain-override")
    check_overrides(args.finetune_overrides, "--finetune-override", ("run.seed",))
    if args.pretrained is not None and args.pretrain_overrides:
        raise UserError("--pretrain-override has nothing to apply to with --pretrained (no pretraining runs)")
    recipe = find_recipe(args.recipe)  # a bundled recipe's name becomes its file: the runs get a path
    base = load_config(recipe, [*args.overrides, *args.pretrain_overrides])
    pretrained = pretrained_run(args.pretrained) if args.pretrained is not None else None
    if pretrained is not None:
        theirs = (yaml.safe_load((pretrained / "config.yaml").read_text()) or {}).get("data", {}).get("name")
        if theirs != base.data.name:
            raise UserError(
                f"--pretrained '{args.pretrained}' was trained on data.name={theirs}, the recipe names "
                f"data.name={base.data.name}; give the recipe it was trained with"
            )
    finetune_recipe = (
        find_recipe(args.finetune_recipe) if args.finetune_recipe else default_recipe("finetune", base.data.name)
    )
    distill_recipe = None
    if not args.no_distill and any(f < 1 for f in fractions):
        distill_recipe = (
            find_recipe(args.distill_recipe) if args.distill_recipe else default_recipe("distill", base.data.name)
        )
    scratch_recipe = find_recipe(args.scratch_recipe) if args.scratch_recipe else finetune_recipe
    epochs = {}
    for kind, path in (("fine-tune", finetune_recipe), ("scratch", scratch_recipe)):
        try:
            epochs[kind] = load_config(path, [*args.overrides, *args.finetune_overrides]).train.epochs
        except UserError as error:
            raise UserError(f"{kind} recipe: {error}") from None
    out = args.out or Path(base.run.output_dir) / f"label-efficiency-{recipe.stem}"
    return Plan(
        recipe=recipe.resolve(),
        finetune_recipe=finetune_recipe.resolve(),
        distill_recipe=distill_recipe.resolve() if distill_recipe else None,
        overrides=list(args.overrides),
        pretrain_overrides=list(args.pretrain_overrides),
        finetune_overrides=list(args.finetune_overrides),
        fractions=fractions,
        seeds=[base.run.seed + i for i in range(args.seeds)],
        out=out.resolve(),
        pretrained=pretrained,
        scratch_factor=args.scratch_factor,
        finetune_epochs=epochs["fine-tune"],
        scratch_recipe=scratch_recipe.resolve(),
        scratch_epochs=epochs["scratch"],
        epochs=parse_epochs(args.epochs, fractions),
        launcher=args.launcher,
    )


# --------------------------------------------------------------------------- the runs


def plan_runs(plan: Plan) -> list[Run]:
    """Every run in the order they go: the pretraining, then per fraction and seed frozen, fine-tune,
    distill, scratch and scratch-long."""
    runs_dir = plan.out / "runs"
    pre = plan.pretrained or runs_dir / "pretrain"

    def trained(kind: str, recipe: Path, own: list[str], needs: tuple[str, ...], labels=None, **keys) -> Run:
        name = "pretrain" if labels is None else run_name(kind, *labels)
        return trained_run(name, kind, recipe, [*plan.overrides, *own], runs_dir, plan.launcher, needs, labels, **keys)

    runs = []
    needs_pre: tuple[str, ...] = ()
    if plan.pretrained is None:
        runs.append(trained("pretrain", plan.recipe, plan.pretrain_overrides, ()))
        needs_pre = ("pretrain",)
    for fraction in plan.fractions:
        epochs = plan.epochs.get(fraction_text(fraction))
        own = [*plan.finetune_overrides, *([] if epochs is None else [f"train.epochs={epochs}"])]
        for seed in plan.seeds:
            labels = (fraction, seed)
            name = run_name("frozen", fraction, seed)
            result = plan.out / "points" / f"{name}.json"
            eval_overrides = [
                *plan.overrides,
                f"eval.label_fraction={fraction_text(fraction)}",
                f"data.label_seed={seed}",
                f"run.seed={seed}",  # the linear probe's seed, as the trained runs' run.seed
            ]
            runs.append(
                Run(
                    name=name,
                    kind="frozen",
                    fraction=fraction,
                    seed=seed,
                    command=sweep.command(
                        sweep.EVALUATE, [str(pre), *eval_overrides, "--out", str(result)], plan.launcher
                    ),
                    result=result,
                    needs=needs_pre,
                    overrides=eval_overrides,
                )
            )
            finetune = run_name("finetune", fraction, seed)
            runs.append(trained("finetune", plan.finetune_recipe, own, needs_pre, labels, **{"run.init_from": pre}))
            if plan.distill_recipe is not None and fraction < 1:
                teacher = {"method.teacher": runs_dir / finetune, "run.init_from": pre}
                needs = (*needs_pre, finetune)  # the distill recipe keeps its own epochs: not --epochs
                runs.append(trained("distill", plan.distill_recipe, plan.finetune_overrides, needs, labels, **teacher))
            # Random weights: run.init_from=null, in case the fine-tune recipe names a start of its own.
            runs.append(trained("scratch", plan.scratch_recipe, own, (), labels, **{"run.init_from": "null"}))
            if plan.scratch_factor > 1:
                longer = [*own, f"train.epochs={plan.scratch_factor * (epochs or plan.scratch_epochs)}"]
                runs.append(
                    trained("scratch-long", plan.scratch_recipe, longer, (), labels, **{"run.init_from": "null"})
                )
    return runs


def trained_run(
    name: str,
    kind: str,
    recipe: Path,
    overrides: list[str],
    runs_dir: Path,
    launcher: str | None,
    needs: tuple[str, ...] = (),
    labels: tuple[float, int] | None = None,
    **keys,
) -> Run:
    """A ``sslkit.cli.pretrain`` run named ``name`` in ``runs_dir``: ``recipe`` with ``overrides``, then ``keys``.

    ``labels``: (fraction, seed) of its labelled subset, which is also its run seed; the fine-tune and
    scratch roads take ``run.init_from`` (the pretrained run, or ``null``) in ``keys``.
    """
    fraction, seed = labels if labels is not None else (None, None)
    if labels is not None:
        keys.update({"data.label_fraction": fraction_text(fraction), "data.label_seed": seed, "run.seed": seed})
    overrides = [
        *overrides,
        *(f"{key}={value}" for key, value in keys.items()),
        f"run.output_dir={runs_dir}",
        f"run.name={name}",
        # resume=auto: a run stopped midway (Ctrl-C, a crash) continues from its last checkpoint on the rerun.
        "run.resume=auto",
    ]
    return Run(
        name=name,
        kind=kind,
        fraction=fraction,
        seed=seed,
        command=sweep.command(sweep.PRETRAIN, [str(recipe), *overrides], launcher),
        result=runs_dir / name / "results.json",
        needs=needs,
        recipe=recipe,
        overrides=overrides,
        run_dir=runs_dir / name,
    )


def validation_config(run: Run, plan: Plan) -> Config:
    """Load and validate the config ``run`` will run with.

    The frozen evaluation reads the pretrained run's config.yaml, which may not exist yet: its
    stand-in is the recipe with the pretraining's overrides, which is what config.yaml will hold.
    """
    if run.kind == "frozen":
        if plan.pretrained is not None:
            return load_config(plan.pretrained / "config.yaml", run.overrides)
        return load_config(plan.recipe, [*plan.overrides, *plan.pretrain_overrides, *run.overrides])
    # The teacher and the pretrained backbone do not exist before their runs: the paths are checked when
    # the run starts (they are its inputs), everything else now.
    overrides = [o for o in run.overrides if o.partition("=")[0] not in PATH_KEYS]
    return load_config(run.recipe, overrides)


def check_runs(runs: list[Run], plan: Plan) -> None:
    """Validate every run's config before anything runs; refuse a run directory made with another config.

    Raises:
        UserError: a run's config is invalid or builds another network on other data than the
            pretrained encoder's, or one of its run directories was made with other settings
            (skipping or resuming it would mix two experiments).
    """
    if plan.pretrained is not None:
        encoder = to_dict(load_config(plan.pretrained / "config.yaml", plan.overrides))
    else:
        encoder = to_dict(load_config(plan.recipe, [*plan.overrides, *plan.pretrain_overrides]))
    for run in runs:
        try:
            cfg = validation_config(run, plan)
        except UserError as error:
            raise UserError(f"run {run.name}: {error}") from None
        if run.kind in ("finetune", "distill", "scratch", "scratch-long"):
            options = {
                "distill": "--distill-recipe",
                "scratch": "--scratch-recipe",
                "scratch-long": "--scratch-recipe",
            }
            own, option = to_dict(cfg), options.get(run.kind, "--finetune-recipe")
            kept = run.kind == "finetune" and cfg.method.options["finetune_from_projector_layer"] > 0
            for key in (*SAME_AS_PRETRAINED, *(SAME_PROJECTOR if kept else ())):
                section, name = key.split(".")
                if (mine := own[section][name]) != (theirs := encoder[section][name]):
                    raise UserError(
                        f"run {run.name}: {key}={mine}, but the pretrained encoder has {key}={theirs}; "
                        f"every road needs the same network on the same images: pass {key}={theirs} "
                        f"(an override for every run) or another {option}"
                    )
        if run.run_dir is None:
            continue
        wanted = flatten(to_dict(cfg))
        for override in run.overrides:  # the paths validation left out
            key, _, value = override.partition("=")
            if key in PATH_KEYS:
                wanted[key] = value
        sweep.refuse_changed_run(run.run_dir, wanted, PATH_KEYS, "comparison")


# --------------------------------------------------------------------------- rows, summary, plot


def point_rows(records: list[dict], long_runs: bool = True) -> list[dict]:
    """One row per road, fraction and seed, from the runs' records.

    ``scratch-best`` follows the scratch run, or with ``long_runs`` (``--scratch-factor`` > 1) the
    scratch-long one, once that has a record.
    """
    rows = []
    by_name = {r["name"]: r for r in records}
    for record in records:
        kind = record["kind"]
        roads = ("linear", "knn") if kind == "frozen" else (kind,) if kind in ROAD_METRIC else ()
        for road in roads:
            rows.append(road_row(road, record, ROAD_METRIC[road]))
        if kind == "scratch-long" or (kind == "scratch" and not long_runs):
            scratch = by_name[run_name("scratch", record["fraction"], record["seed"])]
            rows.append(best_of_scratch(scratch, record if kind == "scratch-long" else None))
    return rows


def road_row(road: str, record: dict, metric: str) -> dict:
    row = {
        "road": road,
        "fraction": record["fraction"],
        "seed": record["seed"],
        "run": record["name"],
        "status": record["status"],
        "skipped": record["skipped"],
        "error": record["error"],
        "wall_s": record["wall_s"],
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
    parts = [road_row("scratch", scratch, "finetune_top1")]
    if long is not None:
        parts.append(road_row("scratch-long", long, "finetune_top1"))
    row = {**parts[0], "road": "scratch-best"}
    bad = [p for p in parts if p["status"] != "ok"]
    if bad:
        return {**row, "status": "failed", "top1": None, "error": f"{bad[0]['run']} failed: {bad[0]['error']}"}
    best = max(parts, key=lambda p: p["top1"])
    walls = [p["wall_s"] for p in parts]
    return {
        **best,
        "road": "scratch-best",
        "skipped": all(p["skipped"] for p in parts),
        "wall_s": None if None in walls else sum(walls),  # what the figure cost: both runs
    }


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and sample standard deviation (None with one seed) over seeds, per fraction and road; failed
    rows are counted, not averaged. Ordered by fraction, then road as in :data:`ROADS`."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["fraction"], row["road"]), []).append(row)
    summary = []
    for (fraction, road), members in sorted(groups.items(), key=lambda g: (g[0][0], ROADS.index(g[0][1]))):
        ok = [r["top1"] for r in members if r["status"] == "ok"]
        walls = [r["wall_s"] for r in members if r["wall_s"] is not None]
        summary.append(
            {
                "fraction": fraction,
                "road": road,
                "n_ok": len(ok),
                "n_failed": len(members) - len(ok),
                "top1_mean": statistics.fmean(ok) if ok else None,
                "top1_std": statistics.stdev(ok) if len(ok) > 1 else None,
                "wall_s_mean": statistics.fmean(walls) if walls else None,
            }
        )
    return summary


def paired_gains(rows: list[dict]) -> list[dict]:
    """Per fraction, each road from the pretrained encoder minus ``scratch-best`` on the same seed (the
    same labelled images): mean and sample standard deviation of the differences, and on how many
    seeds the road is ahead. Pairing by seed takes out what the choice of labelled images does to both."""
    top1 = {(r["fraction"], r["road"], r["seed"]): r["top1"] for r in rows if r["top1"] is not None}
    gains = []
    for fraction in dict.fromkeys(r["fraction"] for r in rows):
        for road in GAIN_ROADS:
            diffs = [
                value - top1[(f, "scratch-best", seed)]
                for (f, name, seed), value in top1.items()
                if (f, name) == (fraction, road) and (f, "scratch-best", seed) in top1
            ]
            if diffs:
                gains.append(
                    {
                        "fraction": fraction,
                        "road": road,
                        "n_seeds": len(diffs),
                        "gain_mean": statistics.fmean(diffs),
                        "gain_std": statistics.stdev(diffs) if len(diffs) > 1 else None,
                        "seeds_ahead": sum(d > 0 for d in diffs),
                    }
                )
    return gains


def write_tables(out: Path, records: list[dict], header: dict, long_runs: bool = True) -> list[dict]:
    """Write points.csv, points.json, summary.csv and gains.csv; returns the summary rows."""
    rows = point_rows(records, long_runs)
    columns = ["road", "fraction", "seed", "run", "status", "skipped", "error", "wall_s", "metric", "top1"]
    with open(out / "points.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for r in rows:
            writer.writerow(
                [
                    r["road"],
                    fraction_text(r["fraction"]),
                    *(r[c] for c in columns[2:6]),
                    r["error"] or "",
                    "" if r["wall_s"] is None else f"{r['wall_s']:.1f}",
                    r["metric"],
                    sweep.csv_number(r["top1"]),
                ]
            )
    (out / "points.json").write_text(json.dumps({**header, "runs": records, "points": rows}, indent=2))
    summary = summarize(rows)
    columns = ["fraction", "road", "n_ok", "n_failed", "top1_mean", "top1_std", "wall_s_mean"]
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in summary:
            writer.writerow(
                [
                    fraction_text(row["fraction"]),
                    *(row[c] for c in columns[1:4]),
                    *(sweep.csv_number(row[c]) for c in columns[4:]),
                ]
            )
    columns = ["fraction", "road", "n_seeds", "gain_mean", "gain_std", "seeds_ahead"]
    with open(out / "gains.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in paired_gains(rows):
            writer.writerow(
                [
                    fraction_text(row["fraction"]),
                    row["road"],
                    row["n_seeds"],
                    *(sweep.csv_number(row[c]) for c in columns[3:]),
                ]
            )
    return summary


def column_header(road: str) -> str:
    """A road's name in lines of at most 7 characters, so that the table fits 80 columns unshortened."""
    return "fine\ntune" if road == "finetune" else road.replace("-", "\n")


def fraction_grid(title: str, rows: list[dict], roads: list[str], header, cell, caption: str | None = None) -> Table:
    """Fractions down, ``roads`` across (``header(road)`` their titles); ``cell(row)`` writes the cell of
    the row of that fraction and road, and a missing one stays empty."""
    table = Table(title=title, caption=caption)
    table.add_column("labels", justify="right")
    for road in roads:
        table.add_column(header(road), justify="right")
    cells = {(row["fraction"], row["road"]): row for row in rows}
    for fraction in dict.fromkeys(row["fraction"] for row in rows):
        line = [cell(cells[fraction, road]) if (fraction, road) in cells else "" for road in roads]
        table.add_row(fraction_text(fraction), *line)
    return table


def summary_table(summary: list[dict], pretrain: dict | None) -> Table:
    """Fractions down, roads across: mean ± std over seeds, and the wall time per run under it."""
    caption = None
    if pretrain is not None and pretrain.get("wall_s") is not None:
        caption = f"pretraining: {pretrain['wall_s']:.0f} s, once for all the frozen, fine-tune and distill runs"

    def cell(row: dict) -> str:
        mean, std = row["top1_mean"], row["top1_std"]
        text = "-" if mean is None else f"{mean:.4f}" + ("" if std is None else f" ± {std:.4f}")
        if row["n_failed"]:
            text += f"\n[red]{row['n_failed']} failed[/]"
        if row["wall_s_mean"] is not None:
            text += f"\n[dim]{row['wall_s_mean']:.0f} s[/]"
        return text

    roads = [road for road in ROADS if any(row["road"] == road for row in summary)]
    title = "label efficiency: test top-1, mean ± std over seeds (wall time per run)"
    return fraction_grid(title, summary, roads, column_header, cell, caption)


def gains_table(gains: list[dict]) -> Table:
    """Fractions down; per pretrained road, its gain over scratch best (paired by seed) and the seeds it leads on."""

    def cell(row: dict) -> str:
        mean, std = row["gain_mean"], row["gain_std"]
        colour = "green" if mean > 0 and row["seeds_ahead"] == row["n_seeds"] else "red" if mean < 0 else "yellow"
        text = f"[{colour}]{mean:+.4f}[/]" + ("" if std is None else f" ± {std:.4f}")
        return text + f"\n[dim]ahead on {row['seeds_ahead']} of {row['n_seeds']} seeds[/]"

    roads = [road for road in GAIN_ROADS if any(row["road"] == road for row in gains)]
    title = "what pretraining buys: road - scratch best on the same labelled images, mean ± std"
    return fraction_grid(title, gains, roads, lambda road: f"{road} gain", cell)


def plot(summary: list[dict], seeds: int, path: Path, scratch_factor: int = 3) -> Any:
    """Save test top-1 against the label fraction (log axis), one line per plotted road.

    Returns:
        The matplotlib Figure, or None without matplotlib.
    """
    figure = new_figure(6.5, 4.2)
    if figure is None:
        return None
    axes = figure.axes[0]
    fractions = sorted({row["fraction"] for row in summary})
    for road, label in PLOTTED_ROADS.items():
        label = "scratch" if road == "scratch-best" and scratch_factor == 1 else label.format(factor=scratch_factor)
        rows = sorted((r for r in summary if r["road"] == road), key=lambda r: r["fraction"])
        if not rows:
            continue
        xs = [r["fraction"] for r in rows]
        ys = [math.nan if r["top1_mean"] is None else r["top1_mean"] for r in rows]
        errors = [r["top1_std"] or 0.0 for r in rows]
        if all(math.isnan(y) for y in ys):
            label += " (every run failed)"
        axes.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=label)
    axes.set_xscale("log")
    axes.set_xticks(fractions, [fraction_text(f) for f in fractions])
    axes.minorticks_off()
    axes.set_xlabel("fraction of the training labels")
    axes.set_ylabel("test top-1")
    axes.set_title("test top-1 against labels" + (f" (error bars: std over {seeds} seeds)" if seeds > 1 else ""))
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=110)
    return figure


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-label-efficiency",
        description="Compare, at several label fractions, a pretrained encoder frozen, fine-tuned and distilled "
        "against the same network trained from scratch on the same labels.",
    )
    parser.add_argument(
        "recipe",
        type=Path,
        help="the self-supervised pretraining recipe: a YAML file or a bundled recipe's name, e.g. quickstart",
    )
    parser.add_argument(
        "overrides", nargs="*", default=[], help="dotted key=value overrides for every run, e.g. train.threads=2"
    )
    parser.add_argument(
        "--fractions", required=True, metavar="F1,F2,...", help="label fractions in (0, 1], e.g. 0.01,0.1,1"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="seeds per fraction (labelled subset and run seed): s, s+1, ... from the recipe's run.seed (default 1)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: <run.output_dir>/label-efficiency-<recipe>)"
    )
    parser.add_argument(
        "--pretrained",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="a finished pretraining run to start from instead of pretraining RECIPE",
    )
    parser.add_argument(
        "--finetune-recipe",
        default=None,
        help="the fine-tune (and scratch) recipe (default: fashion_mnist_finetune or quickstart_finetune)",
    )
    parser.add_argument(
        "--distill-recipe",
        default=None,
        help="the distillation recipe (default: fashion_mnist_distill or quickstart_distill)",
    )
    parser.add_argument(
        "--scratch-recipe",
        default=None,
        help="the scratch runs' recipe (default: the fine-tune recipe), e.g. fashion_mnist_scratch",
    )
    parser.add_argument("--no-distill", action="store_true", help="skip the fine-tune + distill road")
    parser.add_argument(
        "--scratch-factor",
        type=int,
        default=3,
        help="the longer scratch run trains this many times the fine-tune recipe's epochs (default 3; 1: no "
        "longer run)",
    )
    parser.add_argument(
        "--epochs",
        default=None,
        metavar="F=E,...",
        help="fine-tune (and scratch) epochs at a fraction instead of the recipe's, e.g. 1=3 (scratch-long: "
        "--scratch-factor times these)",
    )
    parser.add_argument(
        "--launcher",
        default=None,
        help='a prefix for multi-process runs, e.g. "accelerate launch --cpu --num_processes 2"',
    )
    parser.add_argument(
        "--pretrain-override",
        dest="pretrain_overrides",
        action="append",
        default=[],
        metavar="KEY=V",
        help="an override for the pretraining run only (repeatable)",
    )
    parser.add_argument(
        "--finetune-override",
        dest="finetune_overrides",
        action="append",
        default=[],
        metavar="KEY=V",
        help="an override for the fine-tune, distill and scratch runs only (repeatable), e.g. train.epochs=5",
    )
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = build_plan(args)
        runs = plan_runs(plan)
        check_runs(runs, plan)
    except UserError as error:
        print_user_error(error)
        return 2
    if (note := labels_note(plan)) is not None:
        error_console.print(note, markup=False, highlight=False, soft_wrap=True)
    header = {
        "recipe": str(plan.recipe),
        "finetune_recipe": str(plan.finetune_recipe),
        "scratch_recipe": str(plan.scratch_recipe),
        "distill_recipe": None if plan.distill_recipe is None else str(plan.distill_recipe),
        "pretrained": str(plan.pretrained or plan.out / "runs" / "pretrain"),
        "overrides": plan.overrides,
        "pretrain_overrides": plan.pretrain_overrides,
        "finetune_overrides": plan.finetune_overrides,
        "fractions": [fraction_text(f) for f in plan.fractions],
        "seeds": plan.seeds,
        "scratch_factor": plan.scratch_factor,
        "epochs": plan.epochs,
        "launcher": plan.launcher,
    }
    return run_all(runs, plan, header)


def labels_note(plan: Plan) -> str | None:
    """A note when the pretraining itself trains with labels (SupCon, supervised): the frozen, fine-tune and
    distill roads then had more labels than their fraction says."""
    from sslkit import methods

    config = plan.pretrained / "config.yaml" if plan.pretrained is not None else plan.recipe
    cfg = load_config(config, plan.overrides if plan.pretrained else [*plan.overrides, *plan.pretrain_overrides])
    if not methods.METHODS[cfg.method.name].needs_labels:
        return None
    subset = cfg.data.label_fraction is not None or cfg.data.labels_per_class is not None
    return (
        f"note: the pretraining (method.name={cfg.method.name}) trains with labels"
        + (" (its own data.label_fraction / labels_per_class)" if subset else ", all of them")
        + ": the frozen, fine-tune and distill roads have seen more labels than their fraction"
    )


def run_all(runs: list[Run], plan: Plan, header: dict) -> int:
    """Run (or skip) every run, writing the tables after each.

    Returns:
        The exit status: 0 when every run succeeded, 1 when any failed, 130 when interrupted.
    """
    out = plan.out
    out.mkdir(parents=True, exist_ok=True)
    # Every run ever timed into this output, also those outside this command's grid: skipped runs keep theirs.
    previous = sweep.previous_wall_times(out / "points.json", "runs")
    seeds, fractions = len(plan.seeds), len(plan.fractions)
    console.print(
        f"label efficiency: {len(runs)} runs ({fractions} label fraction{'s' if fractions > 1 else ''} x {seeds} "
        f"seed{'s' if seeds > 1 else ''}"
        + (", after the pretraining" if plan.pretrained is None else "")
        + f") -> {out}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    (out / "points").mkdir(exist_ok=True)  # where the frozen evaluations write (--out's folder must exist)

    def tables(records: list[dict]) -> list[dict]:
        header_now = {**header, "pretrain": _pretrain(records), "wall_times": previous}
        return write_tables(out, records, header_now, plan.scratch_factor > 1)

    records = sweep.run_jobs([run.job() for run in runs], out, previous, tables, "runs")
    if records is None:
        return 130

    summary = tables(records)
    print_table(summary_table(summary, _pretrain(records)))
    if gains := paired_gains(point_rows(records, plan.scratch_factor > 1)):
        print_table(gains_table(gains))
    figure = plot(summary, seeds, out / PLOT_FILE, plan.scratch_factor)
    console.print(
        f"results: {out / 'points.csv'}, {out / 'summary.csv'}, {out / 'gains.csv'}, {out / 'points.json'}"
        + (f"; plot: {out / PLOT_FILE}" if figure is not None else f"; no plot ({PLOT_HINT})"),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return sweep.exit_status(records, out, "runs")


def _pretrain(records: list[dict]) -> dict | None:
    return next((r for r in records if r["kind"] == "pretrain"), None)


if __name__ == "__main__":
    sys.exit(main())
