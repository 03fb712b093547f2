"""Label efficiency: what pretraining (and the choice of which images to label) buys with few labels.

    plan = plan_label_efficiency("quickstart", fractions=[0.05, 0.1, 1], seeds=3, overrides=["train.threads=1"])
    outcome = run_label_efficiency(plan, LocalExecutor(jobs=2))  # its tables and notes to show, and the exit status

is ``sslkit-label-efficiency quickstart --fractions 0.05,0.1,1 --seeds 3 --jobs 2 train.threads=1``
(:mod:`sslkit.cli.label_efficiency`); every keyword of :func:`plan_label_efficiency` is the option of
that name, and its errors name the options.

RECIPE is a self-supervised pretraining recipe. It is pretrained once (or ``--pretrained RUN_DIR``
names a finished run to start from). The labels come in budgets: fractions of the N labelled
training images (``--fractions 0.01,0.1,1``) or numbers of them (``--labels 100,600``). For every
budget, seed s and selection (``--select``, :mod:`sslkit.experiments.label_budgets`), the same
labelled images go down every road:

- ``balanced`` (the default): the same number of images of every class at random, seeded by s
  (``data.label_fraction=f`` or ``data.labels_per_class=n/C``, ``data.label_seed=s``). Balancing
  reads every image's class: an oracle no one holding unlabelled images has;
- ``random``, ``kmeans``, ``typiclust``, ``probcover``, ``kcenter``: ``sslkit-select`` chooses the
  images from the pretrained encoder's embeddings of the training split (``sslkit-embed``, once),
  without their labels, seeded by s, and writes ``OUT/labels/<strategy>-<budget>-s<s>.json``; every
  road then trains on that file (``data.label_fraction=null data.labels_per_class=null
  data.label_subset=FILE``). A fraction f is ``round(f N)`` images.

A budget of every label (1, or N) is run once, under the selection ``all``. The roads:

- ``linear``, ``knn``: the frozen pretrained encoder, evaluated with those labels
  (``sslkit-evaluate PRE eval.label_fraction=f data.label_seed=s run.seed=s``);
- ``finetune``: the whole network fine-tuned from the pretrained backbone on those labels
  (``--finetune-recipe``, ``run.init_from=PRE``); its own classifier's test top-1, ``finetune_top1``;
- ``distill``: a student started from the pretrained backbone, taught by that fine-tuned network on
  every training image and trained with the same labels (``--distill-recipe``,
  ``method.teacher=<the finetune run>``), as SimCLRv2; not at a budget of every label (nothing
  unlabelled to distill on), nor with ``--no-distill``;
- ``fixmatch``, ``fixmatch-scratch`` (with ``--fixmatch``): FixMatch, semi-supervised, on the same
  labels and every training image unlabelled (``--fixmatch-recipe``), from the pretrained encoder
  (``run.init_from=PRE``) and from random weights; the test top-1 of its weight average's
  classifier, ``finetune_top1``; not at a budget of every label (nothing unlabelled);
- ``fixmatch-distill`` (with ``--fixmatch`` and the distill road): the distill road with FixMatch's
  run from the encoder as the teacher (its weight average teaches): pretraining, the unlabelled images
  twice (pseudo-labels, then the teacher's predictions), and distillation, SimCLRv2's third step;
- ``scratch``, ``scratch-long``: the same network from random weights on the same labelled images,
  for the recipe's epochs and for ``--scratch-factor`` times as many; ``scratch-best`` is the better
  of the two, per seed. The recipe is the fine-tune recipe (the same augmentation and optimizer), or
  ``--scratch-recipe``: a schedule tuned for training from scratch (``fashion_mnist_scratch``).

``--epochs 1=3`` (``--labels``: ``--epochs 60000=3``) gives the fine-tune and scratch runs at a budget
their own epochs (here 3 with all the labels, where the recipe's 30 would cost ten times the 10% runs):
the steps a fine-tune takes grow with its labelled images, and the budget that suits 600 of them is
not the one for 60,000. The distill and FixMatch runs keep their recipes' epochs (a pass over every
training image each).

The fine-tune, distill and FixMatch recipes default to the bundled ``<dataset>_finetune`` /
``_distill`` / ``_fixmatch`` (``fashion_mnist_*`` for data.name=fashion_mnist, ``quickstart_*``
otherwise). Seeds are s, s+1, ... from the recipe's ``run.seed``. Overrides after RECIPE apply to every
run (``train.threads=2``); ``--pretrain-override`` to the pretraining only, ``--finetune-override`` to
the fine-tune, distill, FixMatch and scratch runs only (``train.epochs=5``), ``--fixmatch-override`` to
the two FixMatch runs only (``train.epochs=20``: FixMatch at four times its recipe's length). Every run is its own
subprocess, the user's command:

    python -m sslkit.cli.pretrain RECIPE <overrides> run.output_dir=OUT/runs run.name=pretrain run.resume=auto
    python -m sslkit.cli.evaluate OUT/runs/pretrain <overrides> eval.label_fraction=F data.label_seed=S run.seed=S
        --out OUT/points/frozen-fF-sS.json
    python -m sslkit.cli.pretrain FINETUNE <overrides> run.init_from=OUT/runs/pretrain data.label_fraction=F
        data.label_seed=S run.seed=S run.output_dir=OUT/runs run.name=finetune-fF-sS run.resume=auto
    ...
    python -m sslkit.cli.embed OUT/runs/pretrain <overrides> --split train --out OUT/embeddings
    python -m sslkit.cli.label_selection OUT/embeddings --budget B --strategy typiclust --seed S
        --out OUT/labels/typiclust-nB-sS.json
    python -m sslkit.cli.pretrain FINETUNE <overrides> run.init_from=OUT/runs/pretrain data.label_fraction=null
        data.labels_per_class=null data.label_subset=OUT/labels/typiclust-nB-sS.json run.seed=S ...
        run.name=finetune-typiclust-nB-sS ...

(``--launcher`` in place of ``python`` when given, but for sslkit-select, one process). Run names carry
the budget as ``f0.01`` (a fraction) or ``n100`` (labels), after the strategy's name when one chose
the labels. Every run's config is validated before anything runs (a typo fails in a second, exit
status 2, one line). The comparison is resumable: a run whose result file exists (``results.json``
in its run directory; the frozen evaluation's JSON; the label file; the embeddings' ``meta.json``
once complete) is skipped ("done, skipped"), any other runs again, continuing from its last
checkpoint. A run that fails is recorded with its error (the last line of its stderr), the runs
that need it are recorded as not run, and the others go on; the exit status is then 1.

OUT receives, updated after every run (:mod:`sslkit.experiments.label_efficiency_tables`):

- ``points.csv`` / ``points.json``: one row per road, selection, budget and seed: the selection,
  the budget as asked (``budget``; ``fraction`` when it is one) and the labelled images it made
  (``labels``), test top-1, status, error, the run it comes from, its wall time and its CPU time
  (``wall_s``, ``cpu_s``: all its processes together; ``points.json`` also lists the runs);
- ``summary.csv``: mean and sample standard deviation over seeds of every road at every budget and
  selection, and the mean wall and CPU time of its runs;
- ``gains.csv``: paired by seed (the same labelled images), ``road`` minus ``versus``: what pretraining
  buys (fine-tune, distill, FixMatch and FixMatch + distill minus scratch best, FixMatch from the
  encoder minus from scratch), what the unlabelled images buy (FixMatch minus the fine-tune, FixMatch
  from scratch minus scratch best, each distilled student minus its teacher), and, with several
  selections, every road with a selection minus with ``random`` (or ``balanced`` without it) at the
  same budget and seed: mean, sample standard deviation and the number of seeds on which the road is
  ahead;
- ``label_efficiency.png`` (with matplotlib): test top-1 against the budget on a log axis, one line per
  road (linear probe, fine-tune, fine-tune + distill, FixMatch; scratch best and FixMatch from scratch
  dashed, open markers, in the colour of their pretrained twins), one panel per selection, error bars
  one standard deviation over seeds;
- ``embeddings/``, ``labels/``: the pretrained encoder's embeddings and the label files the strategies wrote;
- ``logs/<run>.out`` / ``.err``: each run's stdout and stderr.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from sslkit import methods
from sslkit.command_lines import embed as embed_command
from sslkit.command_lines import evaluate as evaluate_command
from sslkit.command_lines import label_selection as select_command
from sslkit.config import Config, find_recipe, load_config, to_dict
from sslkit.errors import UserError
from sslkit.experiments.executor import Executor
from sslkit.experiments.experiment import Experiment, Outcome, finished, run_experiment
from sslkit.experiments.jobs import Job
from sslkit.experiments.label_budgets import (
    EVERY_LABEL,
    Budget,
    LabelPool,
    LabelSet,
    check_budgets,
    label_pool,
    label_sets,
    parse_budgets,
    parse_selections,
)
from sslkit.experiments.label_efficiency_tables import (
    PLOT_FILE,
    gains_table,
    paired_gains,
    plot,
    point_rows,
    selection_gains,
    selection_table,
    summary_table,
    write_tables,
)
from sslkit.experiments.local import LocalExecutor
from sslkit.experiments.report import PLOT_HINT
from sslkit.experiments.roads import PRETRAINING, RECIPE_OPTIONS, UNLABELLED
from sslkit.experiments.runs import (
    PATH_KEYS,
    RESERVED_KEYS,
    SAME_AS_PRETRAINED,
    Run,
    default_recipe,
    first_difference,
    fraction_text,
    refuse_changed_run_dir,
    refuse_reserved,
    trained_run,
)
from sslkit.selection import STRATEGIES

# What a fine-tune that keeps pretrained projector layers must also share with the pretrained encoder:
# the projector they come from
SAME_PROJECTOR = ("model.projector_hidden", "model.projector_out", "model.projector_layers")
# Data whose images sslkit-embed names by path, not by index into a split: no label file of theirs trains a run.
NOT_BY_INDEX = ("imagefolder", "webdataset")


@dataclass
class Plan(Experiment):
    """Everything the comparison is asked for, resolved: recipes, overrides, the grid and where it goes."""

    records_file = "points.json"

    recipe: Path
    finetune_recipe: Path
    distill_recipe: Path | None  # None: no distill road
    fixmatch_recipe: Path | None  # None: no FixMatch roads
    overrides: list[str]
    pretrain_overrides: list[str]
    finetune_overrides: list[str]
    fixmatch_overrides: list[str]  # after finetune_overrides, for the FixMatch runs only
    budgets: list[Budget]
    selections: list[str]
    seeds: list[int]
    pool: LabelPool  # the labelled training images the budgets are taken from
    out: Path
    pretrained: Path | None
    scratch_factor: int
    finetune_epochs: int  # the fine-tune recipe's own
    scratch_recipe: Path  # the scratch runs' recipe: --scratch-recipe, else the fine-tune recipe
    scratch_epochs: int  # the scratch recipe's own
    epochs: dict[str, int]  # --epochs: budget text -> fine-tune epochs at that budget, where it differs
    launcher: str | None
    # The frozen evaluations' own: a linear probe even where the encoder's recipe skipped it (eval.linear_epochs=0)
    probe_overrides: list[str] = dataclasses.field(default_factory=list)

    def label_sets(self) -> list[LabelSet]:
        return label_sets(self.budgets, self.selections, self.seeds, self.pool, self.out / "labels")

    def jobs(self) -> list[Job]:
        return [run.job() for run in plan_runs(self)]

    def intro(self, jobs: list[Job]) -> str:
        after = ", after the pretraining" if self.pretrained is None else ""
        return f"label efficiency: {len(jobs)} runs ({grid_text(self)}{after}) -> {self.out}"

    def prepare(self) -> None:
        (self.out / "points").mkdir(exist_ok=True)  # where the frozen evaluations write (--out's folder must exist)

    def write_tables(self, records: list[dict], times: dict[str, dict]) -> list[dict]:
        header_now = {**header(self), "pretrain": _pretrain(records), "times": times}
        return write_tables(self.out, records, header_now, self.scratch_factor > 1)

    def conclusion(self, records: list[dict], summary: list[dict]) -> Outcome:
        """The summary, the gains and what selection buys, and the plot."""
        shown = [summary_table(summary, _pretrain(records))]
        rows = point_rows(records, self.scratch_factor > 1)
        for pairs in (PRETRAINING, UNLABELLED):
            if gains := paired_gains(rows, pairs):
                shown.append(gains_table(gains, pairs))
        if (chosen := selection_table(selection_gains(rows))) is not None:
            shown.append(chosen)
        out = self.out
        figure = plot(summary, len(self.seeds), out / PLOT_FILE, self.scratch_factor)
        tables = ", ".join(str(out / name) for name in ("points.csv", "summary.csv", "gains.csv", "points.json"))
        plotted = f"; plot: {out / PLOT_FILE}" if figure is not None else f"; no plot ({PLOT_HINT})"
        return finished(records, out, self.noun, shown, f"results: {tables}{plotted}")


# --------------------------------------------------------------------------- the plan, checked


def parse_epochs(text: str | None, budgets: list[float], option: str = "--fractions") -> dict[str, int]:
    """``--epochs 0.01=60,1=3`` -> ``{"0.01": 60, "1": 3}``: positive epochs at budgets of ``option``."""
    if not text:
        return {}
    epochs = {}
    unit = "FRACTION" if option == "--fractions" else "LABELS"
    for part in text.split(","):
        budget, _, count = part.partition("=")
        try:
            key, value = fraction_text(float(budget)), int(count)
        except ValueError:
            raise UserError(
                f"--epochs '{text}': '{part.strip()}' is not {unit}=EPOCHS; e.g. --epochs 1=3 trains 3 epochs "
                f"with all the labels"
            ) from None
        if key not in {fraction_text(b) for b in budgets}:
            known = ",".join(map(fraction_text, budgets))
            raise UserError(f"--epochs '{text}': {key} is not one of {option} {known}")
        if value < 1:
            raise UserError(f"--epochs '{text}': {key}={value}; a run trains at least 1 epoch")
        epochs[key] = value
    return epochs


def check_overrides(texts: list[str], option: str, also_reserved: tuple[str, ...] = ()) -> None:
    """Refuse overrides of the keys this tool sets itself, with what to use instead."""
    instead = "use --fractions or --labels, --select, --seeds, --out or --pretrained instead"
    refuse_reserved(
        texts, (*RESERVED_KEYS, *also_reserved), option, f"label_efficiency sets {{key}} for every run; {instead}"
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


def joined(values: str | Sequence | None) -> str | None:
    """An option's list as the command line gives it: ``[0.01, 1]`` -> ``"0.01,1"``."""
    return values if values is None or isinstance(values, str) else ",".join(map(str, values))


