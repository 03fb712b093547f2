"""A trained backbone written where users take their weights, and loaded back to check it: safetensors, a timm
model folder, or ONNX.

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

Every export is loaded back the way its users will load it and run on a batch of random images next
to the trained network (:func:`write_export`): one that does not reproduce the network is deleted,
not left behind. The functions take the recipe's ``model`` section and the backbone; reading a run
is :mod:`sslkit.evaluation.encoder`'s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
from pathlib import Path

import torch

from sslkit.errors import UserError
from sslkit.models import backbones, weights

FORMATS = ("safetensors", "timm", "onnx")
# The lowest opset torch's dynamo-based exporter writes; onnxruntime runs it from version 1.14.
ONNX_OPSET = 18
# An export reproduces the network when its features differ by less than this (float32 kernels
# of another runtime reorder sums: differences of 1e-6 relative are expected, 1e-3 are not).
TOLERANCE = 1e-4


def default_out(run_dir: Path, fmt: str) -> Path:
    """Where an export goes unless told: in the run directory."""
    return run_dir / {"safetensors": "export.safetensors", "timm": "export-timm", "onnx": "export.onnx"}[fmt]


def timm_model_args(model_cfg, backbone) -> tuple[str, dict]:
    """The timm architecture and ``create_model`` arguments that rebuild ``backbone`` (``num_classes=0``)."""
    name = backbones.timm_name(model_cfg.backbone)
    args = {"num_classes": 0, "in_chans": backbone.in_channels}
    if name is not None:
        return name, {**args, **model_cfg.kwargs}
    if model_cfg.width != 64 or model_cfg.cifar_stem:
        raise UserError(
            f"{backbones.describe(model_cfg)} has no timm counterpart (timm's ResNets have a 64-channel 7x7 stem); "
            f"export it with --format safetensors (torchvision keys) or --format onnx, or train "
            f"model.backbone=timm/{model_cfg.backbone} with model.kwargs"
        )
    return model_cfg.backbone, args  # torchvision's and timm's ResNets share architecture and keys


def write_safetensors(model_cfg, backbone, path: Path) -> None:
    name, args = backbones.timm_name(model_cfg.backbone), {"in_chans": backbone.in_channels}
    metadata = {
        "sslkit.model": backbones.describe(model_cfg),
        "keys": "timm" if name else "torchvision",
        "architecture": name or model_cfg.backbone,
        "model_args": json.dumps({**args, **model_cfg.kwargs} if name else {**args, "width": model_cfg.width}),
    }
    weights.export_backbone(backbone, path, metadata)


def write_timm(model_cfg, backbone, folder: Path) -> None:
    import timm
    from timm.models import save_for_hf

    name, args = timm_model_args(model_cfg, backbone)
    model = timm.create_model(name, pretrained=False, **args)
    model.load_state_dict(backbone.state_dict())
    save_for_hf(model, str(folder), model_args=args, safe_serialization=True)
    weights.match_file_mode(folder / "model.safetensors", folder / "config.json")


def write_onnx(backbone, path: Path, image_size: int) -> None:
    missing = [package for package in ("onnx", "onnxscript") if absent(package)]
    if missing:
        raise UserError(
            f"--format onnx needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}, which is not "
            f'installed: pip install "sslkit[onnx]" (or pip install {" ".join(missing)})'
        )
    example = torch.randn(2, backbone.in_channels, image_size, image_size)
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
    if fmt == "timm":
        import timm

        model = timm.create_model(f"local-dir:{path}", pretrained=True).eval()
        return lambda images: model(images)
    if fmt == "onnx":
        if absent("onnxruntime"):
            return None
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda images: torch.from_numpy(session.run(["features"], {"images": images.numpy()})[0])
    return None  # safetensors: compared by tensor equality instead


def verify(backbone, path: Path, fmt: str, image_size: int) -> float | None:
    """The largest difference between the export's features and the trained network's on random images (a
    batch of 3, not the batch of 2 the ONNX graph was traced with); None where no runtime is installed."""
    from safetensors.torch import load_file

    if fmt == "safetensors":
        saved, own = load_file(str(path)), backbone.state_dict()
        return max(float((saved[k] - v.cpu()).abs().max()) if v.numel() else 0.0 for k, v in own.items())
    run = load_export(path, fmt)
    if run is None:
        return None
    images = torch.randn(3, backbone.in_channels, image_size, image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return float((run(images) - backbone(images)).abs().max())


def write_export(model_cfg, backbone, fmt: str, out: Path, image_size: int) -> float | None:
    """Write ``backbone`` as ``fmt`` at ``out`` and check it reproduces the network; returns the largest feature
    difference (None: not checked, no runtime). Nothing is left behind when it fails."""
    if not out.parent.is_dir():
        raise UserError(f"--out '{out}': the folder '{out.parent}' does not exist; create it or give another path")
    if fmt == "timm":
        timm_model_args(model_cfg, backbone)  # its one line before anything is written
    tmp = out.with_name(out.name + ".tmp")
    _remove(tmp)
    try:
        if fmt == "safetensors":
            write_safetensors(model_cfg, backbone, tmp)
        elif fmt == "timm":
            write_timm(model_cfg, backbone, tmp)
        else:
            write_onnx(backbone, tmp, image_size)
        difference = verify(backbone, tmp, fmt, image_size)
        if difference is not None and not difference < TOLERANCE:
            raise RuntimeError(f"the {fmt} export differs from the trained network by {difference:.3g}")
        _remove(out)
        os.replace(tmp, out)
    finally:
        _remove(tmp)
    return difference


def absent(package: str) -> bool:
    """Whether ``package`` is not installed (found without importing it)."""
    return importlib.util.find_spec(package) is None


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
