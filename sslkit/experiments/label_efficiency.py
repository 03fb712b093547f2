"""Label efficiency: what pretraining buys at 1%, 10%, 100% of the labels, against training from scratch.

    plan = plan_label_efficiency("quickstart", fractions=[0.05, 0.1, 1], seeds=3, overrides=["train.threads=2"])
    outcome = run_label_efficiency(plan)  # its tables and notes to show, and the exit status

is ``sslkit-label-efficiency quickstart --fractions 0.05,0.1,1 --seeds 3 train.threads=2``
(:mod:`sslkit.cli.label_efficiency`); every keyword of :func:`plan_label_efficiency` is the option of
that name, and its errors name the options.

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

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from sslkit.config import Config, find_recipe, load_config, to_dict
from sslkit.console import console
from sslkit.errors import UserError
from sslkit.experiments import runner
from sslkit.experiments.report import PLOT_HINT, new_figure
from sslkit.experiments.runs import (
    PATH_KEYS,
    RESERVED_KEYS,
    SAME_AS_PRETRAINED,
    Run,
    check_labelled_batch,
    default_recipe,
    first_difference,
    fraction_text,
    refuse_changed_run_dir,
    trained_run,
)
from sslkit.experiments.stats import mean_std, paired_difference
from sslkit.experiments.tables import csv_number, error_bars, mean_std_text, save_plot, write_csv

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
# What a fine-tune that keeps pretrained projector layers must also share with the pretrained encoder:
# the projector they come from
SAME_PROJECTOR = ("model.projector_hidden", "model.projector_out", "model.projector_layers")


@dataclass
class Plan:
    """Everything the comparison is asked for, resolved: recipes, overrides, the grid and where it goes."""

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


def run_name(kind: str, fraction: float, seed: int) -> str:
    return f"{kind}-f{fraction_text(fraction)}-s{seed}"


# --------------------------------------------------------------------------- the plan, checked


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


def plan_label_efficiency(
    recipe: str | Path,
    fractions: str | Sequence[float],
    seeds: int = 1,
    *,
    out: str | Path | None = None,
    pretrained: str | Path | None = None,
    finetune_recipe: str | Path | None = None,
    distill_recipe: str | Path | None = None,
    scratch_recipe: str | Path | None = None,
    distill: bool = True,
    scratch_factor: int = 3,
    epochs: str | Mapping[float, int] | None = None,
    launcher: str | None = None,
    overrides: Sequence[str] = (),
    pretrain_overrides: Sequence[str] = (),
    finetune_overrides: Sequence[str] = (),
) -> Plan:
    """The comparison resolved and checked, every run's config validated, before anything runs.

    Args:
        recipe: the self-supervised pretraining recipe (a file or a bundled recipe's name).
        fractions: label fractions in (0, 1], e.g. ``[0.01, 0.1, 1]`` or ``"0.01,0.1,1"``.
        seeds: seeds per fraction: s, s+1, ... from the recipe's ``run.seed``.
        out: the output directory (default ``<run.output_dir>/label-efficiency-<recipe>``).
        pretrained: a finished pretraining run to start from instead of pretraining ``recipe``.
        finetune_recipe, distill_recipe: default to the bundled ones for the recipe's dataset.
        scratch_recipe: the scratch runs' recipe (default: the fine-tune recipe).
        distill: whether to run the fine-tune + distill road.
        scratch_factor: the longer scratch run trains this many times the epochs (1: no longer run).
        epochs: fine-tune and scratch epochs at a fraction instead of the recipe's, e.g. ``{1: 3}`` or ``"1=3"``.
        launcher: a prefix for multi-process runs, e.g. ``"accelerate launch --cpu --num_processes 2"``.
        overrides: for every run; ``pretrain_overrides`` for the pretraining only, ``finetune_overrides``
            for the fine-tune, distill and scratch runs only.

    Raises:
        UserError: a bad fraction, seed count, factor, override or recipe; a run's config that is
            invalid or builds another network on other images than the pretrained encoder's; a run
            directory of ``out`` made with other settings.
    """
    if not isinstance(fractions, str):
        fractions = ",".join(map(str, fractions))
    if epochs is not None and not isinstance(epochs, str):
        epochs = ",".join(f"{fraction}={count}" for fraction, count in epochs.items())
    overrides, pretrain_overrides, finetune_overrides = map(list, (overrides, pretrain_overrides, finetune_overrides))
    parsed = parse_fractions(fractions)
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    if scratch_factor < 1:
        raise UserError(f"--scratch-factor must be at least 1 (1: no longer scratch run), got {scratch_factor}")
    check_overrides(overrides, "override")
    check_overrides(pretrain_overrides, "--pretrain-override")
    check_overrides(finetune_overrides, "--finetune-override", ("run.seed",))
    if pretrained is not None and pretrain_overrides:
        raise UserError("--pretrain-override has nothing to apply to with --pretrained (no pretraining runs)")
    recipe = find_recipe(recipe)  # a bundled recipe's name becomes its file: the runs get a path
    base = load_config(recipe, [*overrides, *pretrain_overrides])
    finished = pretrained_run(Path(pretrained)) if pretrained is not None else None
    if finished is not None:
        theirs = (yaml.safe_load((finished / "config.yaml").read_text()) or {}).get("data", {}).get("name")
        if theirs != base.data.name:
            raise UserError(
                f"--pretrained '{pretrained}' was trained on data.name={theirs}, the recipe names "
                f"data.name={base.data.name}; give the recipe it was trained with"
            )
    finetune_recipe = find_recipe(finetune_recipe) if finetune_recipe else default_recipe("finetune", base.data.name)
    if distill and any(f < 1 for f in parsed):
        distill_recipe = find_recipe(distill_recipe) if distill_recipe else default_recipe("distill", base.data.name)
    else:
        distill_recipe = None
    scratch_recipe = find_recipe(scratch_recipe) if scratch_recipe else finetune_recipe
    own_epochs = {}
    for kind, path in (("fine-tune", finetune_recipe), ("scratch", scratch_recipe)):
        try:
            own_epochs[kind] = load_config(path, [*overrides, *finetune_overrides]).train.epochs
        except UserError as error:
            raise UserError(f"{kind} recipe: {error}") from None
    out = Path(out) if out else Path(base.run.output_dir) / f"label-efficiency-{recipe.stem}"
    plan = Plan(
        recipe=recipe.resolve(),
        finetune_recipe=finetune_recipe.resolve(),
        distill_recipe=distill_recipe.resolve() if distill_recipe else None,
        overrides=overrides,
        pretrain_overrides=pretrain_overrides,
        finetune_overrides=finetune_overrides,
        fractions=parsed,
        seeds=[base.run.seed + i for i in range(seeds)],
        out=out.resolve(),
        pretrained=finished,
        scratch_factor=scratch_factor,
        finetune_epochs=own_epochs["fine-tune"],
        scratch_recipe=scratch_recipe.resolve(),
        scratch_epochs=own_epochs["scratch"],
        epochs=parse_epochs(epochs, parsed),
        launcher=launcher,
    )
    check_runs(plan_runs(plan), plan)
    return plan


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
                    command=runner.command(
                        runner.EVALUATE, [str(pre), *eval_overrides, "--out", str(result)], plan.launcher
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
    batch_checked: set[tuple[str, float | None]] = set()
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
            option = options.get(run.kind, "--finetune-recipe")
            kept = run.kind == "finetune" and cfg.method.options["finetune_from_projector_layer"] > 0
            keys = (*SAME_AS_PRETRAINED, *(SAME_PROJECTOR if kept else ()))
            if (differs := first_difference(to_dict(cfg), encoder, keys)) is not None:
                key, mine, theirs = differs
                raise UserError(
                    f"run {run.name}: {key}={mine}, but the pretrained encoder has {key}={theirs}; "
                    f"every road needs the same network on the same images: pass {key}={theirs} "
                    f"(an override for every run) or another {option}"
                )
        if run.kind in ("finetune", "scratch") and (run.kind, cfg.data.label_fraction) not in batch_checked:
            batch_checked.add((run.kind, cfg.data.label_fraction))  # every seed's subset has the same size
            check_labelled_batch(run, cfg, "--fractions")
        if run.run_dir is not None:
            refuse_changed_run_dir(run, cfg)


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
        mean, std = mean_std(ok)
        summary.append(
            {
                "fraction": fraction,
                "road": road,
                "n_ok": len(ok),
                "n_failed": len(members) - len(ok),
                "top1_mean": mean,
                "top1_std": std,
                "wall_s_mean": mean_std([r["wall_s"] for r in members if r["wall_s"] is not None])[0],
            }
        )
    return summary


def paired_gains(rows: list[dict]) -> list[dict]:
    """Per fraction, each road from the pretrained encoder minus ``scratch-best`` on the same seed (the
    same labelled images): :func:`~sslkit.experiments.stats.paired_difference`. Pairing by seed takes out
    what the choice of labelled images does to both."""
    top1 = {(r["fraction"], r["road"], r["seed"]): r["top1"] for r in rows if r["top1"] is not None}
    gains = []
    for fraction in dict.fromkeys(r["fraction"] for r in rows):
        scratch = {seed: value for (f, road, seed), value in top1.items() if (f, road) == (fraction, "scratch-best")}
        for road in GAIN_ROADS:
            ours = {seed: value for (f, name, seed), value in top1.items() if (f, name) == (fraction, road)}
            if (gain := paired_difference(ours, scratch)) is not None:
                gains.append({"fraction": fraction, "road": road, **gain})
    return gains


def write_tables(out: Path, records: list[dict], header: dict, long_runs: bool = True) -> list[dict]:
    """Write points.csv, points.json, summary.csv and gains.csv; returns the summary rows."""
    rows = point_rows(records, long_runs)
    write_csv(
        out / "points.csv",
        ["road", "fraction", "seed", "run", "status", "skipped", "error", "wall_s", "metric", "top1"],
        (
            [
                r["road"],
                fraction_text(r["fraction"]),
                *(r[c] for c in ("seed", "run", "status", "skipped")),
                r["error"] or "",
                "" if r["wall_s"] is None else f"{r['wall_s']:.1f}",
                r["metric"],
                csv_number(r["top1"]),
            ]
            for r in rows
        ),
    )
    (out / "points.json").write_text(json.dumps({**header, "runs": records, "points": rows}, indent=2))
    summary = summarize(rows)
    fraction_csv(out / "summary.csv", summary, ["road", "n_ok", "n_failed"], ["top1_mean", "top1_std", "wall_s_mean"])
    gains = paired_gains(rows)
    fraction_csv(out / "gains.csv", gains, ["road", "n_seeds"], ["gain_mean", "gain_std", "seeds_ahead"])
    return summary


def fraction_csv(path: Path, rows: list[dict], counts: list[str], numbers: list[str]) -> None:
    """A CSV file of ``rows``: the fraction, ``counts`` as they are and ``numbers`` to six significant digits."""
    write_csv(
        path,
        ["fraction", *counts, *numbers],
        ([fraction_text(r["fraction"]), *(r[c] for c in counts), *(csv_number(r[c]) for c in numbers)] for r in rows),
    )


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
        text = mean_std_text(row["top1_mean"], row["top1_std"])
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
        if rows:
            error_bars(axes, [r["fraction"] for r in rows], rows, "top1", label)
    axes.set_xscale("log")
    axes.set_xticks(fractions, [fraction_text(f) for f in fractions])
    axes.minorticks_off()
    axes.set_xlabel("fraction of the training labels")
    axes.set_ylabel("test top-1")
    save_plot(figure, "test top-1 against labels", seeds, path)
    return figure


# --------------------------------------------------------------------------- the comparison


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


def header(plan: Plan) -> dict:
    """What ``points.json`` says the comparison was asked for, above its runs."""
    return {
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


def run_label_efficiency(plan: Plan) -> runner.Outcome:
    """Run (or skip) every run of ``plan``, rewriting the tables after each; the progress shows as it goes.

    Returns:
        The outcome: the summary and gains tables, where the results are, how many runs failed, and the
        exit status (0 when every run succeeded, 1 when any failed, 130 when interrupted).
    """
    runs, out = plan_runs(plan), plan.out
    out.mkdir(parents=True, exist_ok=True)
    # Every run ever timed into this output, also those outside this command's grid: skipped runs keep theirs.
    previous = runner.previous_wall_times(out / "points.json", "runs")
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
        header_now = {**header(plan), "pretrain": _pretrain(records), "wall_times": previous}
        return write_tables(out, records, header_now, plan.scratch_factor > 1)

    records = runner.run_jobs([run.job() for run in runs], out, previous, tables, "runs")
    if records is None:
        return runner.interrupted()

    summary = tables(records)
    shown = [summary_table(summary, _pretrain(records))]
    if gains := paired_gains(point_rows(records, plan.scratch_factor > 1)):
        shown.append(gains_table(gains))
    figure = plot(summary, seeds, out / PLOT_FILE, plan.scratch_factor)
    results = f"results: {out / 'points.csv'}, {out / 'summary.csv'}, {out / 'gains.csv'}, {out / 'points.json'}" + (
        f"; plot: {out / PLOT_FILE}" if figure is not None else f"; no plot ({PLOT_HINT})"
    )
    return runner.finished(records, out, "runs", shown, results)


def _pretrain(records: list[dict]) -> dict | None:
    return next((r for r in records if r["kind"] == "pretrain"), None)