def plan_label_efficiency(
    recipe: str | Path,
    fractions: str | Sequence[float] | None = None,
    seeds: int = 1,
    *,
    labels: str | Sequence[int] | None = None,
    select: str | Sequence[str] = "balanced",
    fixmatch: bool = False,
    out: str | Path | None = None,
    pretrained: str | Path | None = None,
    finetune_recipe: str | Path | None = None,
    distill_recipe: str | Path | None = None,
    fixmatch_recipe: str | Path | None = None,
    scratch_recipe: str | Path | None = None,
    distill: bool = True,
    scratch_factor: int = 3,
    epochs: str | Mapping[float, int] | None = None,
    launcher: str | None = None,
    overrides: Sequence[str] = (),
    pretrain_overrides: Sequence[str] = (),
    finetune_overrides: Sequence[str] = (),
    fixmatch_overrides: Sequence[str] = (),
) -> Plan:
    """The comparison resolved and checked, every run's config validated, before anything runs.

    Args:
        recipe: the self-supervised pretraining recipe (a file or a bundled recipe's name).
        fractions: label fractions in (0, 1], e.g. ``[0.01, 0.1, 1]`` or ``"0.01,0.1,1"``; or instead
        labels: numbers of labelled images, e.g. ``[100, 600]`` or ``"100,600"``.
        seeds: seeds per budget and selection: s, s+1, ... from the recipe's ``run.seed``.
        select: which images get the labels: ``balanced`` and any of :data:`sslkit.selection.STRATEGIES`.
        fixmatch: add the FixMatch roads, from the pretrained encoder and from scratch.
        out: the output directory (default ``<run.output_dir>/label-efficiency-<recipe>``).
        pretrained: a finished pretraining run to start from instead of pretraining ``recipe``.
        finetune_recipe, distill_recipe, fixmatch_recipe: default to the bundled ones for the recipe's dataset.
        scratch_recipe: the scratch runs' recipe (default: the fine-tune recipe).
        distill: whether to run the fine-tune + distill road.
        scratch_factor: the longer scratch run trains this many times the epochs (1: no longer run).
        epochs: fine-tune and scratch epochs at a budget instead of the recipe's, e.g. ``{1: 3}`` or ``"1=3"``.
        launcher: a prefix for multi-process runs, e.g. ``"accelerate launch --cpu --num_processes 2"``.
        overrides: for every run; ``pretrain_overrides`` for the pretraining only, ``finetune_overrides``
            for the fine-tune, distill, FixMatch and scratch runs only, ``fixmatch_overrides`` for the two
            FixMatch runs only (after ``finetune_overrides``), e.g. ``["train.epochs=20"]``.

    Raises:
        UserError: a bad budget, selection, seed count, factor, override or recipe; a budget the labelled
            training images cannot give; a run's config that is invalid or builds another network on other
            images than the pretrained encoder's; a run directory of ``out`` made with other settings.
    """
    if epochs is not None and not isinstance(epochs, str):
        epochs = ",".join(f"{budget}={count}" for budget, count in epochs.items())
    overrides, pretrain_overrides = list(overrides), list(pretrain_overrides)
    finetune_overrides, fixmatch_overrides = list(finetune_overrides), list(fixmatch_overrides)
    budgets = parse_budgets(joined(fractions), joined(labels))
    selections = parse_selections(joined(select))
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    if scratch_factor < 1:
        raise UserError(f"--scratch-factor must be at least 1 (1: no longer scratch run), got {scratch_factor}")
    check_overrides(overrides, "override")
    check_overrides(pretrain_overrides, "--pretrain-override")
    check_overrides(finetune_overrides, "--finetune-override", ("run.seed",))
    check_overrides(fixmatch_overrides, "--fixmatch-override", ("run.seed",))
    if fixmatch_overrides and not fixmatch:
        raise UserError("--fixmatch-override has nothing to apply to without --fixmatch (no FixMatch runs)")
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
    pool = budget_pool(base, recipe, [*overrides, *pretrain_overrides], selections)
    check_budgets(budgets, selections, pool, fixmatch)
    below_every_label = any(not pool.everything(b) for b in budgets)
    finetune_recipe = given_or_default(finetune_recipe, "finetune", base)
    distill_recipe = given_or_default(distill_recipe, "distill", base) if distill and below_every_label else None
    fixmatch_recipe = given_or_default(fixmatch_recipe, "fixmatch", base) if fixmatch else None
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
        fixmatch_recipe=fixmatch_recipe.resolve() if fixmatch_recipe else None,
        overrides=overrides,
        pretrain_overrides=pretrain_overrides,
        finetune_overrides=finetune_overrides,
        fixmatch_overrides=fixmatch_overrides,
        budgets=budgets,
        selections=selections,
        seeds=[base.run.seed + i for i in range(seeds)],
        pool=pool,
        out=out.resolve(),
        pretrained=finished,
        scratch_factor=scratch_factor,
        finetune_epochs=own_epochs["fine-tune"],
        scratch_recipe=scratch_recipe.resolve(),
        scratch_epochs=own_epochs["scratch"],
        epochs=parse_epochs(epochs, [b.value for b in budgets], "--labels" if labels is not None else "--fractions"),
        launcher=launcher,
        probe_overrides=probe_overrides(finished, base, overrides),
    )
    check_runs(plan_runs(plan), plan)
    return plan


