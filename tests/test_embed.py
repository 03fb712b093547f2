"""sslkit-embed in one process: the features a folder holds are the encoder's (backbone and projection head),
from a run, a backbone file and a timm folder, on a bundled dataset, an image folder without classes and tar
shards; bad input gives one line and writes nothing.

The run is one step of the quickstart at a CPU-sized width (a few seconds); the tests that start real
processes (two of them, a kill -9, a disk that fills during the run) are in test_embed_e2e.py.
"""

from __future__ import annotations

import gc
import json
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

from sslkit import methods, models
from sslkit.augment import EvalTransform
from sslkit.cli import embed as embed_command
from sslkit.cli.write_shards import write_shards
from sslkit.config import load_config, save_config
from sslkit.datasets import build_dataset
from sslkit.embeddings import embed, embed_to_folder, read_embeddings
from sslkit.embeddings.encoders import load_encoder
from sslkit.errors import UserError
from sslkit.loop import train
from sslkit.models import weights

TINY = [
    "model.width=4",
    "model.projector_hidden=32",
    "model.projector_out=16",
    "augment.image_size=8",
    "train.batch_size=64",
    "train.max_steps=1",
    "train.threads=1",
    "eval.linear_epochs=0",
    "eval.compare_random_init=false",
    "eval.compare_raw_pixels=false",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A SimCLR run on digits (grey 8x8), one optimizer step: its config.yaml, backbone and checkpoint."""
    out = tmp_path_factory.mktemp("runs")
    train(load_config("quickstart", [f"run.output_dir={out}", "run.name=digits", *TINY]))
    return out / "digits"


def write_photos(root, count: int = 7) -> list[str]:
    """``count`` RGB images of different sizes, at three depths, without class folders; their relative paths."""
    rng = np.random.default_rng(0)
    names = []
    for i in range(count):
        name = ("", "trip/", "trip/day2/")[i % 3] + f"{i}.png"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(10 + i, 14, 3), dtype=np.uint8)).save(root / name)
        names.append(name)
    return names


@pytest.fixture(scope="module")
def rgb_backbone(tmp_path_factory):
    """A backbone file for RGB images (as it is before training: a recipe's network, exported) and its recipe."""
    root = tmp_path_factory.mktemp("rgb")
    cfg = load_config("quickstart", ["data.name=imagefolder", f"data.root={root / 'photos'}", *TINY])
    write_photos(root / "photos")
    save_config(cfg, root / "recipe.yaml")
    torch.manual_seed(0)
    backbone = models.backbone_from_config(cfg.model, 3)
    weights.export_backbone(backbone, root / "backbone.safetensors")
    return root


def digits_features(run, split: str = "test") -> torch.Tensor:
    """The run's backbone on the digits split through its evaluation transform, by hand: what the encoder sees."""
    cfg = load_config(run / "config.yaml")
    backbone = models.backbone_from_config(cfg.model, 1).eval()
    backbone.load_state_dict(load_file(run / "backbone.safetensors"))
    data = build_dataset("digits", split)
    transform = EvalTransform(cfg.augment.image_size, 1, data.info.mean, data.info.std)
    with torch.no_grad():
        return backbone(transform(data.images))


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_the_folder_holds_the_encoders_features_and_the_function_returns_them(run, tmp_path):
    folder, report = embed_to_folder(run, tmp_path / "e", split="test", batch_size=10)
    read = read_embeddings(folder)
    expected = F.normalize(digits_features(run), dim=1)
    np.testing.assert_allclose(read.vectors, expected.numpy(), atol=1e-5)
    assert torch.equal(embed(run, split="test", batch_size=10), torch.from_numpy(np.array(read.vectors)))
    assert read.items == [str(i) for i in range(360)]
    assert read.labels.tolist() == build_dataset("digits", "test").labels.tolist()
    meta = read.meta
    assert meta["count"] == 360 and meta["dimension"] == 32 and meta["normalized"] and meta["layer"] == "backbone"
    assert meta["transform"]["image_size"] == 8 and meta["transform"]["channels"] == 1
    classes = [str(k) for k in range(10)]  # the names of the labels, which sslkit-map shows
    assert meta["data"] == {"name": "digits", "split": "test", "root": None, "labelled": True, "classes": classes}
    assert meta["chunks_done"] == [0, 1, 2] and report["rows"] == 360  # 160-row chunks: 16 batches of 10


def test_float16_without_normalizing_is_the_raw_features_halved(run, tmp_path):
    folder, _ = embed_to_folder(run, tmp_path / "e", split="test", dtype="float16", normalize=False)
    read = read_embeddings(folder)
    assert read.vectors.dtype == np.float16 and not read.normalized
    np.testing.assert_allclose(read.vectors.astype(np.float32), digits_features(run).numpy(), rtol=2e-3, atol=2e-3)


def test_the_projector_layer_is_the_methods_head_on_the_backbone(run):
    cfg = load_config(run / "config.yaml")
    method = methods.build_method(cfg, models.backbone_from_config(cfg.model, 1), 10).eval()
    method.load_state_dict(weights.load_method_state(run))  # the whole checkpoint, strictly
    data = build_dataset("digits", "test")
    with torch.no_grad():
        expected = method.projector(method.backbone(EvalTransform(8, 1, data.info.mean, data.info.std)(data.images)))
    got = embed(run, split="test", layer="projector", normalize=False)
    assert got.shape == (360, 16)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_an_image_folder_without_classes_and_its_shards_give_the_same_rows(rgb_backbone, tmp_path):
    source, recipe = rgb_backbone / "backbone.safetensors", rgb_backbone / "recipe.yaml"
    photos = rgb_backbone / "photos"
    folder, _ = embed_to_folder(source, data=str(photos), recipe=recipe)
    assert folder == rgb_backbone / "embeddings-photos-train"  # beside the backbone file
    read = read_embeddings(folder)
    assert read.labels is None  # listed as os.walk finds them: a folder's own files first, then its folders
    assert read.items == ["0.png", "3.png", "6.png", "trip/1.png", "trip/4.png", "trip/day2/2.png", "trip/day2/5.png"]
    write_shards(photos, str(tmp_path / "shards" / "train-%06d.tar"), per_shard=3)
    shards = embed(source, data=str(tmp_path / "shards"), recipe=recipe)
    np.testing.assert_allclose(shards.numpy(), read.vectors, atol=1e-5)


def test_a_timm_folder_takes_its_input_from_its_pretrained_cfg(tmp_path):
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    model = timm.create_model("test_resnet", pretrained=False, num_classes=0, in_chans=1).eval()
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (1, 12, 12), "mean": (0.3,), "std": (0.2,)}
    save_for_hf(model, str(tmp_path / "timm"), model_args={"num_classes": 0, "in_chans": 1}, safe_serialization=True)
    data = build_dataset("digits", "test")
    with torch.no_grad():
        expected = model(EvalTransform(12, 1, (0.3,), (0.2,))(data.images[:40]))
    got = embed(tmp_path / "timm", data="digits", split="test", normalize=False)
    torch.testing.assert_close(got[:40], expected, atol=1e-4, rtol=1e-4)


def test_the_same_command_again_does_nothing_and_another_is_refused(run, tmp_path, capsys):
    out = str(tmp_path / "e")
    assert embed_command.main([str(run), "--split", "test", "--out", out]) == 0
    assert embed_command.main([str(run), "--split", "test", "--out", out]) == 0
    assert "already holds the 360 x 32 float32 embeddings of digits test" in capsys.readouterr().out
    assert embed_command.main([str(run), "--split", "test", "--out", out, "--layer", "projector"]) == 2
    line = one_line(capsys)
    assert 'layer: "backbone" there, "projector" here' in line and "--overwrite" in line
    assert embed_command.main([str(run), "--split", "test", "--out", out, "--layer", "projector", "--overwrite"]) == 0
    assert read_embeddings(out).meta["dimension"] == 16


def test_a_grey_encoder_reads_rgb_images_as_their_luma(run, rgb_backbone, tmp_path, capsys):
    """The digits encoder (one channel) on a folder of RGB photos: each photo as PIL's convert("L") makes it,
    which a folder of those grey files (decoded as RGB, then back) gives to the bit."""
    photos, grey = rgb_backbone / "photos", tmp_path / "grey"
    for path in photos.rglob("*.png"):
        (grey / path.relative_to(photos)).parent.mkdir(parents=True, exist_ok=True)
        Image.open(path).convert("L").save(grey / path.relative_to(photos))
    out = tmp_path / "e"
    assert embed_command.main([str(run), "--data", str(photos), "--out", str(out), "--no-normalize"]) == 0
    assert "the 3-channel ones were read as grey (ITU-R BT.601 luma)" in capsys.readouterr().out
    read = read_embeddings(out)
    assert read.meta["transform"]["channels"] == 1 and read.meta["transform"]["converted_from_channels"] == 3
    assert torch.equal(torch.from_numpy(np.array(read.vectors)), embed(run, data=str(grey), normalize=False))


def test_an_rgb_encoder_reads_grey_images_as_the_grey_channel_three_times(rgb_backbone):
    source, recipe = rgb_backbone / "backbone.safetensors", rgb_backbone / "recipe.yaml"
    encoder = load_encoder(source, load_config(recipe), "backbone")
    digits = build_dataset("digits", "test").images  # (360, 1, 8, 8)
    with torch.no_grad():
        expected = encoder.network(encoder.transform.module()(digits.expand(-1, 3, -1, -1)))
    torch.testing.assert_close(embed(source, data="digits", split="test", recipe=recipe, normalize=False), expected)


@pytest.mark.parametrize(
    "case",
    ["not a source", "projector of a backbone file", "a timm folder, no data",
     "unknown data", "a folder of other files", "no batch"],
)  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(case, run, rgb_backbone, tmp_path, capsys):
    photos = rgb_backbone / "photos"
    out = tmp_path / "out"
    args, words = {
        "not a source": ([str(photos)], ["is not a run directory", "a timm folder"]),
        "projector of a backbone file": (
            [str(run / "backbone.safetensors"), "--layer", "projector"], ["does not hold", "--layer backbone"]
        ),
        "a timm folder, no data": ([str(_timm_folder(tmp_path))], ["timm folder", "give --data"]),
        "unknown data": ([str(run), "--data", "nosuch"], ["'nosuch' is not found", "fashion_mnist"]),
        "a folder of other files": ([str(run), "--out", str(photos)], ["holds other files", "new or empty folder"]),
        "no batch": ([str(run), "--batch-size", "0"], ["--batch-size must be at least 1, got 0"]),
    }[case]  # fmt: skip
    before = sorted(p.name for p in run.iterdir())
    assert embed_command.main([*args, "--out", str(out)] if "--out" not in args else args) == 2
    line = one_line(capsys)
    assert all(word in line for word in words), line
    assert not out.exists() and sorted(p.name for p in run.iterdir()) == before


def _timm_folder(tmp_path):
    """A folder that looks like a timm export (config.json + model.safetensors)."""
    folder = tmp_path / "timm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "resnet18"}))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.fixture
def small_filesystem(tmp_path):
    """A 1 MiB tmpfs, where this machine lets the tests mount one."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        gc.collect()
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def test_embeddings_larger_than_the_disk_are_one_line_before_any_image_is_encoded(run, small_filesystem):
    with pytest.raises(UserError) as raised:  # 10,000 x 32 float32: 1.28 MB on a 1 MiB disk
        embed_to_folder(run, small_filesystem / "e", data="fashion_mnist", split="test")
    message = str(raised.value)
    assert "no room for 10000 x 32 float32 embeddings (1.3 MB)" in message and "--dtype float16" in message
    assert list(small_filesystem.iterdir()) == []
    folder, _ = embed_to_folder(run, small_filesystem / "e", data="fashion_mnist", split="test", dtype="float16")
    assert read_embeddings(folder).vectors.shape == (10000, 32)


def test_a_folder_whose_images_changed_is_not_continued(rgb_backbone, tmp_path):
    photos, source, recipe = tmp_path / "photos", rgb_backbone / "backbone.safetensors", rgb_backbone / "recipe.yaml"
    write_photos(photos)
    embed_to_folder(source, tmp_path / "e", data=str(photos), recipe=recipe)
    (photos / "3.png").rename(photos / "3b.png")  # as many images, one of them another
    with pytest.raises(UserError, match="holds the embeddings of another command \\(items_sha256 differs\\)"):
        embed_to_folder(source, tmp_path / "e", data=str(photos), recipe=recipe)
