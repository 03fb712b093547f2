"""The training runs an experiment starts from a pretrained encoder, and what they must share with it.

The label-efficiency comparison and the recipe comparison build their pretraining, fine-tune,
distill and scratch runs alike: a :class:`Run` is the user's own ``sslkit.cli.pretrain`` command
(:func:`trained_run`) with the recipe, the experiment's overrides, its labelled subset
(``data.label_fraction``, ``data.label_seed`` and ``run.seed`` from a fraction and a seed) and
the keys that tie it to other runs (``run.init_from``, ``method.teacher``).

>>> run = trained_run("finetune-f0.1-s0", "finetune", Path("ft.yaml"), [], Path("out/runs"), None, labels=(0.1, 0))
>>> run.argv[:4]
['ft.yaml', 'data.label_fraction=0.1', 'data.label_seed=0', 'run.seed=0']
>>> run.result
PosixPath('out/runs/finetune-f0.1-s0/results.json')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sslkit import methods
from sslkit.command_lines import pretrain
from sslkit.config import Config, find_recipe, flatten, to_dict
from sslkit.datasets import build_splits
from sslkit.errors import UserError
from sslkit.experiments import runner
from sslkit.experiments.jobs import TRAINED, Job, command_line

# Set last for every run an experiment trains (trained_run): where it goes, and that it continues from its last
# checkpoint. An override of them would break the experiment's bookkeeping.
PLACE_KEYS = ("run.name", "run.output_dir", "run.resume")
# ... and, for the runs trained from a pretrained encoder on a budget of labels, what ties them to it.
RESERVED_KEYS = (
    *PLACE_KEYS,
    "run.init_from",
    "method.teacher",
    "data.label_fraction",
    "data.labels_per_class",
    "data.label_seed",
    "data.label_subset",
    "eval.label_fraction",
    "eval.labels_per_class",
)
# Paths: the same place may be spelled differently (relative, absolute); compared resolved. Validation leaves
# them out: they name what earlier runs of the experiment write (a backbone, a teacher, a label file).
PATH_KEYS = ("run.init_from", "method.teacher", "data.label_subset")
# What a trained run must share with the pretrained encoder: the network its backbone loads into, and the images.
SAME_AS_PRETRAINED = ("data.name", "model.backbone", "model.width", "model.cifar_stem", "model.kwargs")


@dataclass
class Run:
    """One job of an experiment, with what the experiment knows of it: its kind, labels and seed, and what its
    config is made of."""

    name: str
    kind: str  # pretrain, frozen, finetune, distill, fixmatch, scratch, ..., calibrate; embed, select
    fraction: float | None  # None: a pretraining, or a budget counted in labels
    seed: int | None
    module: str  # the command, python -m MODULE
    argv: list[str]  # built by its builder (sslkit.command_lines)
    result: Path  # results.json in its run directory, or the frozen evaluation's JSON
    needs: tuple[str, ...] = ()
    launcher: str | None = None
    # What validation loads: the recipe and the overrides the command gives it.
    recipe: Path | None = None
    overrides: list[str] = field(default_factory=list)
    run_dir: Path | None = None  # for pretraining runs: where its config.yaml is saved
    tags: dict[str, Any] = field(default_factory=dict)  # the experiment's own columns for its record

    @property
    def command(self) -> list[str]:
        return command_line(self.module, self.argv, self.launcher)

    def job(self) -> Job:
        """The run as the runner runs it; its record keeps the kind, fraction, seed and tags."""
        metrics_at, shown, complete_key = RESULT_FILES.get(self.kind, (TRAINED, ("finetune_top1",), None))
        return Job(
            name=self.name,
            module=self.module,
            argv=tuple(self.argv),
            result=self.result,
            metrics_at=metrics_at,
            needs=self.needs,
            shown=shown,
            fields={"kind": self.kind, "fraction": self.fraction, "seed": self.seed, **self.tags},
            complete_key=complete_key,
            launcher=self.launcher,
        )


# What the result file of a run that is not a training run holds: where its figures are, those printed when it
# finishes, and the key that says it is whole. A trained run's is its results.json (jobs.TRAINED).
RESULT_FILES: dict[str, tuple[tuple[str, ...], tuple[str, ...], str | None]] = {
    "frozen": (("results",), ("linear_top1", "knn_top1"), None),  # sslkit-evaluate --out
    # sslkit-embed's meta.json is written before the rows and says "complete" after the last one
    "embed": ((), (), "complete"),
    "select": ((), (), None),  # sslkit-select's label file, written whole
}


def refuse_reserved(overrides: list[str], reserved: tuple[str, ...], option: str, why: str) -> None:
    """Refuse an override of a key the experiment sets itself, in one line: ``{option} '{override}': {why}``, where
    ``why`` (what sets the key, and what to use instead) names it as ``{key}``.

    Raises:
        UserError: for the first override of a ``reserved`` key.
    """
    for text in overrides:
        key = text.partition("=")[0].strip()
        if key in reserved:
            raise UserError(f"{option} '{text}': " + why.format(key=key))


def fraction_text(fraction: float) -> str:
    """``0.01`` -> ``0.01``, ``1.0`` -> ``1``: as run names and tables show it."""
    return f"{fraction:g}"


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
    scratch runs take ``run.init_from`` (the pretrained run, or ``null``) in ``keys``.
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
        module=pretrain.MODULE,
        argv=pretrain.build_argv(recipe, overrides),
        result=runs_dir / name / "results.json",
        needs=needs,
        launcher=launcher,
        recipe=recipe,
        overrides=overrides,
        run_dir=runs_dir / name,
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


def first_difference(own: dict, encoder: dict, keys: tuple[str, ...]) -> tuple[str, object, object] | None:
    """The first of the dotted ``keys`` whose value differs between two configs (as dicts): (key, own, encoder's)."""
    for key in keys:
        section, name = key.split(".")
        if (mine := own[section][name]) != (theirs := encoder[section][name]):
            return key, mine, theirs
    return None


def refuse_changed_run_dir(run: Run, cfg: Config) -> None:
    """Refuse to skip or resume ``run``'s directory when it was made with another config than ``cfg``, the run's
    validated config: the paths validation leaves out (:data:`PATH_KEYS`) are compared as the run gives them.

    Raises:
        UserError: as :func:`~sslkit.experiments.runner.refuse_changed_run` says.
    """
    wanted = flatten(to_dict(cfg))
    for override in run.overrides:
        key, _, value = override.partition("=")
        if key in PATH_KEYS:
            wanted[key] = value
    runner.refuse_changed_run(run.run_dir, wanted, PATH_KEYS, "comparison")


def check_labelled_batch(run: Run, cfg: Config, fraction_option: str) -> None:
    """A run that trains on its labelled subset alone must fill one batch with it: found before any training,
    not when the run starts after minutes of pretraining.

    Raises:
        UserError: naming the run, how many labelled images its fraction leaves, and what would fit.
    """
    if not methods.METHODS[cfg.method.name].needs_labels or cfg.data.label_fraction is None:
        return
    labelled = len(build_splits(cfg, labelled_training=True).train)
    batch = cfg.train.batch_size
    if labelled < batch:
        raise UserError(
            f"run {run.name}: {fraction_option} {cfg.data.label_fraction:g} leaves {labelled} labelled images of "
            f"{cfg.data.name}, fewer than its train.batch_size {batch}; use a larger {fraction_option}, or "
            f"--finetune-override train.batch_size={max(1, labelled)}"
        )