def probe_overrides(finished: Path | None, base: Config, overrides: list[str]) -> list[str]:
    """``eval.linear_epochs=E`` (the default E) for the frozen evaluations when the encoder's own config skips the
    linear probe (a pretraining run with ``eval.linear_epochs=0`` to save time): the linear road needs one. An
    override of ``eval.linear_epochs`` is the user's choice, and stands."""
    if any(o.partition("=")[0].strip() == "eval.linear_epochs" for o in overrides):
        return []
    encoder = load_config(finished / "config.yaml") if finished is not None else base
    if encoder.eval.linear_epochs > 0:
        return []
    return [f"eval.linear_epochs={type(encoder.eval)().linear_epochs}"]


def given_or_default(recipe: str | Path | None, kind: str, base: Config) -> Path:
    """The recipe the option names, else the bundled one of ``kind`` for the pretraining's dataset."""
    return find_recipe(recipe) if recipe else default_recipe(kind, base.data.name)


def budget_pool(base: Config, recipe: Path, overrides: list[str], selections: list[str]) -> LabelPool:
    """The labelled training images of the pretraining's data (every road's: they share data.name), checked for
    what the selections need.

    Raises:
        UserError: a strategy asked to choose among images that a label file cannot name by index, or among a
            split some of whose classes data.holdout_classes keeps out of training.
    """
    chooses = [s for s in selections if s in STRATEGIES]
    if chooses and base.data.name in NOT_BY_INDEX:
        raise UserError(
            f"--select {chooses[0]}: data.name={base.data.name} names its images by path, and a label file trains "
            f"a run on images named by their index in a dataset's split; use --select balanced"
        )
    if chooses and base.data.holdout_classes:
        raise UserError(
            f"--select {chooses[0]} chooses among every image of the training split, but data.holdout_classes keeps "
            f"some classes out of training; use --select balanced, or no data.holdout_classes"
        )
    nulls = ["data.label_fraction=null", "data.labels_per_class=null", "data.label_subset=null"]
    return label_pool(load_config(recipe, [*overrides, *nulls]))


