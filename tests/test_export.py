"""sslkit-export: every format records the input it expects and where it came from, loads back (with sslkit, and
with timm, ONNX Runtime or safetensors alone) to the features the run's own evaluation transform and backbone
give, has a model card, and what cannot be exported is one line with nothing written.

The runs are one optimizer step of the quick start (a ResNet-18 of width 16 with the CIFAR stem, grey 8x8 digits
upsampled to 16), the same at width 64 without the CIFAR stem (timm's ResNet-18 exactly), and a tiny ViT.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import tomllib
import torch
import torch.nn.functional as F
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

from sslkit import models
from sslkit.augment import EvalTransform
from sslkit.cli import export
from sslkit.config import load_config
from sslkit.datasets import build_dataset
from sslkit.errors import UserError
from sslkit.evaluation.encoder import load_trained_backbone
from sslkit.loop import train
from sslkit.models import export as exports
from sslkit.models import weights

timm = pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parents[1]
RUN = ["train.max_steps=1", "train.batch_size=32", "train.threads=1", "eval.linear_epochs=0"]
RUN += ["eval.compare_random_init=false", "eval.compare_raw_pixels=false", "model.projector_hidden=32"]
VIT_KWARGS = "model.kwargs={img_size: 16, patch_size: 4, depth: 2, embed_dim: 32, num_heads: 2}"
MODELS = {
    "narrow": [],  # the quick start's own model
    "wide": ["model.width=64", "model.cifar_stem=false"],
    "vit": ["model.backbone=vit_tiny_patch16_224", VIT_KWARGS],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    for name, model in MODELS.items():
        train(load_config("quickstart", [f"run.output_dir={out}", f"run.name={name}", *RUN, *model]))
    return out


def digits() -> torch.Tensor:
    """Real images: the test split of the quick start's data, uint8 (360, 1, 8, 8)."""
    return build_dataset("digits", "test").images


def run_features(run_dir: Path, images: torch.Tensor) -> torch.Tensor:
    """What the run computes for ``images``: its evaluation transform (the training data's statistics), then its
    trained backbone."""
    cfg, _, backbone = load_trained_backbone(run_dir)
    info = build_dataset("digits", "train").info
    evaluation = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    with torch.no_grad():
        return backbone(evaluation(images))


