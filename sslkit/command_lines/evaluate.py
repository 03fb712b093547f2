"""``sslkit-evaluate``'s command line: its parser and its argv builder.

>>> build_argv("runs/pretrain", ["eval.label_fraction=0.1"], out="points/frozen.json")
['runs/pretrain', 'eval.label_fraction=0.1', '--out', 'points/frozen.json']
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

MODULE = "sslkit.cli.evaluate"  # the command these arguments are for: python -m MODULE ARGV
OPTIONS = ("--recipe", "--out", "--no-linear")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-evaluate",
        description="kNN and linear-probe accuracy of a trained encoder.",
    )
    parser.add_argument("target", help="a run directory, a checkpoint directory, or a backbone .safetensors/.pt file")
    parser.add_argument(
        "overrides", nargs="*", default=[], help="dotted key=value overrides of the run's config, e.g. eval.knn_k=20"
    )
    parser.add_argument(
        "--recipe", help="the recipe to read data/model settings from (default: the run's config.yaml)"
    )
    parser.add_argument(
        "--out",
        help="where to write the JSON results (default: next to what is evaluated: <run>/eval.json "
        "for a run directory, <checkpoint>.eval.json beside a checkpoint directory, e.g. "
        "runs/x/checkpoints/step-00000420.eval.json, and <name>.eval.json beside a backbone file, "
        "e.g. /tmp/bb.eval.json for /tmp/bb.safetensors)",
    )
    parser.add_argument("--no-linear", action="store_true", help="skip the linear probe")
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def build_argv(
    target: str | Path,
    overrides: Sequence[str] = (),
    *,
    out: str | Path | None = None,
    recipe: str | Path | None = None,
    linear: bool = True,
) -> list[str]:
    """The arguments that evaluate ``target`` (a run, a checkpoint or a backbone file with ``recipe``) with
    ``overrides``, its results written to ``out`` (default: beside ``target``), the linear probe unless
    ``linear`` is False."""
    return [
        str(target),
        *overrides,
        *(["--recipe", str(recipe)] if recipe is not None else []),
        *(["--out", str(out)] if out is not None else []),
        *([] if linear else ["--no-linear"]),
    ]
