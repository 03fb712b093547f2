"""``sslkit-ablate``: a grid of pretraining runs (sweeps x variants x seeds), tabulated and plotted.

    sslkit-ablate RECIPE [--sweep KEY=V1,V2,...] [--variants FILE] [--seeds N] [--out DIR] [--jobs N]
                  [--metrics M1,M2] [--launcher "accelerate launch --cpu --num_processes 2"] [key.sub=value ...]
    sslkit-ablate recipes/quickstart.yaml --sweep loss.temperature=0.05,0.1,0.2,0.5 --seeds 2 train.epochs=10
    sslkit-ablate quickstart --sweep loss.temperature=0.1,0.2,0.5 --seeds 2 --jobs 2    # two points at once

The grid, its points and the files the sweep writes are :mod:`sslkit.experiments.ablate`'s; this
command parses its options into :func:`~sslkit.experiments.ablate.plan_ablation`, runs the plan on the
executor ``--executor`` and ``--jobs`` ask for (:mod:`sslkit.experiments.local`) and prints its table. Exit
status: 0 when every point succeeded, 1 when any failed, 2 for a mistake in the command line or a point's
config (one line, before anything runs), 130 on Ctrl-C (every running point stops; the same command
continues).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sslkit.cli.early_checks import at_least, recipe_with_overrides, refused
from sslkit.cli.options import add_executor_options, executor_of, run_and_report
from sslkit.schema.reading import find_variants

# The experiment (sslkit.config, torch) is imported once the arguments are parsed: --help answers at once.
if TYPE_CHECKING:
    from sslkit.experiments import ablate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-ablate", description="Run a grid of pretraining runs and tabulate and plot the results."
    )
    parser.add_argument(
        "recipe",
        type=Path,
        help="a YAML recipe's path or a bundled recipe's name, e.g. recipes/quickstart.yaml or quickstart",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],
        help="dotted key=value overrides shared by every point, e.g. train.epochs=10",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a key and its values; repeat for a product grid",
    )
    parser.add_argument(
        "--variants",
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML file of named variants, each a mapping of dotted keys to values; crossed with the sweeps",
    )
    parser.add_argument(
        "--metrics",
        default=None,
        metavar="M1,M2",
        help="the metrics of the terminal table and the plots, e.g. unseen_map@r,unseen_recall@1 "
        "(default: knn_top1,linear_top1; the csv files hold them all)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="seeds per grid point: run.seed = s, s+1, ... from the recipe's seed (default 1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: <run.output_dir>/ablate-<recipe>-<swept keys>)",
    )
    parser.add_argument(
        "--launcher",
        default=None,
        help='a prefix for multi-process points, e.g. "accelerate launch --cpu --num_processes 2"',
    )
    add_executor_options(parser, "points")
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def plan_from(args: argparse.Namespace) -> ablate.Plan:
    """The parsed command line as the library's plan."""
    from sslkit.experiments import ablate

    return ablate.plan_ablation(
        args.recipe,
        args.sweep,
        variants=args.variants,
        seeds=args.seeds,
        out=args.out,
        overrides=args.overrides,
        metrics=args.metrics,
        launcher=args.launcher,
    )


def check_early(args: argparse.Namespace) -> None:
    """The seeds, the jobs, the variants file, and the recipe's name and keys with the shared overrides, before
    torch is imported (the sweeps are read by :func:`~sslkit.experiments.ablate.plan_ablation`)."""
    at_least(args.seeds, 1, "--seeds")
    at_least(args.jobs, 1, "--jobs")
    if args.variants:
        find_variants(args.variants)
    recipe_with_overrides(args.recipe, args.overrides)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.experiments import ablate

    return run_and_report(lambda: ablate.run_ablation(plan_from(args), executor_of(args)))


if __name__ == "__main__":
    sys.exit(main())