# --------------------------------------------------------------------------- the runs


def plan_runs(plan: Plan) -> list[Run]:
    """Every run in the order they go: the pretraining, the embeddings when a strategy chooses labels, then per
    budget, seed and selection: the label file a strategy writes, and frozen, fine-tune, distill, FixMatch
    (from the encoder, from scratch), scratch and scratch-long."""
    runs_dir = plan.out / "runs"
    pre = plan.pretrained or runs_dir / "pretrain"
    runs = []
    needs_pre: tuple[str, ...] = ()
    if plan.pretrained is None:
        own = [*plan.overrides, *plan.pretrain_overrides]
        runs.append(trained_run("pretrain", "pretrain", plan.recipe, own, runs_dir, plan.launcher))
        needs_pre = ("pretrain",)
    sets = plan.label_sets()
    embeddings = plan.out / "embeddings"
    if any(labels.chosen_by_strategy for labels in sets):
        argv = embed_command.build_argv(pre, plan.overrides, split="train", out=embeddings)
        embed = Run("embed", "embed", None, None, embed_command.MODULE, argv, embeddings / "meta.json", needs_pre)
        runs.append(dataclasses.replace(embed, launcher=plan.launcher))
    for labels in sets:
        if labels.chosen_by_strategy:
            runs.append(select_run(labels, embeddings))
        runs += road_runs(plan, labels, pre, needs_pre)
    return runs


