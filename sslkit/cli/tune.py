"""``sslkit-tune``: tune a recipe's settings with Optuna, trials of pretraining runs pruned on their online kNN.

    sslkit-tune RECIPE --search KEY=SPACE [--search ...] [--metric M] [--trials N] [--jobs N] [--sampler tpe|random]
                [--pruner median|hyperband|none] [--seed S] [--validation F] [--storage URL] [--study NAME]
                [--out DIR] [key=value ...]
    sslkit-tune quickstart --search optim.lr=log:1e-4,1e-2 --trials 8 --jobs 2
    sslkit-tune fashion_mnist_scratch --search optim.lr=log:1e-3,1 --search optim.weight_decay=log:1e-5,1e-2 \\
                --search train.epochs=int:10,60,10 --metric finetune_top1 --trials 24 --jobs 2 train.knn_every_epochs=2

The study, its workers and what it writes are :mod:`sslkit.experiments.tune`'s; this command parses its options
into :func:`~sslkit.experiments.tune.plan_tuning`, runs the plan's workers on the executor ``--executor`` and
``--jobs`` ask for (:mod:`sslkit.experiments.local`) and prints the table of the best trials. Exit status: 0 when
the study holds its trials, 1 when a worker failed or no trial completed, 2 for a mistake in the command line, a
space, the metric, the storage or a study made for another search (one line, before a trial runs; a metric
that only a finished run shows missing, after the first trials), 130 on Ctrl-C (the same command continues).

With ``--worker I`` (not for typing) it is worker I of the study, as the command starts its workers
(:mod:`sslkit.experiments.tune_worker`).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from sslkit.cli.early_checks import at_least, recipe_with_overrides, refused
from sslkit.cli.options import add_executor_options, executor_of, run_and_report
from sslkit.command_lines import tune as tune_lines
from sslkit.console import print_user_error
from sslkit.errors import UserError, install_hint
from sslkit.experiments.tune_space import check_in_schema, check_metric_name, parse_search


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tune_lines.parser()
    add_executor_options(parser, "trials")
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def check_early(args: argparse.Namespace) -> None:
    """Optuna, the counts, the metric's name, the recipe with the overrides, and every space against the recipe's
    schema, before torch is imported (the registries' names and ranges are the plan's)."""
    if importlib.util.find_spec("optuna") is None:
        raise UserError(f"sslkit-tune needs Optuna: {install_hint('tune')}")
    at_least(args.trials, 1, "--trials")
    at_least(args.jobs, 1, "--jobs")
    check_metric_name(args.metric)
    spaces = parse_search(args.search)
    recipe = recipe_with_overrides(args.recipe, args.overrides)
    check_in_schema(recipe, args.overrides, spaces)


def plan_from(args: argparse.Namespace):
    """The parsed command line as the library's plan."""
    from sslkit.experiments import tune

    return tune.plan_tuning(
        args.recipe,
        args.search,
        metric=args.metric,
        direction=args.direction,
        trials=args.trials,
        workers=args.jobs,
        sampler=args.sampler,
        pruner=args.pruner,
        seed=args.seed,
        validation=args.validation,
        out=args.out,
        storage=args.storage,
        study=args.study,
        overrides=args.overrides,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.experiments import tune, tune_worker

    if args.worker is None:
        return run_and_report(lambda: tune.run_tuning(plan_from(args), executor_of(args)))
    try:
        return tune_worker.run_worker(plan_from(args), args.worker)
    except UserError as error:
        print_user_error(error)
        return 2


if __name__ == "__main__":
    sys.exit(main())
