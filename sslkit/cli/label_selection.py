"""Choose which images to label, from their embeddings, and write the label file a recipe trains on.

    sslkit-embed runs/fm-simclr                                  # embeddings of the run's training split
    sslkit-select runs/fm-simclr/embeddings-fashion_mnist-train --budget 100 --strategy typiclust \\
        --out labels.json
    sslkit-pretrain fashion_mnist_finetune run.init_from=runs/fm-simclr data.label_fraction=null \\
        data.label_subset=labels.json

Strategies: ``random``, ``kmeans`` (the image nearest each of N k-means centres), ``typiclust``,
``probcover`` and ``kcenter`` (greedy k-center, Coreset); see :mod:`sslkit.selection`. With
``--labelled FILE`` (an earlier label file, or a text file of items) the N images are added to
those: an active-learning round. A bad request (a budget of 0 or more than the unlabelled images,
an unknown strategy, labelled items the embeddings do not hold) is one line, and writes nothing.

Its module is ``selection``, not ``select``: ``python sslkit/cli/pretrain.py`` (how a launcher may start
training) puts this folder first on the path, where a ``select.py`` would hide the standard library's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sslkit.cli.early_checks import embeddings_folder, refused
from sslkit.command_lines.label_selection import parse_args  # beside the argv builder the experiments start it with
from sslkit.console import console, print_user_error
from sslkit.errors import UserError


def check_early(args: argparse.Namespace) -> None:
    """The folder, the labelled file and the strategy, before numpy is imported, in the lines of
    :func:`sslkit.selection.label_file.select_to_file` (the budget needs the embeddings' count)."""
    from sslkit.selection.choices import STRATEGIES

    embeddings_folder(args.embeddings)
    if args.labelled is not None and not args.labelled.is_file():
        raise UserError(
            f"--labelled '{args.labelled}' does not exist; give a label file (sslkit-select's, or a run's "
            f"label_subset.json) or a text file of items, one per line"
        )
    if args.strategy not in STRATEGIES:
        raise UserError(f"unknown strategy '{args.strategy}'; choose one of {', '.join(STRATEGIES)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.selection.label_file import select_to_file

    try:
        with console.status(f"choosing {args.budget} images by {args.strategy}"):
            a = args
            written = select_to_file(a.embeddings, a.budget, a.strategy, a.labelled, a.seed, a.out, a.delta, a.classes)
    except UserError as error:
        print_user_error(error)
        return 2
    for line in summary(written.record, written.path):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def summary(record: dict, path: Path) -> list[str]:
    """What was chosen, what the strategy measured, and the recipe key that trains on it."""
    chosen, total = len(record["chosen"]), len(record.get("indices", record.get("items", [])))
    before = f", added to {record['labelled']['count']} labelled" if record["labelled"] else ""
    lines = [
        f"chose {chosen} of {record['embeddings']['count']} images by {record['strategy']}{before}: "
        f"{total} labels in {path}"
    ]
    if "labels" in record:
        lines.append(f"classes among them: {len(set(record['labels']))}")
    details = record["details"]
    if record["strategy"] == "probcover":
        how = (
            f"purity {details['purity']:.3f} over {details['classes']} k-means pseudo-classes"
            if details["purity"] is not None
            else "given"
        )
        lines.append(f"delta {details['delta']:g} ({how}); the labels cover {details['covered']:.1%} of the images")
        if details["random_picks"]:
            lines.append(
                f"warning: every image was covered after {chosen - details['random_picks']} picks; the other "
                f"{details['random_picks']} were drawn at random (a smaller --delta spreads the budget further)"
            )
    if "indices" in record:
        # data.label_fraction=null: the few-label recipes keep a fraction of their own, which the file replaces.
        lines.append(f"train on them: sslkit-pretrain RECIPE data.label_fraction=null data.label_subset={path}")
    else:
        lines.append(
            "the file names the images as items.csv does (paths), not by dataset index: data.label_subset reads "
            "label files chosen among every image of a dataset split (fashion_mnist, cifar10, ...)"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