def select_run(labels: LabelSet, embeddings: Path) -> Run:
    """sslkit-select's choice of ``labels`` from the embeddings (one process: it needs no launcher)."""
    choice = {"budget": labels.labels, "strategy": labels.selection, "seed": labels.seed, "out": labels.file}
    return Run(
        labels.select_run,
        "select",
        labels.budget.fraction,
        labels.seed,
        select_command.MODULE,
        select_command.build_argv(embeddings, **choice),
        labels.file,
        needs=("embed",),
        tags=labels.fields(),
    )


def road_runs(plan: Plan, labels: LabelSet, pre: Path, needs_pre: tuple[str, ...]) -> list[Run]:
    """The runs of every road on ``labels``: frozen, fine-tune, distill, FixMatch (and distilled, and from scratch),
    scratch, scratch-long."""
    runs_dir = plan.out / "runs"
    chosen = (labels.select_run,) if labels.select_run else ()  # the label file they train on
    epochs = plan.epochs.get(labels.budget.text)
    own = [*plan.finetune_overrides, *([] if epochs is None else [f"train.epochs={epochs}"])]
    partial = labels.selection != EVERY_LABEL  # images left unlabelled: something to distill on, or for FixMatch

    def trained(kind: str, recipe: Path, overrides: list[str], needs: tuple[str, ...], **keys) -> Run:
        keys = {**keys, **labels.train_keys()}
        name, all_overrides = labels.run_name(kind), [*plan.overrides, *overrides]
        run = trained_run(name, kind, recipe, all_overrides, runs_dir, plan.launcher, (*needs, *chosen), **keys)
        return dataclasses.replace(run, fraction=labels.budget.fraction, seed=labels.seed, tags=labels.fields())

    name = labels.run_name("frozen")
    result = plan.out / "points" / f"{name}.json"
    eval_overrides = [*plan.overrides, *plan.probe_overrides, *labels.eval_overrides()]
    argv = evaluate_command.build_argv(pre, eval_overrides, out=result)
    frozen = Run(name, "frozen", labels.budget.fraction, labels.seed, evaluate_command.MODULE, argv, result)
    changes = {"needs": (*needs_pre, *chosen), "launcher": plan.launcher, "overrides": eval_overrides}
    runs = [dataclasses.replace(frozen, **changes, tags=labels.fields())]
    runs.append(trained("finetune", plan.finetune_recipe, own, needs_pre, **{"run.init_from": pre}))
    if plan.distill_recipe is not None and partial:
        finetune = labels.run_name("finetune")
        teacher = {"method.teacher": runs_dir / finetune, "run.init_from": pre}
        needs = (*needs_pre, finetune)  # the distill recipe keeps its own epochs: not --epochs
        runs.append(trained("distill", plan.distill_recipe, plan.finetune_overrides, needs, **teacher))
    if plan.fixmatch_recipe is not None and partial:  # its own epochs too: passes over every training image
        recipe, overrides = plan.fixmatch_recipe, [*plan.finetune_overrides, *plan.fixmatch_overrides]
        runs.append(trained("fixmatch", recipe, overrides, needs_pre, **{"run.init_from": pre}))
        if plan.distill_recipe is not None:
            fixmatch = labels.run_name("fixmatch")
            teacher = {"method.teacher": runs_dir / fixmatch, "run.init_from": pre}
            needs = (*needs_pre, fixmatch)
            runs.append(trained("fixmatch-distill", plan.distill_recipe, plan.finetune_overrides, needs, **teacher))
        runs.append(trained("fixmatch-scratch", recipe, overrides, (), **{"run.init_from": "null"}))
    # Random weights: run.init_from=null, in case the fine-tune recipe names a start of its own.
    runs.append(trained("scratch", plan.scratch_recipe, own, (), **{"run.init_from": "null"}))
    if plan.scratch_factor > 1:
        longer = [*own, f"train.epochs={plan.scratch_factor * (epochs or plan.scratch_epochs)}"]
        runs.append(trained("scratch-long", plan.scratch_recipe, longer, (), **{"run.init_from": "null"}))
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
    # The teacher, the pretrained backbone and the label file do not exist before their runs: the paths are
    # checked when the run starts (they are its inputs), everything else now.
    overrides = [o for o in run.overrides if o.partition("=")[0] not in PATH_KEYS]
    return load_config(run.recipe, overrides)


