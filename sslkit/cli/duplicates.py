"""Near-duplicates in an embeddings folder (SemDeDup), or near-copies of its items in another folder.

    sslkit-duplicates embeddings/ --threshold 0.95                 # embeddings/duplicates.csv
    sslkit-duplicates embeddings/ --threshold 0.95 --keep nearest --clusters 50
    sslkit-duplicates embeddings/ --fraction 0.05                  # the threshold that removes 5%
    sslkit-duplicates test/ --threshold 0.95 --against train/      # test/near_copies.csv

EMBEDDINGS is a folder written by ``sslkit-embed``; the threshold is a cosine similarity in
(0, 1]: two items at least that similar are duplicates. ``--fraction`` finds the threshold that
removes that share of the items instead, and every run prints how many items have a neighbour at
0.8, 0.9, 0.95, 0.98 and 0.99, the most each of those thresholds could remove, to choose one by.

Without ``--against``: SemDeDup (spherical k-means into ``--clusters`` clusters, then each
cluster walked in the ``--keep`` order, an item a duplicate of the most similar item kept before
it; :mod:`sslkit.embeddings.duplicates`). ``--out`` (default ``duplicates.csv`` in EMBEDDINGS)
lists every group with a duplicate: ``group,row,item,kept,similarity``, the kept item first,
similarity to it. Items not listed have no duplicate. Pairs that k-means puts in different
clusters are not compared; ``--clusters 1`` compares every pair.

With ``--against TRAIN``: each item's nearest item in TRAIN, exact. ``--out`` (default
``near_copies.csv`` in EMBEDDINGS) lists every item: ``row,item,nearest_row,nearest_item,
similarity,near_copy``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sslkit.embeddings.choices import KEEP_RULES, KMEANS_BACKENDS

    parser = argparse.ArgumentParser(
        prog="sslkit-duplicates",
        description="Near-duplicate groups in an embeddings folder (SemDeDup), or near-copies in another folder.",
        epilog="Output: CSV. Groups: group,row,item,kept,similarity. With --against: "
        "row,item,nearest_row,nearest_item,similarity,near_copy.",
    )
    parser.add_argument("embeddings", help="an embeddings folder written by sslkit-embed")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--threshold", type=float, help="cosine similarity in (0, 1] at which two items are duplicates")
    how.add_argument(
        "--fraction", type=float,
        help="instead of --threshold: the share of the items to remove, in (0, 1); the threshold that removes it is "
        "found and printed (as FiftyOne's find_duplicates(fraction=...))",
    )  # fmt: skip
    parser.add_argument("--against", metavar="TRAIN", help="another embeddings folder: each item's nearest in it")
    parser.add_argument("--clusters", type=int, help="k-means clusters (default: one per 1,000 items; 1: every pair)")
    parser.add_argument(
        "--keep", choices=KEEP_RULES, default="farthest",
        help="the item a group keeps: farthest from its cluster's centroid (default, SemDeDup's), nearest, first row",
    )  # fmt: skip
    parser.add_argument(
        "--kmeans", choices=KMEANS_BACKENDS, default="auto", help="k-means: faiss where installed (auto), or torch"
    )
    parser.add_argument("--seed", type=int, default=0, help="k-means' random start and sample")
    parser.add_argument("--out", help="a .csv file (default: duplicates.csv or near_copies.csv in EMBEDDINGS)")
    return parser.parse_args(argv)


def find(args: argparse.Namespace):
    """Read the folders, search, save; returns what the summary prints."""
    from sslkit.embeddings import near_copies, read_embeddings, semdedup
    from sslkit.embeddings.duplicates import check_threshold, save_groups, save_near_copies
    from sslkit.embeddings.neighbours import check_output
    from sslkit.errors import UserError

    if args.threshold is not None:
        check_threshold(args.threshold)
    embeddings = read_embeddings(args.embeddings)
    train = read_embeddings(args.against) if args.against else None
    if train is not None and args.clusters is not None:
        raise UserError("--clusters is for duplicates within a folder; --against searches every pair exactly")
    default_name = "near_copies.csv" if train is not None else "duplicates.csv"
    out = Path(args.out) if args.out else embeddings.folder / default_name
    check_output(out, (".csv",))
    started = time.perf_counter()
    if train is not None:
        result = near_copies(embeddings.vectors, train.vectors, args.threshold, progress=True)
        save_near_copies(out, result, embeddings.items, train.items)
    else:
        result = semdedup(
            embeddings.vectors, args.threshold, args.clusters, args.keep, seed=args.seed, kmeans=args.kmeans,
            progress=True, fraction=args.fraction,
        )  # fmt: skip
        save_groups(out, result, embeddings.items)
    return embeddings, train, result, time.perf_counter() - started, out


def print_near_copies(console, embeddings, train, copies, threshold: float) -> None:
    import numpy as np
    from rich.table import Table

    count = int(copies.is_copy.sum())
    console.print(
        f"{count:,} of {len(embeddings):,} items ({count / len(embeddings):.2%}) have a near-copy in {train.folder} "
        f"(similarity >= {threshold})",
        soft_wrap=True,
    )
    table = Table(title="the closest pairs")
    for column in ("row", "item", "nearest in the other folder", "similarity"):
        table.add_column(column)
    for row in np.argsort(-copies.similarity, kind="stable")[:5]:
        nearest = int(copies.nearest[row])
        table.add_row(str(row), embeddings.items[row], train.items[nearest], f"{copies.similarity[row]:.4f}")
    console.print(table)


def print_groups(console, embeddings, deduplication, fraction: float | None) -> None:
    from rich.table import Table

    from sslkit.embeddings.duplicates import threshold_table

    groups = deduplication.groups()
    threshold = f"{deduplication.threshold:.4f}" if fraction is not None else str(deduplication.threshold)
    clusters = int(deduplication.clusters.max()) + 1
    kmeans = {"none": "one cluster: every pair compared"}.get(deduplication.kmeans, f"k-means: {deduplication.kmeans}")
    count = deduplication.num_duplicates
    console.print(
        f"{count:,} of {len(embeddings):,} items ({count / len(embeddings):.2%}) are duplicates (similarity >= "
        f"{threshold}) in {len(groups):,} groups; {clusters:,} clusters ({kmeans})",
        soft_wrap=True,
    )
    if fraction is not None:
        console.print(f"the threshold that removes {fraction:.2%} of the items: {threshold}", soft_wrap=True)
    if groups:
        largest = max(groups, key=len)
        console.print(f"largest group: {len(largest)} items, kept {embeddings.items[largest[0]]}", soft_wrap=True)
    # Each item's nearest similarity in its cluster: how many any threshold could remove, to choose one by.
    console.print("a threshold removes at most the items with a neighbour that similar in their cluster:")
    table = Table()
    for column in ("threshold", "items", "share"):
        table.add_column(column, justify="right")
    for value, count in threshold_table(deduplication):
        table.add_row(f"{value:g}", f"{count:,}", f"{count / len(embeddings):.2%}")
    console.print(table)


def check_early(args: argparse.Namespace) -> None:
    """The threshold and the folders, before numpy and torch are imported."""
    from sslkit.cli.early_checks import embeddings_folder
    from sslkit.errors import UserError

    if args.against and args.fraction is not None:
        raise UserError("--fraction is for duplicates within a folder; give --against a --threshold")
    if args.fraction is not None and not 0 < args.fraction < 1:  # the line of duplicates.check_fraction
        raise UserError(
            f"the fraction to remove must be in (0, 1), e.g. 0.05 for 5% of the items, got {args.fraction!r}"
        )
    if args.threshold is not None and not 0 < args.threshold <= 1:  # the line of duplicates.check_threshold
        raise UserError(
            f"the threshold must be a cosine similarity in (0, 1], e.g. 0.95 (1 - eps in SemDeDup), "
            f"got {args.threshold!r}"
        )
    embeddings_folder(args.embeddings)
    if args.against:
        embeddings_folder(args.against)


def main(argv: list[str] | None = None) -> int:
    from sslkit.cli.early_checks import refused
    from sslkit.console import console, print_user_error
    from sslkit.errors import UserError

    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    try:
        embeddings, train, result, seconds, out = find(args)
    except UserError as error:
        print_user_error(error)
        return 2
    if train is not None:
        print_near_copies(console, embeddings, train, result, args.threshold)
    else:
        print_groups(console, embeddings, result, args.fraction)
    console.print(f"{seconds:.1f} s; written to {out}", soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
