"""Export a trained backbone where users take their weights: safetensors, a timm model folder, or ONNX.

    sslkit-export runs/quickstart                       # safetensors (torchvision or timm keys)
    sslkit-export runs/vit --format timm                # timm.create_model("local-dir:runs/vit/export-timm")
    sslkit-export runs/x/checkpoints/step-00000420 --format onnx --out /tmp/x.onnx

RUN is a run directory (its ``backbone.safetensors``, or its latest checkpoint) or a checkpoint
directory inside one; the run's ``config.yaml`` says which network the weights belong to. Every
export is loaded back the way its users will load it and run on a batch of random images next to
the trained network: the largest difference of their features is printed, and an export that does
not reproduce the network is deleted, not left behind.

Formats:
    safetensors  the backbone's plain ``state_dict`` as the backbone came (torchvision keys for
                 sslkit's ResNets, timm's keys for timm models), with the recipe's model settings
                 in the file's metadata.
    timm         a folder in timm's Hugging Face layout (``config.json`` + ``model.safetensors``):
                 ``timm.create_model("local-dir:FOLDER", pretrained=True)`` rebuilds the network
                 with its arguments (``img_size``, ``patch_size``, ``in_chans``, ...) and weights.
                 sslkit's ResNets of width 64 without the CIFAR stem are timm's ResNets exactly;
                 other widths and stems have no timm counterpart.
    onnx         the network in inference mode, input ``images`` (N, C, S, S) float with a dynamic
                 batch, output ``features`` (N, D); opset :data:`ONNX_OPSET`, written by torch's
                 dynamo-based exporter (needs the ``onnx`` and ``onnxscript`` packages).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path

FORMATS = ("safetensors", "timm", "onnx")
# The lowest opset torch's dynamo-based exporter writes; onnxruntime runs it from version 1.14.
ONNX_OPSET = 18
# An export reproduces the network when its features differ by less than this (float32 kernels
# of another runtime reorder sums: differences of 1e-6 relative are expected, 1e-3 are not).
TOLERANCE = 1e-4


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


def default_out(run_dir: Path, fmt: str) -> Path:
    return run_dir / {"safetensors": "export.safetensors", "timm": "export-timm", "onnx": "export.onnx"}[fmt]


def timm_model_args(cfg, backbone) -> tuple[str, dict]:
    """The timm architecture and ``create_model`` arguments that rebuild ``backbone`` (``num_classes=0``)."""
    from sslkit import models
    from sslkit.errors import UserError

    name = models.timm_name(cfg.model.backbone)
    args = {"num_classes": 0, "in_chans": backbone.in_channels}
    if name is not None:
        return name, {**args, **cfg.model.kwargs}
    if cfg.model.width != 64 or cfg.model.cifar_stem:
        raise UserError(
            f"{models.describe(cfg.model)} has no timm counterpart (timm's ResNets have a 64-channel 7x7 stem); "
            f"export it with --format safetensors (torchvision keys) or --format onnx, or train "
            f"model.backbone=timm/{cfg.model.backbone} with model.kwargs"
        )
    return cfg.model.backbone, args  # torchvision's and timm's ResNets share architecture and keys


def write_safetensors(cfg, backbone, path: Path) -> None:
    from sslkit import models
    from sslkit.models import weights

    name, args = models.timm_name(cfg.model.backbone), {"in_chans": backbone.in_channels}
    metadata = {
        "sslkit.model": models.describe(cfg.model),
        "keys": "timm" if name else "torchvision",
        "architecture": name or cfg.model.backbone,
        "model_args": json.dumps({**args, **cfg.model.kwargs} if name else {**args, "width": cfg.model.width}),
    }
    weights.export_backbone(backbone, path, metadata)


def write_timm(cfg, backbone, folder: Path) -> None:
    import timm
    from timm.models import save_for_hf

    name, args = timm_model_args(cfg, backbone)
    model = timm.create_model(name, pretrained=False, **args)
    model.load_state_dict(backbone.state_dict())
    save_for_hf(model, str(folder), model_args=args, safe_serialization=True)


def write_onnx(cfg, backbone, path: Path) -> None:
    import torch

    from sslkit.errors import UserError

    missing = [package for package in ("onnx", "onnxscript") if _absent(package)]
    if missing:
        raise UserError(
            f"--format onnx needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}, which is not "
            f'installed: pip install "sslkit[onnx]" (or pip install {" ".join(missing)})'
        )
    size = cfg.augment.image_size
    example = torch.randn(2, backbone.in_channels, size, size)
    # The exporter narrates every pass on stdout; the user gets one line from sslkit instead.
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(
            backbone,
            (example,),
            str(path),
            dynamo=True,
            opset_version=ONNX_OPSET,
            input_names=["images"],
            output_names=["features"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            external_data=False,
        )


def load_export(path: Path, fmt: str):
    """The export loaded as its users load it: a callable from float images (N, C, S, S) to features (N, D)."""
    import torch

    if fmt == "timm":
        import timm

        model = timm.create_model(f"local-dir:{path}", pretrained=True).eval()
        return lambda images: model(images)
    if fmt == "onnx":
        if _absent("onnxruntime"):
            return None
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda images: torch.from_numpy(session.run(["features"], {"images": images.numpy()})[0])
    return None  # safetensors: compared by tensor equality instead


def verify(cfg, backbone, path: Path, fmt: str) -> float | None:
    """The largest difference between the export's features and the trained network's on random images (a
    batch of 3, not the batch of 2 the ONNX graph was traced with); None where no runtime is installed."""
    import torch
    from safetensors.torch import load_file

    if fmt == "safetensors":
        saved, own = load_file(str(path)), backbone.state_dict()
        return max(float((saved[k] - v.cpu()).abs().max()) if v.numel() else 0.0 for k, v in own.items())
    run = load_export(path, fmt)
    if run is None:
        return None
    size = cfg.augment.image_size
    images = torch.randn(3, backbone.in_channels, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return float((run(images) - backbone(images)).abs().max())


def export(target: Path, fmt: str, out: Path | None = None) -> tuple[Path, float | None]:
    """Write ``target``'s backbone as ``fmt`` and check it reproduces the network; returns the path and the
    largest feature difference (None: not checked, no runtime). Nothing is left behind when it fails."""
    from sslkit.errors import UserError
    from sslkit.evaluation.encoder import load_trained_backbone

    cfg, run_dir, backbone = load_trained_backbone(target)
    out = out or default_out(run_dir, fmt)
    if not out.parent.is_dir():
        raise UserError(f"--out '{out}': the folder '{out.parent}' does not exist; create it or give another path")
    if fmt == "timm":
        timm_model_args(cfg, backbone)  # its one line before anything is written
    tmp = out.with_name(out.name + ".tmp")
    _remove(tmp)
    try:
        {"safetensors": write_safetensors, "timm": write_timm, "onnx": write_onnx}[fmt](cfg, backbone, tmp)
        difference = verify(cfg, backbone, tmp, fmt)
        if difference is not None and not difference < TOLERANCE:
            raise RuntimeError(f"the {fmt} export differs from the trained network by {difference:.3g}")
        _remove(out)
        os.replace(tmp, out)
    finally:
        _remove(tmp)
    return out, difference


def _absent(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is None


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def main(argv: list[str] | None = None) -> int:
    from sslkit.console import console, print_user_error
    from sslkit.errors import UserError

    args = parse_args(argv)
    try:
        out, difference = export(Path(args.run), args.format, Path(args.out) if args.out else None)
    except UserError as error:
        print_user_error(error)
        return 2
    checked = (
        f"loaded back: features within {difference:.1e} of the trained network"
        if difference is not None
        else "not loaded back (pip install onnxruntime to check it)"
    )
    console.print(f"{args.format} export written to {out} ({checked})", soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
