"""A folder of unlabelled images of mixed sizes and modes, pretrained as a new user would: one process
(``sslkit-pretrain``'s ``main()`` in this process) and two (real processes, ranked as srun and torchrun rank them),
a labelled evaluation set or none, an exact two-process resume from a mid-epoch checkpoint (the loader
workers augmenting), and bad folders that give one line and write nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from dist_utils import run_as_ranks
from PIL import Image
from safetensors.torch import load_file
from test_pretrain_e2e import PRETRAIN, QUICKSTART, TINY, assert_one_line_error, env, pretrain_here

FOLDER = [
    "data.name=imagefolder",
    "augment.image_size=16",
    "augment.saturation=0.4",
    "augment.hue=0.1",
    "train.batch_size=32",
    "train.epochs=2",
    "eval.knn_k=5",
]


def write_unlabelled(root, count: int = 240) -> None:
    """``count`` images, 12-48 px on a side at any aspect, in every mode, at three depths, plus other files."""
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / ("holiday/day1" if i % 3 == 0 else "misc" if i % 3 == 1 else "")
        folder.mkdir(parents=True, exist_ok=True)
        height, width = (int(v) for v in rng.integers(12, 48, size=2))
        image = Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))
        mode = ("RGB", "L", "RGBA", "P", "CMYK")[i % 5]
        image.convert(mode).save(folder / f"{i:04d}.{'jpg' if mode in ('RGB', 'CMYK') else 'png'}")
    (root / "README.txt").write_text("photos")
    (root / "misc" / "Thumbs.db").write_bytes(b"\0" * 10)


def write_labelled(root) -> None:
    """``root/{train,test}/{red,blue}/``: 8 and 4 images a class, different sizes."""
    for split, count in (("train", 8), ("test", 4)):
        for name, colour in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (20 + i, 14 + 2 * i), colour).save(root / split / name / f"{i}.png")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_unlabelled(root / "photos")
    write_labelled(root / "labelled")
    return root


def _results(run) -> dict:
    return json.loads((run / "results.json").read_text())["results"]


@pytest.mark.slow
def test_an_unlabelled_folder_pretrains_with_and_without_an_evaluation_set(tmp_path, folders):
    photos, labelled = folders / "photos", folders / "labelled"
    straight = pretrain_here(
        tmp_path, "run.name=straight", *FOLDER, f"data.root={photos}", f"eval.data.root={labelled}"
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "knn_top1" in _results(tmp_path / "straight")["trained"]
    assert "kNN top-1" in straight.stdout  # the monitor ran after the first epoch

    # No evaluation set: a note, no kNN monitor or final evaluation, the backbone still exported.
    alone = pretrain_here(tmp_path, "run.name=alone", *FOLDER, f"data.root={photos}", "train.epochs=1")
    assert alone.returncode == 0, alone.stderr[-3000:]
    said = " ".join(alone.stdout.split())  # the console wraps long notes
    assert "has no labels and eval.data is not set" in said and "kNN top-1" not in said
    assert (tmp_path / "alone" / "backbone.safetensors").is_file() and _results(tmp_path / "alone") == {"trained": {}}


def two_processes(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, *PRETRAIN, str(QUICKSTART), f"run.output_dir={tmp_path}", *TINY, *overrides]
    return run_as_ranks(command, env=env(), cwd=tmp_path)


@pytest.mark.slow
def test_an_unlabelled_folder_in_two_processes_resumes_exactly(tmp_path, folders):
    common = [*FOLDER, f"data.root={folders / 'photos'}", f"eval.data.root={folders / 'labelled'}"]
    common += ["data.num_workers=1", "data.augment_in_workers=true"]
    common += ["train.checkpoint_every_steps=4", "train.keep_checkpoints=10"]
    result = two_processes(tmp_path, "run.name=two", *common)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 processes" in result.stdout
    steps = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == list(range(1, 15))  # 240 // 32 = 7 batches, 2 epochs
    assert "knn_top1" in _results(tmp_path / "two")["trained"]

    shutil.copytree(tmp_path / "two", tmp_path / "again")  # resumed from step 4, mid-epoch, in two processes
    for later in sorted((tmp_path / "again" / "checkpoints").glob("step-*"))[1:]:
        shutil.rmtree(later)
    (tmp_path / "again" / "backbone.safetensors").unlink()
    resumed = two_processes(tmp_path, "run.name=again", *common, "run.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 4" in resumed.stdout
    a, b = (load_file(tmp_path / name / "backbone.safetensors") for name in ("two", "again"))
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.slow
def test_bad_folders_are_one_line_and_write_nothing(tmp_path, folders):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    broken = tmp_path / "broken"
    shutil.copytree(folders / "photos" / "misc", broken)
    for path in sorted(broken.glob("*.png"))[:3]:  # 3 of 80 corrupt: more than 1%
        path.write_bytes(path.read_bytes()[:50])
    for root, words in (  # a missing root is the same kind of one-line check (tests/test_folders.py)
        (tmp_path / "empty", ["no images", "1 other files were ignored"]),
        (broken, ["more than 1%", "corrupt", ".png"]),
    ):
        result = pretrain_here(
            tmp_path, f"run.name=run-{root.name}", *FOLDER, f"data.root={root}", "train.batch_size=16"
        )
        assert_one_line_error(result, *words)
        assert not list((tmp_path / f"run-{root.name}").glob("checkpoints/step-*"))
    assert not (tmp_path / "run-empty").exists()  # the run directory was never made
