"""The network ``sslkit-embed`` runs, with the input it expects, from any place sslkit leaves an encoder.

A source is one of:

- a run directory (its ``config.yaml`` and ``backbone.safetensors``, or its latest checkpoint);
- a checkpoint directory inside one (``checkpoints/step-N``);
- a backbone file (``.safetensors`` or a weights-only ``.pt``), with the recipe it was trained
  with (``recipe``; a file inside a run directory finds the run's ``config.yaml`` itself);
- a timm model folder (``config.json`` + ``model.safetensors``, as ``sslkit-export --format timm``
  writes it), rebuilt by ``timm.create_model("local-dir:FOLDER", pretrained=True)``.

The input is the run's evaluation transform (:class:`~sslkit.augment.EvalTransform`): the recipe's
``augment.image_size``, the normalisation statistics of the run's training data and its channel
count; a timm folder's come from its ``pretrained_cfg`` (``input_size``, ``mean``, ``std``).

Two layers: ``backbone`` (the pooled features) and ``projector`` (the method's projection head on
top of them, from the checkpoint's ``model.safetensors``; the supervised metric-learning methods
call theirs ``neck``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from sslkit import methods, models
from sslkit.augment import EvalTransform
from sslkit.augment.channels import ConvertChannels
from sslkit.config import apply_overrides, config_from_dict, load_config
from sslkit.datasets import DatasetInfo, build_dataset
from sslkit.errors import UserError
from sslkit.evaluation.encoder import input_channels, load_backbone, saved_config_for
from sslkit.models import weights

LAYERS = ("backbone", "projector")
# The submodule a method keeps its projection head in, in the order looked for in a checkpoint: the
# contrastive and non-contrastive methods' projector, the supervised metric-learning methods' neck.
HEAD_NAMES = ("projector", "neck")
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth")


@dataclasses.dataclass(frozen=True)
class Transform:
    """What an image goes through before the network: resized to a square, scaled to [0, 1], normalised.

    ``converted_from``: the images' own channel count where it is not ``channels`` (grey <-> RGB,
    :class:`~sslkit.augment.channels.ConvertChannels` first).
    """

    image_size: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    normalize: bool = True
    converted_from: int | None = None

    def module(self) -> nn.Module:
        evaluation = EvalTransform(self.image_size, self.channels, self.mean, self.std, self.normalize)
        if self.converted_from is None:
            return evaluation
        return nn.Sequential(ConvertChannels(self.converted_from, self.channels), evaluation)


@dataclasses.dataclass(frozen=True)
class Encoder:
    """A network from preprocessed images to features, and what it expects.

    Attributes:
        network: in eval mode, on the CPU; (B, C, S, S) float -> (B, D).
        transform: the input it was trained with (``channels`` is what its first layer takes).
        description: the architecture, e.g. ``model.backbone=resnet18 width=16 cifar_stem=True``.
        layer: ``backbone`` or ``projector``.
        kind: ``run``, ``checkpoint``, ``backbone file`` or ``timm folder``.
        run_dir: the run directory it came from (None: a file or folder outside one).
    """

    network: nn.Module
    transform: Transform
    description: str
    layer: str
    kind: str
    run_dir: Path | None

    def weights_sha256(self) -> str:
        """A digest of the weights (every tensor of ``state_dict``, in order): two sources with the same one
        compute the same embeddings."""
        digest = hashlib.sha256()
        for key, tensor in self.network.state_dict().items():
            digest.update(key.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    @torch.no_grad()
    def dimension(self) -> int:
        """D, found by running the network on one blank image (a projection head's width is not declared)."""
        size, channels = self.transform.image_size, self.transform.channels
        return int(self.network(torch.zeros(1, channels, size, size)).shape[1])


def source_kind(source: Path) -> str:
    """Which of the four kinds of source (see the module docstring) ``source`` is, or one line saying it is none."""
    if not source.exists():
        raise UserError(f"'{source}' not found; give a run directory, a checkpoint, a backbone file or a timm folder")
    if source.is_dir():
        if (source / "config.yaml").is_file():
            return "run"
        if (source / weights.PROGRESS_FILE).is_file():
            return "checkpoint"
        if (source / "config.json").is_file() and (source / "model.safetensors").is_file():
            return "timm folder"
    elif source.suffix in WEIGHT_SUFFIXES:
        return "backbone file"
    raise UserError(
        f"'{source}' is not a run directory (config.yaml), a checkpoint (progress.json), a backbone file "
        f"({', '.join(WEIGHT_SUFFIXES)}) or a timm folder (config.json + model.safetensors); give one of those"
    )


def recipe_of(source: Path, recipe: str | Path | None = None, overrides: list[str] | None = None):
    """The recipe ``source`` was trained with, with ``overrides``; for a timm folder, the defaults with them.

    Args:
        source: a run directory, a checkpoint, a backbone file or a timm folder.
        recipe: the recipe a backbone file was trained with (default: the ``config.yaml`` of the run it is in).
        overrides: ``key=value`` changes to the recipe, as the other commands take them.
    """
    kind = source_kind(source)
    if kind == "timm folder":
        if recipe is not None:
            raise UserError(f"'{source}' is a timm folder, which carries its own configuration; drop --recipe")
        return config_from_dict(apply_overrides({}, overrides or []), "command line")
    recipe = Path(recipe) if recipe is not None else saved_config_for(source)
    if recipe is None:
        raise UserError(f"no config.yaml next to '{source}'; pass --recipe with the recipe it was trained with")
    return load_config(recipe, overrides)


def load_encoder(source: str | Path, cfg, layer: str = "backbone", statistics: DatasetInfo | None = None) -> Encoder:
    """The encoder at ``source`` (see the module docstring) with its input transform, in eval mode on the CPU.

    Args:
        source: a run directory, a checkpoint, a backbone file or a timm folder.
        cfg: its recipe (:func:`recipe_of`).
        layer: ``backbone`` (pooled features) or ``projector`` (the method's projection head output).
        statistics: the run's training data's statistics when the caller has read that data already
            (default: read from ``cfg.data``, :func:`run_statistics`).

    Raises:
        UserError: a source of none of the four kinds, weights that do not fit the recipe, or a projection
            head asked of a source without one.
    """
    source = Path(source)
    if layer not in LAYERS:
        raise UserError(f"unknown layer '{layer}'; choose one of: {', '.join(LAYERS)}")
    kind = source_kind(source)
    if kind == "timm folder":
        return _timm_encoder(source, layer)
    if layer == "projector":
        network = _backbone_and_head(source, kind, cfg)
    else:
        network = models.backbone_from_config(cfg.model, input_channels(weights.load_backbone_state(source)))
        load_backbone(network, source, cfg)
    info = statistics or run_statistics(cfg)
    channels = input_channels(network.state_dict())
    transform = Transform(cfg.augment.image_size, channels, info.mean, info.std, cfg.augment.normalize)
    run_dir = weights.run_directory_of(source)
    return Encoder(network.eval(), transform, models.describe(cfg.model), layer, kind, run_dir)


def run_statistics(cfg) -> DatasetInfo:
    """The run's training data's channels, mean and std: what its images were normalised with.

    Every reader's statistics are fixed for the dataset (each split has its training split's), so
    this reads the recipe's ``data`` once; the image folders and shards take ImageNet's.
    """
    d = cfg.data
    try:
        return build_dataset(d.name, d.train_split, d.root, d.download, d.image_size, d.max_size).info
    except UserError as error:
        raise UserError(
            f"the run's images were normalised with the statistics of its training data ({d.name}), which cannot be "
            f"read here: {error}"
        ) from None


def _backbone_and_head(source: Path, kind: str, cfg) -> nn.Module:
    """The backbone followed by the method's projection head, both from the checkpoint's ``model.safetensors``."""
    if kind == "backbone file":
        raise UserError(
            f"--layer projector needs the method's projection head, which the backbone file '{source}' does not "
            f"hold; give the run directory or one of its checkpoints, or use --layer backbone"
        )
    state = weights.load_method_state(source)
    name = next((name for name in HEAD_NAMES if any(key.startswith(f"{name}.") for key in state)), None)
    if name is None:
        raise UserError(
            f"the checkpoint of '{source}' (method.name={cfg.method.name}) holds no projection head; "
            f"use --layer backbone"
        )
    backbone_state = weights.submodule_state(state, "backbone")
    backbone = models.backbone_from_config(cfg.model, input_channels(backbone_state))
    # The method is built only for its head: the classifier and memory bank it sizes with these are not loaded.
    method = methods.build_method(cfg, backbone, num_classes=2, num_samples=2)
    head = method.get_submodule(name)
    for module, module_state in ((backbone, backbone_state), (head, weights.submodule_state(state, name))):
        try:
            module.load_state_dict(module_state)
        except RuntimeError as error:
            problem = " ".join(str(error).split())
            model = models.describe(cfg.model)
            raise UserError(f"the checkpoint of '{source}' does not fit {model}: {problem}") from None
    return nn.Sequential(backbone, head)


def _timm_encoder(folder: Path, layer: str) -> Encoder:
    """A timm model folder, with the input its ``pretrained_cfg`` records."""
    if layer == "projector":
        raise UserError(
            f"'{folder}' is a timm folder: it holds the backbone alone, without the method's projection head; "
            f"use --layer backbone, or give the run directory"
        )
    config = json.loads((folder / "config.json").read_text())
    pretrained = config.get("pretrained_cfg", {})
    missing = [key for key in ("input_size", "mean", "std") if key not in pretrained]
    if missing:
        raise UserError(f"'{folder / 'config.json'}' has no pretrained_cfg {', '.join(missing)}; export it again")
    channels, height, width = pretrained["input_size"]
    if height != width:
        raise UserError(
            f"'{folder}' takes {height}x{width} images; sslkit-embed resizes images to a square (its evaluation "
            f"transform), so it needs a model with a square input_size"
        )
    if len(pretrained["mean"]) != channels or len(pretrained["std"]) != channels:
        raise UserError(
            f"'{folder / 'config.json'}' takes {channels}-channel images but its pretrained_cfg has "
            f"{len(pretrained['mean'])} mean and {len(pretrained['std'])} std values; export it again"
        )
    import timm

    network = timm.create_model(f"local-dir:{folder}", pretrained=True)
    transform = Transform(width, channels, tuple(pretrained["mean"]), tuple(pretrained["std"]))
    return Encoder(network.eval(), transform, f"timm {config.get('architecture', '?')}", layer, "timm folder", None)