def check_runs(runs: list[Run], plan: Plan) -> None:
    """Validate every run's config before anything runs; refuse a run directory made with another config.

    Raises:
        UserError: a run's config is invalid or builds another network on other data than the
            pretrained encoder's, its labelled images do not fill one of its batches, or one of its run
            directories was made with other settings (skipping or resuming it would mix two experiments).
    """
    if plan.pretrained is not None:
        encoder = to_dict(load_config(plan.pretrained / "config.yaml", plan.overrides))
    else:
        encoder = to_dict(load_config(plan.recipe, [*plan.overrides, *plan.pretrain_overrides]))
    batch_checked: set[tuple[str, str, str]] = set()
    for run in runs:
        if run.kind in ("embed", "select"):  # options, no config: the frozen evaluation validates the encoder's
            continue
        try:
            cfg = validation_config(run, plan)
        except UserError as error:
            raise UserError(f"run {run.name}: {error}") from None
        if run.kind in RECIPE_OPTIONS:
            kept = run.kind == "finetune" and cfg.method.options["finetune_from_projector_layer"] > 0
            keys = (*SAME_AS_PRETRAINED, *(SAME_PROJECTOR if kept else ()))
            if (differs := first_difference(to_dict(cfg), encoder, keys)) is not None:
                key, mine, theirs = differs
                raise UserError(
                    f"run {run.name}: {key}={mine}, but the pretrained encoder has {key}={theirs}; "
                    f"every road needs the same network on the same images: pass {key}={theirs} "
                    f"(an override for every run) or another {RECIPE_OPTIONS[run.kind]}"
                )
        if run.kind in ("finetune", "scratch", "fixmatch"):
            key = (run.kind, run.tags["selection"], run.tags["budget"])
            if key not in batch_checked:
                batch_checked.add(key)  # every seed's labels are as many
                check_batch(run, cfg, plan)
        if run.run_dir is not None:
            refuse_changed_run_dir(run, cfg)


