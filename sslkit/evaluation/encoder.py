"""A trained encoder from where a run left it: a run directory, a checkpoint in one, or a backbone file.

:func:`load_trained_backbone` rebuilds a run's backbone from its ``config.yaml`` and loads its
weights; :func:`load_backbone` loads a file's weights into a backbone built from any recipe and
says in one line why they do not fit when they do not (a different width, stem or channel count);
:func:`export_run` writes a run's backbone as safetensors, a timm folder or ONNX (:mod:`sslkit.models.export`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch

import sslkit
from sslkit import models
from sslkit.augment import EvalTransform
from sslkit.config import load_config
from sslkit.datasets.splits import build_splits
from sslkit.errors import UserError
from sslkit.models import export, weights


def saved_config_for(target: Path) -> Path | None:
    """The run's config.yaml for a run directory, a checkpoint in one, or a file in one."""
    run_dir = weights.run_directory_of(target)
    return run_dir / "config.yaml" if run_dir is not None else None


def _shape(tensor) -> str:
    return f"[{', '.join(str(n) for n in tensor.shape)}]"


def state_mismatch(state: dict, own: dict) -> str | None:
    """:func:`~sslkit.models.weights.state_differences` in words: None when the file's weights fit the
    model; otherwise the first difference (a shape, then a weight the file lacks, then one the
    model lacks) with how many more there are, e.g. ``conv1.weight is [16, 3, 3, 3] in the file,
    [32, 3, 3, 3] in the model``.
    """
    wrong_shape, missing, extra = weights.state_differences(state, own)
    problems = [f"{key} is {_shape(state[key])} in the file, {_shape(own[key])} in the model" for key in wrong_shape]
    problems += [f"{key} ({_shape(own[key])}) is in the model but not in the file" for key in missing]
    problems += [f"the file has {key} ({_shape(state[key])}), which the model lacks" for key in extra]
    if not problems:
        return None
    more = len(problems) - 1
    return problems[0] + (f", and {more} more difference{'s' if more > 1 else ''}" if more else "")


def load_backbone(backbone, target: Path, cfg) -> None:
    """Load ``target``'s backbone weights into ``backbone``, or raise one line saying why they do not fit."""
    state = weights.load_backbone_state(target)
    model = models.describe(cfg.model)
    own = backbone.state_dict()
    if (problem := state_mismatch(state, own)) is not None:
        ours, theirs = own.get("conv1.weight"), state.get("conv1.weight")
        if (
            ours is not None
            and theirs is not None
            and theirs.dim() == 4
            and ours.shape[1] != theirs.shape[1]
            and (theirs.shape[0], *theirs.shape[2:]) == (ours.shape[0], *ours.shape[2:])
        ):
            # Only the input channels differ: the data, not the model settings, is what changed.
            advice = (
                f"the backbone was trained on {theirs.shape[1]}-channel images, data.name={cfg.data.name} has "
                f"{ours.shape[1]}-channel ones; evaluate it on a dataset with {theirs.shape[1]}-channel images"
            )
        else:
            advice = "pass the model.* values the backbone was trained with, or --recipe with its recipe"
        raise UserError(f"the weights in '{target}' do not fit {model} ({problem}); {advice}")
    try:
        backbone.load_state_dict(state)
    except RuntimeError as error:  # keys and shapes fit, yet torch refused: its whole message, on one line
        raise UserError(f"the weights in '{target}' do not fit {model}: {' '.join(str(error).split())}") from None


def load_trained_backbone(target: Path):
    """The run's config and its backbone with the trained weights, in eval mode, on the CPU."""
    if not target.exists():
        raise UserError(f"'{target}' not found; give a run directory (runs/<name>) or a checkpoint directory in one")
    run_dir = weights.run_directory_of(target)
    if run_dir is None or not target.is_dir():
        raise UserError(f"'{target}' is not a run or checkpoint directory (no config.yaml by it); give runs/<name>")
    cfg = load_config(run_dir / "config.yaml")
    state = weights.load_backbone_state(target)
    backbone = models.backbone_from_config(cfg.model, input_channels(state))
    load_backbone(backbone, target, cfg)
    return cfg, run_dir, backbone.eval()


def input_channels(state: dict) -> int:
    """The channels a backbone's weights take: the input side of its first convolution (the stem comes first in
    the ``state_dict`` of torchvision's ResNets, timm's ViTs (``patch_embed.proj``), ConvNeXts, ...)."""
    first_conv = next(v for v in state.values() if v.dim() == 4)
    return int(first_conv.shape[1])


def run_source(target: Path, run_dir: Path, cfg, command: str) -> dict[str, str]:
    """Where a backbone came from, as text: the run, the file its weights were read from, its step, the recipe
    (the run's config.yaml), the command that exported it and sslkit's version."""
    source = weights.backbone_file(target)
    if source.name == "backbone.safetensors":  # written when the run finished: the step of its results
        results = run_dir / "results.json"
        step = json.loads(results.read_text()).get("step") if results.is_file() else None
    else:
        step = weights.checkpoint_step(source.parent)
    return {
        "run": str(run_dir),
        "weights": str(source.relative_to(run_dir)),
        "step": "" if step is None else str(step),
        "name": cfg.run.name,
        "method": cfg.method.name,
        "loss": cfg.loss.name,
        "data": cfg.data.name,
        "command": command,
        "sslkit": sslkit.__version__,
        "recipe": (run_dir / "config.yaml").read_text(),
    }


def export_run(target: Path, fmt: str, out: Path | None = None) -> tuple[Path, float | None]:
    """Write the backbone of ``target`` (a run or a checkpoint in one) as ``fmt``, with the input it expects
    (the run's image size and its data's channels, mean and std) and where it came from, and check it:
    random images at the data's own size through the export's preprocessing and network give the features
    the run's evaluation transform and backbone give. Returns the path (default: in the run directory) and
    the largest feature difference (None: not checked, no runtime). Nothing is left behind when it fails."""
    command = shlex.join(["sslkit-export", str(target), "--format", fmt, *(["--out", str(out)] if out else [])])
    cfg, run_dir, backbone = load_trained_backbone(target)
    # The statistics the run normalised with are its training data's (computed from the images for some).
    info = build_splits(cfg, run_dir=run_dir).info
    a = cfg.augment
    expected = export.ExpectedInput(info.channels, a.image_size, tuple(info.mean), tuple(info.std), a.normalize)
    metadata = export.export_metadata(cfg.model, backbone, expected, run_source(target, run_dir, cfg, command))
    evaluation = EvalTransform(a.image_size, info.channels, info.mean, info.std, a.normalize)
    side = info.image_size or 2 * a.image_size  # images of their own sizes: shrunk, as most photos are
    shape, seed = (3, info.channels, side, side), torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=seed)
    results = run_dir / "results.json"
    summary = json.loads(results.read_text()) if results.is_file() else None
    out = out or export.default_out(run_dir, fmt)
    run_features = lambda x: backbone(evaluation(x))  # noqa: E731
    return out, export.write_export(cfg.model, backbone, fmt, out, metadata, summary, run_features, images)
