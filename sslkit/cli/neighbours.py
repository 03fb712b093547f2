"""Each item's k nearest neighbours in an embeddings folder, by cosine similarity.

    sslkit-neighbours embeddings/                       # exact, k=10: embeddings/neighbours.npz
    sslkit-neighbours embeddings/ --k 5 --out nn.csv    # as CSV, with the item names
    sslkit-neighbours train/ --queries test/ --out test_in_train.npz
    sslkit-neighbours big/ --index faiss --faiss-type hnsw --recall-sample 1000

EMBEDDINGS is a folder written by ``sslkit-embed``. Without ``--queries`` every item is a query
and is left out of its own list. The output, ``--out`` (default ``neighbours.npz`` in the
queries' folder):

    .npz  ``indices`` (Q, k) int64, rows of EMBEDDINGS, most similar first, and ``similarities``
          (Q, k) float32 cosine similarities: ``np.load("neighbours.npz")["indices"]``.
          Row q is item q of the queries (items.csv).
    .csv  ``query_row,query_item,rank,neighbour_row,neighbour_item,similarity``, rank 1 the nearest.

``--index exact`` (default) compares every pair, a block of queries at a time; ``--index faiss``
searches an approximate faiss index (``pip install "sslkit[faiss]"``) and ``--recall-sample N``
measures its recall@k against the exact search on N queries. docs/neighbours-and-duplicates.md
has the details and measured times.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

OUT_SUFFIXES = (".npz", ".csv")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sslkit.embeddings.choices import FAISS_TYPES, INDEXES

    parser = argparse.ArgumentParser(
        prog="sslkit-neighbours",
        description="Each item's k nearest neighbours (indices and cosine similarities) in an embeddings folder.",
        epilog="Output: .npz with indices (Q, k) int64 and similarities (Q, k) float32, or .csv "
        "(query_row,query_item,rank,neighbour_row,neighbour_item,similarity).",
    )
    parser.add_argument("embeddings", help="an embeddings folder written by sslkit-embed: the items searched")
    parser.add_argument("--k", type=int, default=10, help="neighbours per item (default 10)")
    parser.add_argument("--queries", help="another embeddings folder whose items are the queries (default: each item)")
    parser.add_argument(
        "--out", help="a .npz or .csv file (default: neighbours.npz in the queries' folder, or in EMBEDDINGS)"
    )
    parser.add_argument("--index", choices=INDEXES, default="exact", help="exact (default) or an approximate faiss")
    parser.add_argument("--faiss-type", choices=FAISS_TYPES, default="ivf", help="IVF-Flat (default) or HNSW")
    parser.add_argument("--nprobe", type=int, help="IVF lists scanned per query (default 16)")
    parser.add_argument("--ef-search", type=int, help="HNSW candidate list per query (default max(64, 2k))")
    parser.add_argument(
        "--recall-sample", type=int, metavar="N", help="measure recall@k against the exact search on N queries"
    )
    parser.add_argument("--seed", type=int, default=0, help="the IVF index's training sample, the recall sample")
    return parser.parse_args(argv)


def find(args: argparse.Namespace):
    """Read the folders, search, save; returns what the summary prints."""
    from sslkit.embeddings import nearest_neighbours, read_embeddings, recall_at_k
    from sslkit.embeddings.neighbours import check_output, save_neighbours
    from sslkit.errors import UserError

    embeddings = read_embeddings(args.embeddings)
    queries = read_embeddings(args.queries) if args.queries else None
    asked = queries if queries is not None else embeddings
    out = Path(args.out) if args.out else asked.folder / "neighbours.npz"
    check_output(out, OUT_SUFFIXES)
    if args.recall_sample is not None and args.index == "exact":
        raise UserError("--recall-sample measures an approximate index against the exact search: add --index faiss")
    if args.recall_sample is not None and args.recall_sample < 1:
        raise UserError(f"--recall-sample must be >= 1 queries, got {args.recall_sample}")
    started = time.perf_counter()
    similarities, indices = nearest_neighbours(
        embeddings.vectors, args.k, queries.vectors if queries is not None else None, args.index, args.faiss_type,
        args.nprobe, args.ef_search, args.seed, progress=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    recall = None
    if args.recall_sample is not None:
        query_vectors = queries.vectors if queries is not None else None
        recall = recall_at_k(embeddings.vectors, indices, query_vectors, args.recall_sample, args.seed)
    save_neighbours(out, similarities, indices, asked.items, embeddings.items)
    return embeddings, queries, similarities, indices, seconds, recall, out


def check_early(args: argparse.Namespace) -> None:
    """The folders, before numpy and torch are imported."""
    from sslkit.cli.early_checks import embeddings_folder

    embeddings_folder(args.embeddings)
    if args.queries:
        embeddings_folder(args.queries)


def main(argv: list[str] | None = None) -> int:
    from sslkit.cli.early_checks import refused
    from sslkit.console import console, print_user_error
    from sslkit.errors import UserError

    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    import numpy as np

    try:
        embeddings, queries, similarities, indices, seconds, recall, out = find(args)
    except UserError as error:
        print_user_error(error)
        return 2
    search = "exact" if args.index == "exact" else f"faiss {args.faiss_type}"
    asked = f"{len(indices):,} items of {queries.folder}" if queries is not None else f"{len(indices):,} items"
    console.print(
        f"{args.k} nearest of {asked} among {len(embeddings):,} ({embeddings.vectors.shape[1]} dimensions), "
        f"{search}: {seconds:.1f} s",
        soft_wrap=True,
    )
    if len(indices):
        console.print(
            f"similarity to the nearest: median {np.median(similarities[:, 0]):.3f}, "
            f"to the {args.k}th: median {np.median(similarities[:, -1]):.3f}"
        )
    if recall is not None:
        sampled = min(args.recall_sample, len(indices))
        console.print(f"recall@{args.k} against the exact search on {sampled} queries: {recall:.4f}")
    if (missing := int((indices < 0).sum())) > 0:
        short = f"the index found fewer than {args.k} for some queries: {missing} entries are -1 (raise --nprobe)"
        console.print(short, soft_wrap=True)
    console.print(f"written to {out}", soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
