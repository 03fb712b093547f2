"""A trained backbone written where users take their weights, carrying the input it expects: safetensors, a timm
model folder, or ONNX, each with a model card, and each loaded back to check it.

Formats:
    safetensors  the backbone's plain ``state_dict`` as the backbone came (torchvision keys for
                 sslkit's ResNets, timm's keys for timm models); the file's metadata holds the
                 architecture, the arguments that rebuild it, the input and the run it came from.
    timm         a folder in timm's Hugging Face layout (``config.json`` + ``model.safetensors``):
                 ``timm.create_model("local-dir:FOLDER", pretrained=True)`` rebuilds the network
                 with its arguments (``img_size``, ``patch_size``, ``in_chans``, ...) and weights, and
                 its ``pretrained_cfg`` is the run's input (size, mean, std, resize), so
                 ``timm.data.resolve_data_config`` and ``create_transform`` preprocess as the run did.
                 sslkit's ResNets of width 64 without the CIFAR stem are timm's ResNets exactly;
                 other widths and stems have no timm counterpart.
    onnx         the network in inference mode, input ``images`` (N, C, S, S) float with a dynamic
                 batch, output ``features`` (N, D); opset :data:`ONNX_OPSET`, written by torch's
                 dynamo-based exporter (needs the ``onnx`` and ``onnxscript`` packages); the
                 metadata in the model's ``metadata_props``.

Every export records the same text key/values (:func:`export_metadata`): ``input.*`` (channels,
size, mean, std, whether to normalise, resize and crop; :class:`ExpectedInput`), ``output.features``,
``source.*`` (run, weights, step, recipe) and how to rebuild the network (``architecture``,
``model_args``, ``keys``). A model card (:mod:`sslkit.models.model_card`) goes with it: ``README.md``
in a timm folder, ``<file>.md`` beside a file.

:func:`load_export` loads any of the three back as ``(model, preprocess)``; :func:`write_export`
writes one and checks that random images through the export's own preprocessing and network give
the trained network's features on the run's evaluation transform; one that does not is deleted,
not left behind. The functions take the backbone and the recipe's ``model`` section; reading a run
is :mod:`sslkit.evaluation.encoder`'s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from sslkit.errors import UserError
from sslkit.files import written_whole
from sslkit.models import backbones, weights
from sslkit.models.expected_input import ExpectedInput, Preprocess
from sslkit.models.model_card import model_card

FORMATS = ("safetensors", "timm", "onnx")
# The lowest opset torch's dynamo-based exporter writes; onnxruntime runs it from version 1.14.
ONNX_OPSET = 18
# An export reproduces the network when its features differ by less than this (float32 kernels
# of another runtime reorder sums: differences of 1e-6 relative are expected, 1e-3 are not).
TOLERANCE = 1e-4
CARD_SUFFIX = ".md"


def default_out(run_dir: Path, fmt: str) -> Path:
    """Where an export goes unless told: in the run directory."""
    return run_dir / {"safetensors": "export.safetensors", "timm": "export-timm", "onnx": "export.onnx"}[fmt]


def card_path(out: Path, fmt: str) -> Path:
    """Where an export's model card goes: ``README.md`` in a timm folder, ``<file>.md`` beside a file."""
    return out / "README.md" if fmt == "timm" else out.with_name(out.name + CARD_SUFFIX)


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


def export_metadata(model_cfg, backbone, expected: ExpectedInput, source: dict[str, str]) -> dict[str, str]:
    """Everything an export records, as text: how to rebuild the network (``keys``: whose ``state_dict`` keys,
    ``architecture`` and ``model_args``: ``timm.create_model``'s, or :func:`sslkit.models.build_backbone`'s
    for torchvision keys), its input (``input.*``), its output and ``source.*`` (where it came from)."""
    name = backbones.timm_name(model_cfg.backbone)
    if name is None:
        args = {"width": model_cfg.width, "cifar_stem": model_cfg.cifar_stem, "in_channels": backbone.in_channels}
    else:
        args = {"num_classes": 0, "in_chans": backbone.in_channels, **model_cfg.kwargs}
    return {
        "sslkit.model": backbones.describe(model_cfg),
        "keys": "timm" if name else "torchvision",
        "architecture": name or model_cfg.backbone,
        "model_args": json.dumps(args),
        **expected.to_metadata(),
        "output.features": str(backbone.feature_dim),
        **{f"source.{key}": value for key, value in source.items()},
    }


def write_safetensors(model_cfg, backbone, path: Path, metadata: dict[str, str]) -> None:
    """The ``state_dict`` with ``metadata`` in the file's header."""
    weights.export_backbone(backbone, path, metadata)


def write_timm(model_cfg, backbone, folder: Path, metadata: dict[str, str]) -> None:
    """timm's folder; its ``pretrained_cfg`` is the run's input alone (not the default of timm's architecture,
    whose mean, std and pretrained tag describe other weights), sslkit's metadata under ``"sslkit"``."""
    import timm
    from timm.models import save_for_hf

    name, args = timm_model_args(model_cfg, backbone)
    # The architecture's own layer names (first_conv, classifier) are kept; its data and provenance are not.
    default = timm.models.get_pretrained_cfg(name)
    layers = {"first_conv": default.first_conv, "classifier": default.classifier} if default is not None else {}
    pretrained_cfg = {"architecture": name, **layers, **ExpectedInput.from_metadata(metadata).timm_data_config()}
    model = timm.create_model(name, pretrained=False, pretrained_cfg=pretrained_cfg, **args)
    model.load_state_dict(backbone.state_dict())
    save_for_hf(model, str(folder), model_args=args, model_config={"sslkit": metadata}, safe_serialization=True)
    weights.match_file_mode(folder / "model.safetensors", folder / "config.json")