def check_batch(run: Run, cfg: Config, plan: Plan) -> None:
    """A run that trains on its labelled images alone fills a batch with them; FixMatch's step of ``mu B``
    unlabelled images fits in the training set. Found before any training, not when the run starts after
    minutes of pretraining.

    Raises:
        UserError: naming the run, its labelled (or training) images and the batch, and what would fit.
    """
    batch, option = cfg.train.batch_size, "--fractions" if run.fraction is not None else "--labels"
    if run.kind == "fixmatch":
        mu = cfg.method.options["mu"]
        if batch * mu > plan.pool.images:
            raise UserError(
                f"run {run.name}: a FixMatch step draws train.batch_size x method.mu = {batch} x {mu} unlabelled "
                f"images, more than the {plan.pool.images} of {plan.pool.dataset}; --fixmatch-override "
                f"train.batch_size={plan.pool.images // mu}, or another --fixmatch-recipe"
            )
        return
    labelled = run.tags["labels"]
    if methods.METHODS[cfg.method.name].needs_labels and labelled < batch:
        raise UserError(
            f"run {run.name}: {option} {run.tags['budget']} leaves {labelled} labelled images of "
            f"{plan.pool.dataset}, fewer than its train.batch_size {batch}; use a larger {option}, or "
            f"--finetune-override train.batch_size={labelled}"
        )


