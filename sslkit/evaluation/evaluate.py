"""A trained encoder evaluated as ``sslkit-evaluate`` does it: weighted kNN, linear probe, retrieval.

    evaluation = evaluate_encoder("runs/quickstart", overrides=["eval.knn_k=20"])
    evaluation.results["encoder"]["knn_top1"]  # and evaluation.out, the JSON file it wrote

The target is a run directory (its ``config.yaml`` and backbone), a checkpoint directory in one,
or an exported backbone file together with ``recipe``. The evaluation is the run's own
(:class:`~.protocol.RunEvaluator` on the datasets :func:`~sslkit.datasets.build_splits` builds
from the config): held-out classes for retrieval, and the run's labelled subset
(``label_subset.json`` beside its ``config.yaml``) unless ``eval.label_fraction`` /
``eval.labels_per_class`` ask for another.

It comes in two steps, so that a mistake fails in a second, before any process connects to
another: :func:`plan_evaluation` resolves and checks the target, the config and where the
results go; :func:`run_evaluation` evaluates on an ``accelerate`` ``Accelerator`` (several
processes share the work) and writes the results. :func:`evaluate_encoder` does both.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sslkit import models
from sslkit.augment import EvalTransform
from sslkit.config import Config, load_config
from sslkit.datasets import build_splits
from sslkit.errors import UserError
from sslkit.evaluation.encoder import load_backbone, saved_config_for
from sslkit.evaluation.protocol import RunEvaluator
from sslkit.models.weights import PROGRESS_FILE


@dataclass(frozen=True)
class EvaluationPlan:
    """What is evaluated, with which config, and where its results go; checked."""

    target: Path
    cfg: Config
    out: Path
    replaces: bool = False  # ``out`` holds an earlier evaluation's results, which this one replaces


@dataclass
class Evaluation:
    """What an evaluation measured and wrote.

    Attributes:
        plan: what was evaluated.
        results: metrics by encoder: ``"encoder"``, and ``"raw pixels"`` with ``eval.compare_raw_pixels``.
        report: what ``plan.out`` holds (written by the main process only).
        main_process: whether this process is the one that wrote ``plan.out`` and should report.
        notes: what was measured on what (k, the labelled images), and anything a reader should know.
    """

    plan: EvaluationPlan
    results: dict[str, dict[str, float]]
    report: dict
    main_process: bool
    notes: list[str] = dataclasses.field(default_factory=list)


def default_out(target: Path) -> Path:
    """Where the results go without ``out``: next to what is evaluated, never next to ``recipe``.

    A run directory (or any directory that is not a checkpoint) holds them as ``eval.json``. A
    checkpoint gets ``checkpoints/step-N.eval.json`` beside it rather than a file inside it: the
    run's checkpoint rotation (``train.keep_checkpoints``) deletes old checkpoint directories,
    and the step in the name keeps the results of several checkpoints apart. A backbone file
    ``X.safetensors`` / ``X.pt`` gets ``X.eval.json`` beside it.
    """
    if target.is_dir():
        if (target / PROGRESS_FILE).is_file():
            return target.parent / f"{target.name}.eval.json"
        return target / "eval.json"
    return target.parent / f"{target.stem}.eval.json"


def plan_evaluation(
    target: str | Path, recipe: str | Path | None = None, overrides: Sequence[str] = (), out: str | Path | None = None
) -> EvaluationPlan:
    """Resolve and check what :func:`run_evaluation` will do, in a second and before any process group.

    Args:
        target: a run directory, a checkpoint directory in one, or a backbone ``.safetensors`` / ``.pt`` file.
        recipe: the recipe to read data and model settings from (default: the run's ``config.yaml``).
        overrides: dotted ``key=value`` overrides of that config, e.g. ``["eval.knn_k=20"]``.
        out: where the JSON results go (default: :func:`default_out`).

    Raises:
        UserError: the target does not exist, has no config, the config is invalid, or ``out``'s
            folder is missing or not writable.
    """
    target = Path(target)
    if target.name in ("", ".", ".."):  # "." has no parents to climb and no name to put beside
        target = target.resolve()
    if not target.exists():
        raise UserError(f"'{target}' not found; give a run directory (runs/<name>), a checkpoint, or a backbone file")
    recipe = Path(recipe) if recipe else saved_config_for(target)
    if recipe is None:
        raise UserError(f"no config.yaml next to '{target}'; pass --recipe with the recipe it was trained with")
    cfg = load_config(recipe, list(overrides))
    out = Path(out) if out else default_out(target)
    if not out.parent.is_dir():  # found now, not after minutes of evaluation
        raise UserError(
            f"--out '{out}': the folder '{out.parent}' does not exist; create it or give a path in an existing folder"
        )
    if not os.access(out.parent, os.W_OK):
        raise UserError(
            f"cannot write the results to '{out}': '{out.parent}' is not writable; pass --out with a writable path"
        )
    return EvaluationPlan(target, cfg, out, replaces=out.exists())


def run_evaluation(plan: EvaluationPlan, linear: bool = True, accelerator=None) -> Evaluation:
    """Evaluate the target's encoder and write its results to ``plan.out`` (from the main process).

    Args:
        linear: False skips the linear probe (kNN, and retrieval with held-out classes, only).
        accelerator: places the encoder and shares the data among processes; by default a new one
            (mixed precision off), which the evaluation ends before it returns. One given is the caller's
            to end (``wait_for_everyone()``, ``end_training()``).

    Raises:
        UserError: the backbone's weights do not fit the config's model, or the data cannot be evaluated on.
    """
    from accelerate import Accelerator

    own = accelerator is None
    accelerator = accelerator or Accelerator(mixed_precision="no")
    cfg = plan.cfg
    run_dir = saved.parent if (saved := saved_config_for(plan.target)) is not None else None
    splits = build_splits(cfg, train_split="train", run_dir=run_dir, for_evaluation=True)
    info = splits.info
    preprocess = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    preprocess = preprocess.to(accelerator.device)
    backbone = models.backbone_from_config(cfg.model, preprocess.out_channels)
    load_backbone(backbone, plan.target, cfg)
    # channels_last whatever the run trained in: 1.5x faster feature extraction on a CPU, features equal to 1e-6
    # (tools/bench/memory_format.py).
    backbone = models.to_channels_last(backbone.to(accelerator.device))
    evaluator = RunEvaluator(cfg, splits, preprocess, accelerator)
    results = {"encoder": evaluator.evaluate(backbone, linear=linear)}
    if cfg.eval.compare_raw_pixels and (raw := evaluator.raw_pixels(linear=linear)):
        results["raw pixels"] = raw  # the floor to beat, with the same kNN (and probe)
    report = {"target": str(plan.target), "results": results["encoder"]}
    if splits.subset is not None:  # the labelled images the kNN memory and the probe held
        spec, indices = dataclasses.asdict(splits.subset_spec), splits.subset.tolist()
        report["label_subset"] = {**spec, "images": len(indices), "indices": indices}
    if "raw pixels" in results:
        report["raw_pixels"] = results["raw pixels"]
    report["knn"] = {"k": cfg.eval.knn_k, "temperature": cfg.eval.knn_temperature, "memory": len(splits.memory)}
    main_process = accelerator.is_main_process
    if main_process:
        plan.out.write_text(json.dumps(report, indent=2))
    if own:
        # Leave together and close the process group (as the trainer does): a process that exits
        # while another still tears down its gloo connections can abort.
        accelerator.wait_for_everyone()
        accelerator.end_training()
    return Evaluation(plan, results, report, main_process, evaluation_notes(plan, splits))


def evaluation_notes(plan: EvaluationPlan, splits) -> list[str]:
    """What the figures were measured on, and what a reader might not expect."""
    e, memory = plan.cfg.eval, len(splits.memory)
    labelled = (
        f"{memory} labelled images ({splits.subset_spec.describe()})"
        if splits.subset is not None
        else f"all {memory} labelled training images"
    )
    notes = [f"kNN: k={e.knn_k}, T={e.knn_temperature:g}; kNN memory and linear probe: {labelled}"]
    if e.knn_k > memory:
        notes.append(
            f"eval.knn_k={e.knn_k} is more than the {memory} labelled images: every one of them votes "
            f"(k={memory}); a smaller eval.knn_k weighs the nearest ones alone"
        )
    if plan.replaces:
        notes.append(f"replaced the earlier results in {plan.out} (--out keeps several)")
    return notes


def evaluate_encoder(
    target: str | Path,
    recipe: str | Path | None = None,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    linear: bool = True,
) -> Evaluation:
    """:func:`plan_evaluation`, then :func:`run_evaluation` on an accelerator of its own."""
    return run_evaluation(plan_evaluation(target, recipe, overrides, out), linear)