def write_onnx(model_cfg, backbone, path: Path, metadata: dict[str, str]) -> None:
    """The network traced by torch's dynamo-based exporter, with ``metadata`` as the model's ``metadata_props``."""
    missing = [package for package in ("onnx", "onnxscript") if absent(package)]
    if missing:
        raise UserError(
            f"--format onnx needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}, which is not "
            f'installed: pip install "sslkit[onnx]" (or pip install {" ".join(missing)})'
        )
    import onnx

    size = json.loads(metadata["input.image_size"])
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
    graph = onnx.load(str(path))
    onnx.helper.set_model_props(graph, metadata)
    onnx.save(graph, str(path))


_WRITERS = {"safetensors": write_safetensors, "timm": write_timm, "onnx": write_onnx}


def export_format(path: Path) -> str:
    """Which format the export at ``path`` is: a folder is timm's, a file its suffix."""
    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file():
        return "timm"
    if path.is_file() and path.suffix in (".safetensors", ".onnx"):
        return path.suffix[1:]
    raise UserError(f"'{path}' is not an export; give a .safetensors or .onnx file or a timm folder (config.json)")


def read_metadata(path: Path, fmt: str) -> dict[str, str]:
    """The text key/values the ``fmt`` export at ``path`` records (:func:`export_metadata`)."""
    if fmt == "safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as file:
            metadata = file.metadata() or {}
    elif fmt == "timm":
        metadata = json.loads((path / "config.json").read_text()).get("sslkit", {})
    else:
        metadata = dict(_onnx_session(path).get_modelmeta().custom_metadata_map)
    if "input.image_size" not in metadata:
        raise UserError(f"'{path}' does not record the input it expects (an older export); export the run again")
    return metadata


class OnnxFeatures:
    """An ONNX export run by ONNX Runtime, called like the network: float images (N, C, S, S) -> features (N, D)."""

    def __init__(self, path: Path) -> None:
        self.session = _onnx_session(path)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        features = self.session.run(["features"], {"images": images.detach().cpu().numpy()})[0]
        return torch.from_numpy(features)


def load_export(path: str | Path) -> tuple[Callable[[torch.Tensor], torch.Tensor], Preprocess]:
    """An export loaded back with the preprocessing it records: ``model(preprocess(images))`` gives the
    features the run's own evaluation transform and backbone give (images of one size; any format).

    Returns:
        the network in eval mode on the CPU (a torch module; ONNX: :class:`OnnxFeatures`), and its
        :class:`Preprocess` (uint8 or [0, 1] float images (N, C, H, W) -> (N, C, S, S)).
    """
    path = Path(path)
    return _load(path, export_format(path))


def _load(path: Path, fmt: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], Preprocess]:
    metadata = read_metadata(path, fmt)
    preprocess = Preprocess(ExpectedInput.from_metadata(metadata))
    if fmt == "onnx":
        return OnnxFeatures(path), preprocess
    if fmt == "timm":
        import timm

        return timm.create_model(f"local-dir:{path}", pretrained=True).eval(), preprocess
    args = json.loads(metadata["model_args"])
    if metadata["keys"] == "timm":
        import timm

        model = timm.create_model(metadata["architecture"], pretrained=False, **args)
    else:
        model = backbones.build_backbone(metadata["architecture"], **args)
    model.load_state_dict(load_file(str(path)))
    return model.eval(), preprocess


def verify(
    path: Path, fmt: str, reference: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor
) -> float | None:
    """The largest difference between the features of ``images`` through the ``fmt`` export at ``path`` (its
    own preprocessing and network) and through ``reference`` (the run's); None where no runtime is installed."""
    if fmt == "onnx" and absent("onnxruntime"):
        return None
    model, preprocess = _load(path, fmt)
    with torch.no_grad():
        return float((model(preprocess(images)) - reference(images)).abs().max())


def write_export(
    model_cfg,
    backbone,
    fmt: str,
    out: Path,
    metadata: dict[str, str],
    summary: dict | None,
    reference: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
) -> float | None:
    """Write ``backbone`` as ``fmt`` at ``out`` with ``metadata`` and its model card (``summary``: the run's
    results.json, or None), and check it: ``images`` through the export give ``reference``'s features
    (:func:`verify`). Returns the largest difference (None: not checked, no runtime). Nothing is left behind
    when it fails."""
    if not out.parent.is_dir():
        raise UserError(f"--out '{out}': the folder '{out.parent}' does not exist; create it or give another path")
    if fmt == "timm":
        timm_model_args(model_cfg, backbone)  # its one line before anything is written
    with contextlib.ExitStack() as stack:
        # A folder's card is inside it; a file's is written beside it, and put in place after it.
        tmp_card = None if fmt == "timm" else stack.enter_context(written_whole(card_path(out, fmt)))
        tmp = stack.enter_context(written_whole(out))
        tmp_card = tmp_card or card_path(tmp, fmt)
        _WRITERS[fmt](model_cfg, backbone, tmp, metadata)
        tmp_card.write_text(model_card(fmt, metadata, summary, out.name))
        difference = verify(tmp, fmt, reference, images)
        if difference is not None and not difference < TOLERANCE:
            raise RuntimeError(f"the {fmt} export differs from the trained network by {difference:.3g}")
    return difference


def absent(package: str) -> bool:
    """Whether ``package`` is not installed (found without importing it)."""
    return importlib.util.find_spec(package) is None


def _onnx_session(path: Path):
    if absent("onnxruntime"):
        raise UserError(f"'{path}' is an ONNX model: loading it needs onnxruntime (pip install \"sslkit[onnx]\")")
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