# --------------------------------------------------------------------------- the comparison


def labels_note(plan: Plan) -> str | None:
    """A note when the pretraining itself trains with labels (SupCon, supervised): the frozen, fine-tune and
    distill roads then had more labels than their budget says."""
    config = plan.pretrained / "config.yaml" if plan.pretrained is not None else plan.recipe
    cfg = load_config(config, plan.overrides if plan.pretrained else [*plan.overrides, *plan.pretrain_overrides])
    if not methods.METHODS[cfg.method.name].needs_labels:
        return None
    subset = cfg.data.label_fraction is not None or cfg.data.labels_per_class is not None
    return (
        f"note: the pretraining (method.name={cfg.method.name}) trains with labels"
        + (" (its own data.label_fraction / labels_per_class)" if subset else ", all of them")
        + ": the frozen, fine-tune and distill roads have seen more labels than their budget"
    )


def header(plan: Plan) -> dict:
    """What ``points.json`` says the comparison was asked for, above its runs."""
    return {
        "recipe": str(plan.recipe),
        "finetune_recipe": str(plan.finetune_recipe),
        "scratch_recipe": str(plan.scratch_recipe),
        "distill_recipe": None if plan.distill_recipe is None else str(plan.distill_recipe),
        "fixmatch_recipe": None if plan.fixmatch_recipe is None else str(plan.fixmatch_recipe),
        "pretrained": str(plan.pretrained or plan.out / "runs" / "pretrain"),
        "overrides": plan.overrides,
        "pretrain_overrides": plan.pretrain_overrides,
        "finetune_overrides": plan.finetune_overrides,
        "fixmatch_overrides": plan.fixmatch_overrides,
        "fractions": [b.text for b in plan.budgets if b.fraction is not None],
        "labels": [b.count for b in plan.budgets if b.count is not None],
        "select": plan.selections,
        "labelled_images": plan.pool.images,
        "classes": plan.pool.classes,
        "seeds": plan.seeds,
        "scratch_factor": plan.scratch_factor,
        "epochs": plan.epochs,
        "launcher": plan.launcher,
    }


def grid_text(plan: Plan) -> str:
    """``2 label fractions x 2 selections x 3 seeds``: what the runs are made over."""

    def count(n: int, noun: str) -> str:
        return f"{n} {noun}{'s' if n > 1 else ''}"

    budget = "label fraction" if plan.budgets[0].fraction is not None else "label budget"
    parts = [count(len(plan.budgets), budget)]
    if len(plan.selections) > 1 or plan.selections != ["balanced"]:
        parts.append(count(len(plan.selections), "selection"))
    return " x ".join([*parts, count(len(plan.seeds), "seed")])


def run_label_efficiency(plan: Plan, executor: Executor | None = None) -> Outcome:
    """Run (or skip) every run of ``plan`` on ``executor`` (default: here, one at a time), rewriting the tables
    after each; the progress shows as it goes.

    Returns:
        The outcome: the summary and gains tables, where the results are, how many runs failed, and the
        exit status (0 when every run succeeded, 1 when any failed, 130 when interrupted).
    """
    return run_experiment(plan, executor or LocalExecutor())


def _pretrain(records: list[dict]) -> dict | None:
    return next((r for r in records if r["kind"] == "pretrain"), None)
