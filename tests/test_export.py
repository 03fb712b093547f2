"""sslkit-export on sslkit's ResNets: a width-64 ResNet is timm's ResNet (keys and outputs), every format is
checked by loading it back, and what cannot be exported is one line with nothing written.

The ViT exports are tested next to the ViT runs, in test_timm_backbones.py.
"""

from __future__ import annotations

import os
import stat

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sslkit import models
from sslkit.cli import export
from sslkit.config import load_config
from sslkit.loop import train
from sslkit.models import export as exports
from sslkit.models import weights

timm = pytest.importorskip("timm")

RUN = ["train.max_steps=1", "train.batch_size=32", "train.threads=1", "eval.linear_epochs=0"]
RUN += ["eval.compare_random_init=false", "eval.compare_raw_pixels=false", "model.projector_hidden=32"]


@pytest.fixture(scope="module")
def resnet_runs(tmp_path_factory):
    """One optimizer step of SimCLR on digits: a torchvision-stem ResNet-18 of width 64 (timm's ResNet-18
    exactly) and the quickstart's narrow CIFAR-stem one."""
    out = tmp_path_factory.mktemp("export")
    for name, model in [("wide", ["model.width=64", "model.cifar_stem=false"]), ("narrow", [])]:
        train(load_config("quickstart", [f"run.output_dir={out}", f"run.name={name}", *RUN, *model]))
    return out


def trained_backbone(run_dir):
    backbone = models.backbone_from_config(load_config(run_dir / "config.yaml").model, 1).eval()
    backbone.load_state_dict(load_file(run_dir / "backbone.safetensors"))
    return backbone


@pytest.mark.slow
def test_a_width_64_resnet_is_timms_resnet18_in_every_format(resnet_runs, tmp_path):
    ours, images = trained_backbone(resnet_runs / "wide"), torch.randn(3, 1, 16, 16)
    out, difference = export.export(resnet_runs / "wide", "timm", tmp_path / "timm")
    assert difference < exports.TOLERANCE
    theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    assert isinstance(theirs, timm.models.ResNet)
    out, _ = export.export(resnet_runs / "wide", "onnx", tmp_path / "wide.onnx")
    import onnxruntime

    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), ours(images), rtol=0, atol=0)
        onnx_features = torch.from_numpy(session.run(None, {"images": images.numpy()})[0])
        torch.testing.assert_close(onnx_features, ours(images), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_safetensors_export_keeps_torchvision_keys_and_says_what_it_holds(resnet_runs, tmp_path, capsys):
    assert export.main([str(resnet_runs / "narrow"), "--out", str(tmp_path / "b.safetensors")]) == 0
    assert "loaded back" in capsys.readouterr().out
    ours = trained_backbone(resnet_runs / "narrow")
    saved = load_file(tmp_path / "b.safetensors")
    assert saved.keys() == ours.state_dict().keys() and "layer4.1.conv2.weight" in saved
    with safe_open(tmp_path / "b.safetensors", "pt") as f:
        metadata = f.metadata()
    assert metadata["keys"] == "torchvision" and metadata["architecture"] == "resnet18"
    assert "width=16 cifar_stem=True" in metadata["sslkit.model"]
    # the default place: in the run directory
    assert export.main([str(resnet_runs / "narrow")]) == 0
    assert (resnet_runs / "narrow" / "export.safetensors").is_file()


@pytest.mark.slow
def test_a_narrow_resnet_to_timm_is_one_line_and_writes_nothing(resnet_runs, tmp_path, capsys):
    assert export.main([str(resnet_runs / "narrow"), "--format", "timm", "--out", str(tmp_path / "t")]) == 2
    line = capsys.readouterr().err.strip()
    assert "no timm counterpart" in line and "--format safetensors" in line and "\n" not in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_onnx_without_its_packages_is_one_line_and_writes_nothing(resnet_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(exports, "absent", lambda package: package == "onnxscript")
    assert export.main([str(resnet_runs / "narrow"), "--format", "onnx", "--out", str(tmp_path / "x.onnx")]) == 2
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
    wide = load_config("quickstart", ["model.width=64", "model.cifar_stem=false"]).model
    exports.write_timm(wide, models.backbone_from_config(wide, 1), tmp_path / "timm")
    assert mode(tmp_path / "timm" / "model.safetensors") == mode(tmp_path / "timm" / "config.json") == 0o644
