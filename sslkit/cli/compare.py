"""``sslkit-compare``: pretraining recipes at equal training time, tabulated.

    sslkit-compare RECIPE [RECIPE ...] --minutes M [--seeds N] [--seeds-for NAME=N ...] [--out DIR]
                   [--fraction 0.01] [--finetune-recipe R] [--scratch-recipe R] [--no-finetune]
                   [--calibration-steps 30] [--jobs N]
                   [--launcher "..."] [--finetune-override K=V ...] [key.sub=value ...]
    sslkit-compare fashion_mnist_simclr fashion_mnist_byol fashion_mnist_dino --minutes 10 \\
        --seeds-for fashion_mnist_simclr=2 train.threads=1

The calibration, the budget, the runs and the files the comparison writes are
:mod:`sslkit.experiments.compare`'s; this command parses its options into
:func:`~sslkit.experiments.compare.plan_comparison`, runs the plan on the executor ``--executor`` and ``--jobs``
ask for (:mod:`sslkit.experiments.local`) and prints its table. With ``--jobs N`` the calibrations still run one
at a time, each on the share of the machine a run gets (the CPU threads divided by N, or one GPU): ``--minutes``
is the time a run trains alone on its share, and N runs then train their steps side by side. Exit status:
0 when every run succeeded, 1 when any failed, 2 for a mistake in the command line or a run's config
(one line), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sslkit.cli.early_checks import at_least, recipe_with_overrides, refused
from sslkit.cli.options import add_executor_options, executor_of, run_and_report
from sslkit.errors import UserError
from sslkit.schema import find_recipe

# The experiment (sslkit.config, torch) is imported once the arguments are parsed: --help answers at once.
if TYPE_CHECKING:
    from sslkit.experiments import compare


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sslkit.experiments.calibration import WARMUP_STEPS

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
    add_executor_options(
        parser,
        "runs (the calibrations one at a time, each on a run's share: --minutes is the time a run trains alone on "
        "its share)",
    )
    return parser.parse_intermixed_args(argv)


def recipes_and_overrides(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The positional items: recipes, and overrides (with a ``=``)."""
    return [item for item in args.items if "=" not in item], [item for item in args.items if "=" in item]


def plan_from(args: argparse.Namespace) -> compare.Plan:
    """The parsed command line as the library's plan: the positional items are recipes, or overrides with a ``=``."""
    from sslkit.experiments import compare

    recipes, overrides = recipes_and_overrides(args)
    return compare.plan_comparison(
        recipes,
        args.minutes,
        overrides=overrides,
        seeds=args.seeds,
        seeds_for=args.seeds_for,
        out=args.out,
        fraction=args.fraction,
        finetune_recipe=args.finetune_recipe,
        scratch_recipe=args.scratch_recipe,
        finetune=not args.no_finetune,
        calibration_steps=args.calibration_steps,
        launcher=args.launcher,
        finetune_overrides=args.finetune_overrides,
    )


def check_early(args: argparse.Namespace) -> None:
    """The jobs, and every recipe's name, then its keys with the overrides (named by its file, as
    :func:`~sslkit.experiments.compare.plan_comparison` names them), before torch is imported."""
    at_least(args.jobs, 1, "--jobs")
    recipes, overrides = recipes_and_overrides(args)
    for path in [find_recipe(recipe).resolve() for recipe in recipes]:
        try:
            recipe_with_overrides(path, overrides)
        except UserError as error:
            raise UserError(f"{path.name}: {error}") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.experiments import compare

    return run_and_report(lambda: compare.run_comparison(plan_from(args), executor_of(args)))


if __name__ == "__main__":
    sys.exit(main())