def without_sslkit(out: Path, fmt: str, images: torch.Tensor) -> torch.Tensor:
    """The export loaded with its own library alone, preprocessed from what it records."""
    if fmt == "timm":
        model = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
        transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
        with torch.no_grad():
            return model(torch.stack([transform(image) for image in images / 255]))
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        meta = session.get_modelmeta().custom_metadata_map
    else:
        with safe_open(out, "pt") as file:
            meta, state = file.metadata(), {key: file.get_tensor(key) for key in file.keys()}
    size, mean, std = (json.loads(meta[f"input.{key}"]) for key in ("image_size", "mean", "std"))
    x = F.interpolate(images / 255, size=(size, size), mode="bilinear")
    x = (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    if fmt == "onnx":
        return torch.from_numpy(session.run(["features"], {"images": x.numpy()})[0])
    args = json.loads(meta["model_args"])
    if meta["keys"] == "timm":
        model = timm.create_model(meta["architecture"], **args)
    else:
        model = models.build_backbone(meta["architecture"], **args)
    model.load_state_dict(state)
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.slow
@pytest.mark.parametrize(
    "run, fmt",
    [("narrow", "safetensors"), ("narrow", "onnx"), ("vit", "safetensors"), ("vit", "timm"), ("vit", "onnx")],
)
def test_images_through_an_exports_recorded_preprocessing_give_the_runs_features(runs, tmp_path, run, fmt, capsys):
    out = tmp_path / {"safetensors": "x.safetensors", "timm": "x-timm", "onnx": "x.onnx"}[fmt]
    assert export.main([str(runs / run), "--format", fmt, "--out", str(out)]) == 0
    assert "loaded back: features within" in capsys.readouterr().out
    assert exports.card_path(out, fmt).is_file() and len(list(tmp_path.iterdir())) == (1 if fmt == "timm" else 2)
    images = digits()
    ours = run_features(runs / run, images)
    model, preprocess = exports.load_export(out)
    with torch.no_grad():
        torch.testing.assert_close(model(preprocess(images)), ours, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(without_sslkit(out, fmt, images), ours, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_timm_folder_preprocesses_with_the_runs_statistics_not_timms_defaults(runs, tmp_path):
    out, _ = export.export(runs / "vit", "timm", tmp_path / "timm")
    info = build_dataset("digits", "train").info
    model = timm.create_model(f"local-dir:{out}", pretrained=True)
    config = timm.data.resolve_data_config(model=model)
    assert config["input_size"] == (1, 16, 16) and config["interpolation"] == "bilinear"
    assert tuple(config["mean"]) == info.mean and tuple(config["std"]) == info.std
    assert (config["crop_pct"], config["crop_mode"]) == (1.0, "center")
    pretrained_cfg = json.loads((out / "config.json").read_text())["pretrained_cfg"]
    assert not {"tag", "hf_hub_id", "url", "license"} & set(pretrained_cfg)  # vit_tiny's ImageNet weights' own
    assert pretrained_cfg["first_conv"] == "patch_embed.proj"


@pytest.mark.slow
def test_every_export_records_its_input_its_source_and_has_a_model_card(runs, tmp_path):
    out, _ = export.export(runs / "narrow", "onnx", tmp_path / "q.onnx")
    import onnx

    metadata = {prop.key: prop.value for prop in onnx.load(str(out)).metadata_props}
    info = build_dataset("digits", "train").info
    assert exports.ExpectedInput.from_metadata(metadata) == exports.ExpectedInput(1, 16, info.mean, info.std)
    assert metadata["output.features"] == "128" and metadata["source.weights"] == "backbone.safetensors"
    assert metadata["source.step"] == "1" and metadata["source.run"] == str(runs / "narrow")
    assert metadata["source.recipe"] == (runs / "narrow" / "config.yaml").read_text()
    assert metadata["source.command"] == f"sslkit-export {runs / 'narrow'} --format onnx --out {out}"
    card = (tmp_path / "q.onnx.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "onnx" and {"sslkit", "simclr", "ntxent"} <= set(front["tags"])
    knn = json.loads((runs / "narrow" / "results.json").read_text())["results"]["trained"]["knn_top1"]
    assert f"| knn_top1 | {knn:.4f} |" in card and metadata["source.command"] in card
    assert f"mean {info.mean[0]:.4f}, std {info.std[0]:.4f}" in card and 'load_export("q.onnx")' in card
    # A checkpoint: its own step and file; the model card inside a timm folder
    checkpoint = weights.list_checkpoints(runs / "wide")[-1]
    out, _ = export.export(checkpoint, "timm", tmp_path / "t")
    metadata = json.loads((out / "config.json").read_text())["sslkit"]
    assert metadata["source.weights"] == f"checkpoints/{checkpoint.name}/model.safetensors"
    assert metadata["source.step"] == "1" and (out / "README.md").read_text().startswith("---\nlibrary_name: timm")


@pytest.mark.slow
def test_a_width_64_resnet_is_timms_resnet18(runs, tmp_path):
    ours = load_trained_backbone(runs / "wide")[2]
    out, difference = export.export(runs / "wide", "timm", tmp_path / "timm")
    assert difference < exports.TOLERANCE
    theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    assert isinstance(theirs, timm.models.ResNet)
    images = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), ours(images), rtol=0, atol=0)


@pytest.mark.slow
def test_safetensors_export_keeps_torchvision_keys_and_says_what_it_holds(runs, capsys):
    assert export.main([str(runs / "narrow")]) == 0  # the default place: in the run directory
    out = runs / "narrow" / "export.safetensors"
    assert f"written to {out}, model card {out}.md (loaded back" in capsys.readouterr().out
    ours = load_file(runs / "narrow" / "backbone.safetensors")
    saved = load_file(out)
    assert saved.keys() == ours.keys() and all(torch.equal(saved[key], ours[key]) for key in ours)
    with safe_open(out, "pt") as f:
        metadata = f.metadata()
    assert metadata["keys"] == "torchvision" and metadata["architecture"] == "resnet18"
    assert json.loads(metadata["model_args"]) == {"width": 16, "cifar_stem": True, "in_channels": 1}
    assert "width=16 cifar_stem=True" in metadata["sslkit.model"]


@pytest.mark.slow
def test_without_onnxruntime_the_export_says_in_one_line_it_was_not_checked(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(exports, "absent", lambda package: package == "onnxruntime")
    assert export.main([str(runs / "narrow"), "--format", "onnx", "--out", str(tmp_path / "x.onnx")]) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "not checked: onnxruntime is not installed" in line and "sslkit[onnx]" in line, line
    assert (tmp_path / "x.onnx").is_file()


@pytest.mark.slow
def test_a_narrow_resnet_to_timm_is_one_line_and_writes_nothing(runs, tmp_path, capsys):
    assert export.main([str(runs / "narrow"), "--format", "timm", "--out", str(tmp_path / "t")]) == 2
    line = capsys.readouterr().err.strip()
    assert "no timm counterpart" in line and "--format safetensors" in line and "\n" not in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_onnx_without_its_packages_is_one_line_and_writes_nothing(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(exports, "absent", lambda package: package == "onnxscript")
    assert export.main([str(runs / "narrow"), "--format", "onnx", "--out", str(tmp_path / "x.onnx")]) == 2
    line = capsys.readouterr().err.strip()
    assert "needs the onnxscript package" in line and 'pip install "sslkit[onnx]"' in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "target, words",
    [("missing", ["'", "not found", "runs/<name>"]), ("plain", ["not a run or checkpoint directory"])],
)
def test_exporting_what_is_not_a_run_is_one_line(tmp_path, capsys, target, words):
    (tmp_path / "plain").mkdir()
    assert export.main([str(tmp_path / target)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and all(word in line for word in words), line


# --------------------------------------------------------------------------- without a run


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("side", [8, 16, 40])  # upsampled, as it is, shrunk
def test_the_recorded_preprocessing_is_the_runs_evaluation_transform_value_for_value(side, normalize):
    images = digits()[:64]
    if side != 8:  # other sizes of the same images: nearest-neighbour copies, still uint8
        images = F.interpolate(images, size=(side, side), mode="nearest")
    info = build_dataset("digits", "train").info
    expected = exports.ExpectedInput(1, 16, info.mean, info.std, normalize)
    evaluation = EvalTransform(16, 1, info.mean, info.std, normalize)
    assert torch.equal(exports.Preprocess(expected)(images), evaluation(images))
    assert torch.equal(exports.Preprocess(expected)(images / 255), evaluation(images))  # floats in [0, 1]


def test_a_wide_image_is_cut_to_its_central_square_as_evaluation_cuts_images_of_their_own_sizes():
    image = torch.zeros(1, 1, 16, 24, dtype=torch.uint8)
    image[..., 4:20] = 255  # the central 16 columns
    expected = exports.ExpectedInput(1, 16, (0.0,), (1.0,))
    assert torch.equal(exports.Preprocess(expected)(image), torch.ones(1, 1, 16, 16))


def test_the_onnx_extra_brings_the_runtime_that_checks_the_export():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("onnxruntime") for requirement in extras["onnx"])


def test_the_commands_formats_are_the_librarys():
    assert export.FORMATS == exports.FORMATS


def test_loading_what_is_not_an_export_or_an_export_without_its_input_is_one_line(tmp_path):
    with pytest.raises(UserError, match="is not an export"):
        exports.load_export(tmp_path)
    backbone = models.backbone_from_config(load_config("quickstart").model, 1)
    weights.export_backbone(backbone, tmp_path / "backbone.safetensors")  # a run's file: weights alone
    with pytest.raises(UserError, match="does not record the input it expects"):
        exports.load_export(tmp_path / "backbone.safetensors")


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_safetensors_files_get_the_mode_of_every_other_file_of_a_run(tmp_path, umask_022):
    """safetensors' save_file leaves its files at 0600 (a temporary file renamed into place); sslkit's are 0644
    under a umask of 022, as a file written with open() beside them, and so is the timm folder's weights file."""
    (tmp_path / "config.yaml").write_text("run: {}\n")
    backbone = models.backbone_from_config(load_config("quickstart").model, 1)
    weights.export_backbone(backbone, tmp_path / "backbone.safetensors", {"keys": "torchvision"})
    assert mode(tmp_path / "backbone.safetensors") == mode(tmp_path / "config.yaml") == 0o644
    assert torch.equal(load_file(tmp_path / "backbone.safetensors")["conv1.weight"], backbone.conv1.weight)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["backbone.safetensors", "config.yaml"]  # no .tmp
    wide = load_config("quickstart", MODELS["wide"]).model
    backbone = models.backbone_from_config(wide, 1)
    source = dict.fromkeys(["run", "weights", "step", "name", "method", "loss", "data", "command", "sslkit"], "x")
    metadata = exports.export_metadata(wide, backbone, exports.ExpectedInput(1, 16, (0.3,), (0.4,)), source)
    exports.write_timm(wide, backbone, tmp_path / "timm", metadata)
    assert mode(tmp_path / "timm" / "model.safetensors") == mode(tmp_path / "timm" / "config.json") == 0o644
