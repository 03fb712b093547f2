"""``sslkit-embed``'s command line: its parser and its argv builder.

>>> build_argv("runs/pretrain", ["train.threads=2"], split="train", out="embeddings")
['runs/pretrain', 'train.threads=2', '--split', 'train', '--out', 'embeddings']
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

MODULE = "sslkit.cli.embed"  # the command these arguments are for: python -m MODULE ARGV
OPTIONS = (
    "--recipe", "--out", "--data", "--split", "--layer", "--dtype", "--normalize", "--no-normalize", "--batch-size",
    "--overwrite",
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-embed",
        description="Embeddings of a dataset or an image folder by a trained encoder, as an embeddings folder.",
    )
    parser.add_argument("source", help="a run directory, a checkpoint directory, a backbone file, or a timm folder")
    parser.add_argument(
        "overrides", nargs="*", default=[], help="dotted key=value overrides of the recipe, e.g. data.num_workers=4"
    )
    parser.add_argument("--recipe", help="the recipe of a backbone file (default: the run's config.yaml)")
    parser.add_argument(
        "--data",
        help="what to embed (default: the run's dataset): a dataset name (digits, fashion_mnist, cub200, ...; with "
        "data.root=DIR for its files), a folder of images at any depth (labelled by train/<class>/ and test/<class>/ "
        "folders, else unlabelled), or tar shards",
    )
    parser.add_argument("--split", help="the split (default: the run's data.train_split, or train)")
    parser.add_argument(
        "--layer",
        choices=("backbone", "projector"),
        default="backbone",
        help="backbone: the pooled features (default); projector: the method's projection head output (a run or "
        "checkpoint only)",
    )
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="default float32")
    parser.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="L2-normalise each embedding, so that cosine similarity is a dot product (default: on)",
    )
    parser.add_argument("--batch-size", type=int, help="images per batch (default: the recipe's eval.batch_size)")
    parser.add_argument(
        "--out",
        help="the output folder (default: <run>/embeddings-<data>-<split>, with -projector for --layer projector, and "
        "-step-N for a checkpoint; beside a backbone file or timm folder)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an output folder holding other embeddings")
    return parser.parse_intermixed_args(argv)


def build_argv(
    source: str | Path,
    overrides: Sequence[str] = (),
    *,
    split: str | None = None,
    out: str | Path | None = None,
    data: str | None = None,
    recipe: str | Path | None = None,
) -> list[str]:
    """The arguments that embed ``split`` of ``data`` (default: the run's own training images) with the encoder of
    ``source`` (with ``recipe`` for a backbone file) and ``overrides`` into the folder ``out``."""
    options = {"--recipe": recipe, "--data": data, "--split": split, "--out": out}
    return [str(source), *overrides, *(a for o, v in options.items() if v is not None for a in (o, str(v)))]
