"""``sslkit-pretrain``'s command line: its parser and its argv builder.

>>> build_argv("recipes/quickstart.yaml", ["train.epochs=5"])
['recipes/quickstart.yaml', 'train.epochs=5']
>>> parse_args(build_argv("quickstart", ["train.epochs=5"])).overrides
['train.epochs=5']
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

MODULE = "sslkit.cli.pretrain"  # the command these arguments are for: python -m MODULE ARGV


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sslkit.schema import bundled_recipes

    parser = argparse.ArgumentParser(
        prog="sslkit-pretrain",
        description="Pretrain an encoder from a YAML recipe.",
    )
    parser.add_argument(
        "recipe", help="a YAML recipe's path, or the name of a bundled one: " + ", ".join(bundled_recipes())
    )
    parser.add_argument(
        "overrides", nargs="*", default=[], help="dotted key=value overrides, e.g. train.epochs=5 loss.temperature=0.2"
    )
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def build_argv(recipe: str | Path, overrides: Sequence[str] = ()) -> list[str]:
    """The arguments that train ``recipe`` with ``overrides`` (dotted ``key=value``, the later one winning)."""
    return [str(recipe), *overrides]
