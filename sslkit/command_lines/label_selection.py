"""``sslkit-select``'s command line: its parser and its argv builder.

>>> build_argv("embeddings", budget=100, strategy="typiclust", seed=2, out="labels/typiclust-n100-s2.json")
['embeddings', '--budget', '100', '--strategy', 'typiclust', '--seed', '2', '--out', 'labels/typiclust-n100-s2.json']
"""

from __future__ import annotations

import argparse
from pathlib import Path

MODULE = "sslkit.cli.label_selection"  # the command these arguments are for: python -m MODULE ARGV
DESCRIPTION = "Choose which images to label, from their embeddings, and write the label file a recipe trains on."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sslkit.selection.choices import STRATEGIES

    parser = argparse.ArgumentParser(
        prog="sslkit-select",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("embeddings", type=Path, help="an embeddings folder (sslkit-embed's output)")
    parser.add_argument("--budget", type=int, required=True, help="how many images to label")
    parser.add_argument(
        "--strategy",
        required=True,
        help="; ".join(f"{name}: {what}" for name, what in STRATEGIES.items()),
    )
    parser.add_argument("--labelled", type=Path, help="images labelled already: a label file, or items one a line")
    parser.add_argument("--seed", type=int, default=0, help="seeds k-means and random draws (default 0)")
    parser.add_argument(
        "--out", type=Path, help="the label file (default: EMBEDDINGS/labels-<strategy>-<labels>-seed<seed>.json)"
    )
    parser.add_argument("--delta", type=float, help="probcover: the ball radius on unit vectors (default: by purity)")
    parser.add_argument(
        "--classes",
        type=int,
        help="probcover: k-means pseudo-classes for delta's purity (default: the classes of the embeddings' labels)",
    )
    return parser.parse_args(argv)


def build_argv(
    embeddings: str | Path,
    *,
    budget: int,
    strategy: str,
    seed: int = 0,
    out: str | Path | None = None,
    labelled: str | Path | None = None,
) -> list[str]:
    """The arguments that choose ``budget`` images of the embeddings folder by ``strategy`` (seeded by ``seed``),
    added to those of ``labelled`` when given, and write their label file to ``out``."""
    argv = [str(embeddings), "--budget", str(budget), "--strategy", strategy]
    argv += ["--labelled", str(labelled)] if labelled is not None else []
    return [*argv, "--seed", str(seed), *(["--out", str(out)] if out is not None else [])]
