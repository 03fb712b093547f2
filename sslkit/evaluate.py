"""Evaluate a trained encoder: weighted kNN, linear probe (and retrieval on held-out classes).

    python sslkit/evaluate.py runs/quickstart [key.sub=value ...] [--out results.json]
    accelerate launch --num_processes 2 sslkit/evaluate.py runs/quickstart/checkpoints/step-00000420

RUN_OR_CHECKPOINT is a run directory (its config.yaml and backbone are used), a checkpoint
directory inside one, or an exported backbone file together with ``--recipe``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # see sslkit/pretrain.py

import argparse  # noqa: E402
import json  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sslkit/evaluate.py", description="kNN and linear-probe accuracy of a trained encoder.")
    parser.add_argument("target", help="a run directory, a checkpoint directory, or a backbone .safetensors/.pt file")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides of the run's config, e.g. eval.knn_k=20")
    parser.add_argument("--recipe", help="the recipe to read data/model settings from (default: the run's config.yaml)")
    parser.add_argument("--out", help="where to write the JSON results (default: <run>/eval.json)")
    parser.add_argument("--no-linear", action="store_true", help="skip the linear probe")
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def find_recipe(target: Path) -> Path | None:
    """The run's config.yaml for a run directory, a checkpoint in one, or a file in one."""
    for folder in (target, target.parent, target.parent.parent):
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sslkit.launch import cpu_threads, relaunch_cpu_processes

    if argv is None and (code := relaunch_cpu_processes()) is not None:
        return code
    from accelerate import Accelerator

    from sslkit import checkpoint, data, models
    from sslkit.augment import EvalTransform
    from sslkit.config import load_config
    from sslkit.console import console, print_user_error, results_table
    from sslkit.errors import UserError
    from sslkit.train import eval_loaders, evaluate_backbone, evaluate_raw_pixels, evaluate_unseen

    try:
        target = Path(args.target)
        if not target.exists():
            raise UserError(f"'{target}' not found; give a run directory (runs/<name>), a checkpoint, or a backbone file")
        recipe = Path(args.recipe) if args.recipe else find_recipe(target)
        if recipe is None:
            raise UserError(f"no config.yaml next to '{target}'; pass --recipe with the recipe it was trained with")
        cfg = load_config(recipe, args.overrides)
        accelerator = Accelerator(mixed_precision="no")
        if accelerator.device.type == "cpu":
            cpu_threads(None)  # accelerate launch may have pinned one thread (sslkit/launch.py)
        d = cfg.data
        train_set = data.build_dataset(d.name, "train", d.root, d.download, d.image_size)
        test_set = data.build_dataset(d.name, "test", d.root, d.download, d.image_size)
        info = train_set.info
        unseen_set = None
        if d.holdout_classes:  # as in training: kNN / linear on seen classes, retrieval on the unseen ones
            unseen_set = test_set.select_classes(d.holdout_classes, keep=True)
            train_set = train_set.select_classes(d.holdout_classes, keep=False)
            test_set = test_set.select_classes(d.holdout_classes, keep=False)
        preprocess = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize).to(accelerator.device)
        backbone = models.build_backbone(cfg.model.backbone, cfg.model.width, cfg.model.cifar_stem, preprocess.out_channels)
        state = checkpoint.load_backbone_state(target)
        try:
            backbone.load_state_dict(state)
        except RuntimeError as error:
            first = str(error).strip().splitlines()[0]
            raise UserError(f"the weights in '{target}' do not fit model.backbone={cfg.model.backbone} width={cfg.model.width} "
                            f"cifar_stem={cfg.model.cifar_stem}: {first}") from None
        backbone = backbone.to(accelerator.device)
        train_loader, test_loader = accelerator.prepare(*eval_loaders(cfg, train_set, test_set, cfg.eval.batch_size))
        results = {"encoder": evaluate_backbone(backbone, cfg, preprocess, train_loader, test_loader, info.num_classes,
                                                accelerator, linear=not args.no_linear)}
        if unseen_set is not None:
            unseen_loader = accelerator.prepare(eval_loaders(cfg, unseen_set, unseen_set, cfg.eval.batch_size)[0])
            results["encoder"].update(evaluate_unseen(backbone, preprocess, unseen_loader, accelerator))
        if cfg.eval.compare_raw_pixels:  # the floor to beat, with the same kNN (and probe)
            if raw := evaluate_raw_pixels(cfg, train_set, test_set, info.num_classes, linear=not args.no_linear):
                results["raw pixels"] = raw
    except UserError as error:
        print_user_error(error)
        return 2
    if accelerator.is_main_process:
        console.print(results_table(results, f"{target}: {d.name}"))
        out = Path(args.out) if args.out else (recipe.parent / "eval.json")
        report = {"target": str(target), "results": results["encoder"]}
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
