"""Weights in and out of files: backbone exports, a run's checkpointed weights, ``run.init_from``.

A run directory keeps its checkpoints in ``checkpoints/step-N/`` (each complete one holds
``progress.json``, written last); Accelerate's ``model.safetensors`` there holds the whole
method, whose ``backbone.`` entries are the encoder. An export (``backbone.safetensors``) holds
the encoder alone, with the keys of the library it came from (torchvision or timm).
Loading uses ``weights_only=True`` for ``.pt`` files: a state_dict of tensors, nothing else.

File modes: safetensors' ``save_file`` (from 0.8) writes through a temporary file, which the Rust
``tempfile`` crate creates with mode 0600, and renames it into place, so its files are readable by
their owner alone whatever the umask. sslkit writes its own ``.safetensors`` with Python's ``open``
(:func:`save_safetensors`), which gives them the mode of every other file of a run (0644 under a
umask of 022); one written by another library (timm's ``save_for_hf``, Accelerate's ``save_state``)
is given the mode of a file beside it (:func:`match_file_mode`).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from sslkit.errors import UserError
from sslkit.files import written_whole

PROGRESS_FILE = "progress.json"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step-*") if (p / PROGRESS_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def checkpoint_step(checkpoint: Path) -> int:
    """The training step a complete checkpoint directory was saved at (its ``progress.json``)."""
    return int(json.loads((Path(checkpoint) / PROGRESS_FILE).read_text())["step"])


def export_backbone(backbone: torch.nn.Module, path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Save the encoder as a plain state_dict (the keys of the library it came from) in safetensors, atomically,
    with ``metadata`` (text) in the file's header."""
    state = {k: v.detach().cpu().contiguous() for k, v in backbone.state_dict().items()}
    return save_safetensors(state, path, metadata)


def save_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> Path:
    """``state`` as a safetensors file at ``path``, atomically, with the mode ``open`` gives a new file.

    The bytes are serialised in memory (``safetensors.torch.save``) and written with ``open``: ``save_file``
    would leave the file at mode 0600 (see the module docstring). A backbone is small enough to hold twice.
    """
    path = Path(path)
    with written_whole(path) as tmp, open(tmp, "wb") as file:
        file.write(save(state, metadata=metadata))
    return path


def match_file_mode(path: Path, like: Path) -> None:
    """Give ``path`` the permission bits of ``like``, a file written with ``open`` beside it: for a
    ``.safetensors`` another library wrote with safetensors' ``save_file`` (mode 0600, see the module docstring)."""
    os.chmod(path, stat.S_IMODE(os.stat(like).st_mode))


def load_method_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The whole method's weights (backbone, heads, classifier) from a run directory's latest checkpoint or
    a checkpoint directory: Accelerate's ``model.safetensors``."""
    path = Path(path)
    found = [path] if (path / PROGRESS_FILE).is_file() else list_checkpoints(path)
    if not found or not (found[-1] / "model.safetensors").is_file():
        raise UserError(f"'{path}' holds no checkpoint with model.safetensors; give a run directory or a checkpoint")
    return load_file(str(found[-1] / "model.safetensors"))


def submodule_state(state: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """The entries of a method's ``state`` under submodule ``name`` (``backbone``, ``projector``), unprefixed."""
    prefix = name + "."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def run_directory_of(path: str | Path) -> Path | None:
    """The run directory (the folder with ``config.yaml``) of a run, a checkpoint in one, or a file in one."""
    path = Path(path)
    return next(
        (folder for folder in (path, path.parent, path.parent.parent) if (folder / "config.yaml").is_file()), None
    )


def backbone_file(folder: Path) -> Path:
    """The file a run or checkpoint directory's backbone is read from: the run's ``backbone.safetensors``, else
    the ``model.safetensors`` of the checkpoint (a run's latest one)."""
    if (folder / "backbone.safetensors").is_file():
        return folder / "backbone.safetensors"
    found = [folder] if (folder / PROGRESS_FILE).is_file() else list_checkpoints(folder)
    if not found:
        raise UserError(
            f"'{folder}' holds no backbone.safetensors and no checkpoint; "
            "give a run directory, a checkpoint or an exported backbone file"
        )
    path = found[-1] / "model.safetensors"
    if not path.is_file():
        raise UserError(
            f"checkpoint '{path.parent}' has no model.safetensors; it may be from an older sslkit or incomplete"
        )
    return path


def load_backbone_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Backbone weights from an export (``.safetensors`` or a weights-only ``.pt``), a checkpoint or a run directory.

    From a checkpoint directory, Accelerate's ``model.safetensors`` holds the whole method;
    its ``backbone.`` entries are returned with the prefix removed.
    """
    path = Path(path)
    if path.is_dir():
        path = backbone_file(path)
        state = load_file(str(path))
        return state if path.name == "backbone.safetensors" else submodule_state(state, "backbone")
    if not path.is_file():
        raise UserError(
            f"'{path}' not found; give a run directory, a checkpoint directory, or a .safetensors/.pt backbone file"
        )
    if path.suffix == ".safetensors":
        return load_file(str(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling refused or a corrupt file: the user's file, one line
        raise UserError(
            f"'{path}' could not be loaded as a weights-only state_dict ({type(error).__name__}); "
            "export it as safetensors or a plain state_dict"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"'{path}' is not a plain state_dict of tensors")
    return state


def state_differences(state: dict, own: dict) -> tuple[list[str], list[str], list[str]]:
    """Why ``state`` (a file's weights) would not load into a model whose state_dict is ``own``.

    Returns the keys whose shapes differ, the keys the model needs that ``state`` lacks, and the
    keys of ``state`` the model lacks, each in the model's (then the file's) order; all empty: it fits.
    """
    wrong_shape = [k for k, v in own.items() if k in state and tuple(state[k].shape) != tuple(v.shape)]
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    return wrong_shape, missing, extra


def init_backbone(backbone: torch.nn.Module, source: str | Path) -> list[str]:
    """Load a previous run's backbone into ``backbone`` (``run.init_from``); returns the keys it did not use.

    Missing keys (the new backbone expects weights the source lacks) or a shape that does not
    fit are the user's to fix (a different ``model.backbone`` / ``width`` / stem / ``kwargs``): one line.
    """
    if not Path(source).exists():  # name the key and where a relative path was looked for
        raise UserError(
            f"run.init_from '{source}' not found (a relative path starts from {Path.cwd()}, not from run.output_dir); "
            f"give an earlier run's directory, one of its checkpoints or a backbone file"
        )
    state = load_backbone_state(source)
    own = backbone.state_dict()
    wrong_shape, missing, unused = state_differences(state, own)
    if wrong_shape or missing:
        detail = (
            f"shape mismatch at {wrong_shape[0]} "
            f"({tuple(state[wrong_shape[0]].shape)} vs {tuple(own[wrong_shape[0]].shape)})"
            if wrong_shape
            else f"{len(missing)} weights missing, e.g. {missing[0]}"
        )
        raise UserError(
            f"run.init_from '{source}' does not fit this model.backbone / model.width / model.cifar_stem / "
            f"model.kwargs: {detail}; use the same model settings as the run it comes from"
        )
    backbone.load_state_dict({k: v for k, v in state.items() if k in own})
    return sorted(unused)
