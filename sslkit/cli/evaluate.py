"""Evaluate a trained encoder: weighted kNN, linear probe (and retrieval on held-out classes).

    sslkit-evaluate runs/quickstart [key.sub=value ...] [--out results.json]
    accelerate launch --num_processes 2 -m sslkit.cli.evaluate runs/quickstart/checkpoints/step-00000420

RUN_OR_CHECKPOINT is a run directory (its config.yaml and backbone are used), a checkpoint
directory inside one, or an exported backbone file together with ``--recipe``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-evaluate",
        description="kNN and linear-probe accuracy of a trained encoder.",
    )
    parser.add_argument("target", help="a run directory, a checkpoint directory, or a backbone .safetensors/.pt file")
    parser.add_argument(
        "overrides", nargs="*", default=[], help="dotted key=value overrides of the run's config, e.g. eval.knn_k=20"
    )
    parser.add_argument(
        "--recipe", help="the recipe to read data/model settings from (default: the run's config.yaml)"
    )
    parser.add_argument(
        "--out",
        help="where to write the JSON results (default: next to what is evaluated: <run>/eval.json "
        "for a run directory, <checkpoint>.eval.json beside a checkpoint directory, e.g. "
        "runs/x/checkpoints/step-00000420.eval.json, and <name>.eval.json beside a backbone file, "
        "e.g. /tmp/bb.eval.json for /tmp/bb.safetensors)",
    )
    parser.add_argument("--no-linear", action="store_true", help="skip the linear probe")
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def default_out(target: Path) -> Path:
    """Where the results go without ``--out``: next to what is evaluated, never next to ``--recipe``.

    A run directory (or any directory that is not a checkpoint) holds them as ``eval.json``. A
    checkpoint gets ``checkpoints/step-N.eval.json`` beside it rather than a file inside it: the
    run's checkpoint rotation (``train.keep_checkpoints``) deletes old checkpoint directories,
    and the step in the name keeps the results of several checkpoints apart. A backbone file
    ``X.safetensors`` / ``X.pt`` gets ``X.eval.json`` beside it.
    """
    from sslkit.models.weights import PROGRESS_FILE

    if target.is_dir():
        if (target / PROGRESS_FILE).is_file():
            return target.parent / f"{target.name}.eval.json"
        return target / "eval.json"
    return target.parent / f"{target.stem}.eval.json"


def main(argv: list[str] | None = None) -> int:
    from sslkit.config import check_command_line
    from sslkit.console import print_user_error
    from sslkit.errors import UserError

    try:
        check_command_line(sys.argv[1:] if argv is None else argv, ("--recipe", "--out", "--no-linear"))
    except UserError as error:
        print_user_error(error)
        return 2
    args = parse_args(argv)
    from sslkit.loop.launch import cpu_threads, relaunch_cpu_processes

    if argv is None and (code := relaunch_cpu_processes()) is not None:
        return code
    from accelerate import Accelerator

    from sslkit import models
    from sslkit.augment import EvalTransform
    from sslkit.config import load_config
    from sslkit.console import console, results_table
    from sslkit.datasets import build_splits
    from sslkit.evaluation import RunEvaluator
    from sslkit.evaluation.encoder import load_backbone, saved_config_for

    try:
        target = Path(args.target)
        if target.name in ("", ".", ".."):  # "." has no parents to climb and no name to put beside
            target = target.resolve()
        if not target.exists():
            raise UserError(
                f"'{target}' not found; give a run directory (runs/<name>), a checkpoint, or a backbone file"
            )
        recipe = Path(args.recipe) if args.recipe else saved_config_for(target)
        if recipe is None:
            raise UserError(f"no config.yaml next to '{target}'; pass --recipe with the recipe it was trained with")
        cfg = load_config(recipe, args.overrides)
        out = Path(args.out) if args.out else default_out(target)
        if not out.parent.is_dir():  # found now, not after minutes of evaluation
            raise UserError(
                f"--out '{out}': the folder '{out.parent}' does not exist; "
                f"create it or give a path in an existing folder"
            )
        if not os.access(out.parent, os.W_OK):
            raise UserError(
                f"cannot write the results to '{out}': '{out.parent}' is not writable; pass --out with a writable path"
            )
        accelerator = Accelerator(mixed_precision="no")
        if accelerator.device.type == "cpu":
            cpu_threads(None)  # accelerate launch may have pinned one thread (sslkit/loop/launch.py)
        # As in training: held-out classes for retrieval, and the run's own labelled subset (label_subset.json
        # beside its config.yaml) unless eval.label_fraction / eval.labels_per_class ask for another.
        run_dir = saved.parent if (saved := saved_config_for(target)) is not None else None
        splits = build_splits(cfg, train_split="train", run_dir=run_dir, for_evaluation=True)
        info = splits.info
        preprocess = EvalTransform(
            cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize
        ).to(accelerator.device)
        backbone = models.backbone_from_config(cfg.model, preprocess.out_channels)
        load_backbone(backbone, target, cfg)
        backbone = backbone.to(accelerator.device)
        evaluator = RunEvaluator(cfg, splits, preprocess, accelerator)
        results = {"encoder": evaluator.evaluate(backbone, linear=not args.no_linear)}
        if cfg.eval.compare_raw_pixels and (raw := evaluator.raw_pixels(linear=not args.no_linear)):
            results["raw pixels"] = raw  # the floor to beat, with the same kNN (and probe)
    except UserError as error:
        print_user_error(error)
        return 2
    if accelerator.is_main_process:
        console.print(results_table(results, f"{target}: {cfg.data.name}"))
        report = {"target": str(target), "results": results["encoder"]}
        if splits.subset is not None:  # the labelled images the kNN memory and the probe held
            spec, indices = dataclasses.asdict(splits.subset_spec), splits.subset.tolist()
            report["label_subset"] = {**spec, "images": len(indices), "indices": indices}
        if "raw pixels" in results:
            report["raw_pixels"] = results["raw pixels"]
        out.write_text(json.dumps(report, indent=2))
        console.print(f"results written to {out}")
    # Leave together and close the process group (as the trainer does): a process that exits
    # while another still tears down its gloo connections can abort.
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
