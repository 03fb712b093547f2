"""``sslkit-label-efficiency``: what pretraining, and the choice of the images to label, buy with few labels.

    sslkit-label-efficiency RECIPE (--fractions 0.01,0.1,1 | --labels 100,600) --seeds 3 [--out DIR]
        [--select balanced,random,kmeans,typiclust,probcover,kcenter] [--fixmatch] [--pretrained RUN_DIR]
        [--finetune-recipe R] [--distill-recipe R] [--no-distill] [--fixmatch-recipe R]
        [--scratch-recipe R] [--scratch-factor 3] [--epochs B=E,...] [--launcher "..."] [--jobs N]
        [--pretrain-override K=V ...] [--finetune-override K=V ...] [--fixmatch-override K=V ...]
        [key.sub=value ...]
    sslkit-label-efficiency quickstart --fractions 0.05,0.1,1 --seeds 3 train.threads=2
    sslkit-label-efficiency quickstart --fractions 0.05,0.1,1 --seeds 3 --jobs 2 train.threads=1
    sslkit-label-efficiency quickstart --labels 50,100 --select random,typiclust,balanced --fixmatch --seeds 3

The roads, the selections, the runs and the files the comparison writes are
:mod:`sslkit.experiments.label_efficiency`'s; this command parses its options into
:func:`~sslkit.experiments.label_efficiency.plan_label_efficiency`, runs the plan on the executor ``--executor``
and ``--jobs`` ask for (:mod:`sslkit.experiments.local`) and prints its tables.
Exit status: 0 when every run succeeded, 1 when any failed, 2 for a mistake in the command line or a
run's config (one line, before anything runs), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sslkit.cli.early_checks import at_least, recipe_with_overrides, refused
from sslkit.cli.options import add_executor_options, executor_of, run_and_report
from sslkit.console import error_console, print_user_error
from sslkit.errors import UserError

# The experiment (sslkit.config, torch) is imported once the arguments are parsed: --help answers at once.
if TYPE_CHECKING:
    from sslkit.experiments import label_efficiency


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-label-efficiency",
        description="Compare, at several label budgets, a pretrained encoder frozen, fine-tuned and distilled "
        "(and FixMatch) against the same network trained from scratch on the same labels, with the labelled "
        "images drawn class-balanced or chosen from the encoder's embeddings.",
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
        "--fractions", metavar="F1,F2,...", help="label budgets as fractions in (0, 1] of the labels, e.g. 0.01,0.1,1"
    )
    parser.add_argument(
        "--labels",
        metavar="N1,N2,...",
        help="label budgets as numbers of labelled images instead, e.g. 100,600 (with balanced: multiples of the "
        "number of classes)",
    )
    parser.add_argument(
        "--select",
        default="balanced",
        metavar="S1,S2,...",
        help="which images get the labels, each crossed with every road: balanced (the same number of every class "
        "at random; it reads the labels), or sslkit-select's random, kmeans, typiclust, probcover, kcenter, from "
        "the pretrained encoder's embeddings (default: balanced)",
    )
    parser.add_argument(
        "--fixmatch",
        action="store_true",
        help="add FixMatch on the same labels, from the pretrained encoder and from scratch, and a student distilled "
        "from the first (without --no-distill; not with every label)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="seeds per budget and selection (labelled images and run seed): s, s+1, ... from the recipe's "
        "run.seed (default 1)",
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
        "--fixmatch-recipe",
        default=None,
        help="the FixMatch recipe (default: fashion_mnist_fixmatch or quickstart_fixmatch)",
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
        metavar="B=E,...",
        help="fine-tune (and scratch) epochs at a budget instead of the recipe's, e.g. 1=3 (scratch-long: "
        "--scratch-factor times these)",
    )
    parser.add_argument(
        "--launcher",
        default=None,
        help='a prefix for multi-process runs, e.g. "accelerate launch --cpu --num_processes 2"',
    )
    add_executor_options(parser, "runs (those a run needs first, first: the pretraining, the embeddings)")
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
        help="an override for the fine-tune, distill, FixMatch and scratch runs only (repeatable), e.g. "
        "train.epochs=5",
    )
    parser.add_argument(
        "--fixmatch-override",
        dest="fixmatch_overrides",
        action="append",
        default=[],
        metavar="KEY=V",
        help="an override for the two FixMatch runs only (repeatable, after --finetune-override), e.g. "
        "train.epochs=20",
    )
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def plan_from(args: argparse.Namespace) -> label_efficiency.Plan:
    """The parsed command line as the library's plan."""
    from sslkit.experiments import label_efficiency

    return label_efficiency.plan_label_efficiency(
        args.recipe,
        args.fractions,
        args.seeds,
        labels=args.labels,
        select=args.select,
        fixmatch=args.fixmatch,
        out=args.out,
        pretrained=args.pretrained,
        finetune_recipe=args.finetune_recipe,
        distill_recipe=args.distill_recipe,
        fixmatch_recipe=args.fixmatch_recipe,
        scratch_recipe=args.scratch_recipe,
        distill=not args.no_distill,
        scratch_factor=args.scratch_factor,
        epochs=args.epochs,
        launcher=args.launcher,
        overrides=args.overrides,
        pretrain_overrides=args.pretrain_overrides,
        finetune_overrides=args.finetune_overrides,
        fixmatch_overrides=args.fixmatch_overrides,
    )


def check_early(args: argparse.Namespace) -> None:
    """The seeds, the jobs, and the pretraining recipe's name and keys with its overrides, before torch is imported
    (the budgets, the selections and the other recipes are read by
    :func:`~sslkit.experiments.label_efficiency.plan_label_efficiency`)."""
    at_least(args.seeds, 1, "--seeds")
    at_least(args.jobs, 1, "--jobs")
    recipe_with_overrides(args.recipe, [*args.overrides, *args.pretrain_overrides])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.experiments import label_efficiency

    try:
        plan, executor = plan_from(args), executor_of(args)
    except UserError as error:
        print_user_error(error)
        return 2
    if (note := label_efficiency.labels_note(plan)) is not None:
        error_console.print(note, markup=False, highlight=False, soft_wrap=True)
    return run_and_report(lambda: label_efficiency.run_label_efficiency(plan, executor))


if __name__ == "__main__":
    sys.exit(main())
