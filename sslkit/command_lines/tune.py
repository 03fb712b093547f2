"""``sslkit-tune``'s command line: its parser and the argv builder of its workers.

``sslkit-tune`` starts its workers as itself: the same recipe, overrides and search, with the output folder and
the study named in full and ``--worker I`` (a worker runs trials of the study one after another, and is started
by the executor, on this machine or a cluster's). The command adds ``--executor`` and ``--jobs`` to
:func:`parser` (:func:`sslkit.cli.tune.parse_args`); a worker needs neither.

>>> argv = build_argv("quickstart", ["x.y=5"], search=["optim.lr=log:1e-4,1e-2"], out="o", study="s", worker=1)
>>> args = parser().parse_intermixed_args(argv)
>>> args.recipe, args.overrides, args.search, args.worker, args.metric
('quickstart', ['x.y=5'], ['optim.lr=log:1e-4,1e-2'], 1, 'knn_top1')
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

MODULE = "sslkit.cli.tune"  # the command these arguments are for: python -m MODULE ARGV

SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "hyperband", "none")
DIRECTIONS = ("maximize", "minimize")


def parser() -> argparse.ArgumentParser:
    """sslkit-tune's options, but for where its workers run (``--executor``, ``--jobs``: the command adds them)."""
    from sslkit.schema import bundled_recipes

    parser = argparse.ArgumentParser(
        prog="sslkit-tune",
        description="Tune a recipe's settings with Optuna: trials of pretraining runs, pruned on their online kNN.",
    )
    parser.add_argument(
        "recipe", help="a YAML recipe's path, or the name of a bundled one: " + ", ".join(bundled_recipes())
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],
        help="dotted key=value overrides shared by every trial, e.g. train.epochs=10",
    )
    parser.add_argument(
        "--search",
        action="append",
        default=[],
        metavar="KEY=SPACE",
        help="a recipe key and its values: log:LOW,HIGH (log-uniform), uniform:LOW,HIGH, int:LOW,HIGH[,STEP] or "
        "choice:A,B,...; repeat for every key searched",
    )
    parser.add_argument(
        "--metric",
        default="knn_top1",
        help="what the trials maximize, from each run's results.json: knn_top1 (default), linear_top1, "
        "finetune_top1 (a fine-tune recipe), unseen_map@r (retrieval), ...",
    )
    parser.add_argument("--direction", choices=DIRECTIONS, default="maximize", help="of --metric (default maximize)")
    parser.add_argument(
        "--trials", type=int, default=20, help="trials in the study, all workers together (default 20)"
    )
    parser.add_argument(
        "--sampler", choices=SAMPLERS, default="tpe", help="how a trial's values are drawn (default tpe: Optuna's TPE)"
    )
    parser.add_argument(
        "--pruner",
        choices=PRUNERS,
        default="median",
        help="stops a trial whose online kNN (train.knn_every_epochs) falls behind the finished trials' at the same "
        "fraction of their schedules: median (default), hyperband, none",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    parser.add_argument(
        "--validation",
        type=float,
        default=None,
        metavar="F",
        help="measure the trials on this fraction of every class of the training images, held out of training "
        "(data.val_fraction), not on the test split; best.yaml trains on them all and measures on the test split",
    )
    parser.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="an Optuna RDB URL that workers on several machines share, e.g. postgresql://user@host/db "
        "(default: a journal file in --out, which the processes of one machine, or of a shared folder, share)",
    )
    parser.add_argument("--study", default=None, help="the study's name in the storage (default: --out's name)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: <run.output_dir>/tune-<recipe>-<searched keys>)",
    )
    # A worker of the study, as the command starts its own: not for typing.
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def build_argv(
    recipe: str | Path,
    overrides: Sequence[str] = (),
    *,
    search: Sequence[str],
    out: str | Path,
    study: str,
    worker: int,
    metric: str = "knn_top1",
    direction: str = "maximize",
    trials: int = 20,
    sampler: str = "tpe",
    pruner: str = "median",
    seed: int = 0,
    validation: float | None = None,
    storage: str | None = None,
) -> list[str]:
    """The arguments of worker ``worker`` of the study ``study`` in ``out`` (every keyword is the option of its
    name); values are joined to their option (``--out=-x``), so that none is read as an option."""
    options = {
        "metric": metric,
        "direction": direction,
        "trials": trials,
        "sampler": sampler,
        "pruner": pruner,
        "seed": seed,
        "validation": validation,
        "out": out,
        "study": study,
        "storage": storage,
        "worker": worker,
    }
    return [
        str(recipe),
        *overrides,
        *(f"--search={text}" for text in search),
        *(f"--{name}={value}" for name, value in options.items() if value is not None),
    ]
