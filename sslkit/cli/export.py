"""Export a trained backbone where users take their weights: safetensors, a timm model folder, or ONNX.

    sslkit-export runs/quickstart                       # safetensors (torchvision or timm keys)
    sslkit-export runs/vit --format timm                # timm.create_model("local-dir:runs/vit/export-timm")
    sslkit-export runs/x/checkpoints/step-00000420 --format onnx --out /tmp/x.onnx

RUN is a run directory (its ``backbone.safetensors``, or its latest checkpoint) or a checkpoint
directory inside one; the run's ``config.yaml`` says which network the weights belong to. Every
export records the input it expects (channels, size, resize, the training data's mean and std) and
where it came from, and gets a model card (``<file>.md``, or ``README.md`` in a timm folder). It is
loaded back the way its users will load it, and random images through its own preprocessing and
network are compared with the run's evaluation transform and trained network: the largest
difference of their features is printed, and an export that does not reproduce the network is
deleted, not left behind.

The formats and how each is checked: :mod:`sslkit.models.export`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The choices, without importing torch for --help (sslkit.models.export.FORMATS, checked by the tests).
FORMATS = ("safetensors", "timm", "onnx")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-export",
        description="Export a run's backbone (safetensors, a timm model folder or ONNX), checked by loading it back.",
    )
    parser.add_argument("run", help="a run directory, or a checkpoint directory inside one")
    parser.add_argument("--format", choices=FORMATS, default="safetensors", help="what to write (default safetensors)")
    parser.add_argument(
        "--out",
        help="where to write it (default: in the run directory: export.safetensors, export-timm/, export.onnx)",
    )
    return parser.parse_args(argv)


def export(target: Path, fmt: str, out: Path | None = None) -> tuple[Path, float | None]:
    """sslkit-export as a function: :func:`sslkit.evaluation.encoder.export_run`."""
    from sslkit.evaluation.encoder import export_run

    return export_run(Path(target), fmt, out)


def check_early(args: argparse.Namespace) -> None:
    """The run, before torch is imported."""
    from sslkit.cli.early_checks import existing_path

    existing_path(args.run, "a run directory (runs/<name>) or a checkpoint directory in one")


def main(argv: list[str] | None = None) -> int:
    from sslkit.cli.early_checks import refused
    from sslkit.console import console, print_user_error
    from sslkit.errors import UserError

    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.models.export import card_path

    try:
        out, difference = export(Path(args.run), args.format, Path(args.out) if args.out else None)
    except UserError as error:
        print_user_error(error)
        return 2
    checked = (
        f"loaded back: features within {difference:.1e} of the trained network's"
        if difference is not None
        else 'not checked: onnxruntime is not installed (pip install "sslkit[onnx]" brings it)'
    )
    card = card_path(out, args.format)
    console.print(
        f"{args.format} export written to {out}, model card {card} ({checked})", soft_wrap=True, markup=False
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
