"""Tar shards written by ``sslkit-write-shards`` and streamed by webdataset: every sample once an
epoch in two real processes with two loader workers each, an exact mid-epoch resume (of the batches, and
of the views when the readers augment), and shard patterns that match nothing as one line.

Each image is a flat colour that encodes its index (red = i mod 256, green = i div 256), so the
batches say which samples they hold.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sslkit.cli.write_shards import main as write_shards
from sslkit.datasets import build_dataset, shards
from sslkit.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

SHARDS, PER_SHARD = 8, 24


def indices_of(images) -> list[int]:
    """The sample index each image of a batch encodes in its top-left pixel."""
    pixels = images.pixels[:, :, 0, 0].long()  # (B, 3)
    return (pixels[:, 0] + 256 * pixels[:, 1]).tolist()


@pytest.fixture(scope="module")
def pattern(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("shards")
    for i in range(SHARDS * PER_SHARD):
        size = (6 + i % 5, 9 - i % 4)  # different sizes in every batch
        folder = root / "images" / f"part{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, (i % 256, i // 256, 7)).save(folder / f"{i:04d}.png")
    assert write_shards([str(root / "images"), str(root / "out" / "train-%06d.tar"), "--per-shard", "24"]) == 0
    return str(root / "out" / "train-{000000..000007}.tar")


def test_the_tool_writes_every_image_once_and_patterns_name_the_shards(pattern):
    stream = build_dataset("webdataset", root=pattern)
    assert stream.counts == [PER_SHARD] * SHARDS and len(stream) == SHARDS * PER_SHARD
    folder = str(Path(pattern).parent)
    assert shards.expand_shards(folder) == stream.shards
    two = f"{stream.shards[0]}::{stream.shards[1]}"
    assert shards.shard_stream(two).counts == [PER_SHARD] * 2
    with tarfile.open(stream.shards[0]) as tar:
        assert sorted(tar.getnames())[:2] == ["000000.path", "000000.png"]


def test_writing_shards_of_unequal_size_warns_with_sizes_that_divide_evenly(tmp_path, capsys):
    for i in range(12):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(tmp_path / f"{i:02d}.png")
    assert write_shards([str(tmp_path), str(tmp_path / "out" / "s-%06d.tar"), "--per-shard", "5"]) == 0
    out = capsys.readouterr().out
    assert "warning: the last shard holds 2 of 5 images" in out and "--per-shard 4 or 6" in out
    assert write_shards([str(tmp_path), str(tmp_path / "even" / "s-%06d.tar"), "--per-shard", "4"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_patterns_that_match_nothing_are_one_line(tmp_path, pattern):
    for root, words in (
        (str(tmp_path / "none-{0..3}.tar"), "no shard matches"),
        (pattern.replace("000007", "000009"), "2 of the 10 shards"),
        (None, "webdataset needs data.root"),
    ):
        with pytest.raises(UserError, match=words) as error:
            build_dataset("webdataset", root=root)
        assert "\n" not in str(error.value)
    (tmp_path / "bad.tar").write_bytes(b"not a tar file" * 100)
    with pytest.raises(UserError, match="cannot read shard .*bad.tar"):
        build_dataset("webdataset", root=str(tmp_path / "bad.tar"))
    stream = build_dataset("webdataset", root=pattern)
    with pytest.raises(UserError, match="cannot give each of the 4 readers"):
        stream.configure(batch_size=64, rank=0, world=2, workers=2, seed=0)


def _epoch(stream, epoch: int, skip: int = 0) -> list[list[int]]:
    loader = shards.StreamLoader(stream, num_workers=2, device=torch.device("cpu"))
    return [indices_of(images) for images, _ in loader.epoch(epoch, skip)]


def test_one_process_two_workers_reads_every_sample_once_and_resumes_exactly(pattern):
    stream = build_dataset("webdataset", root=pattern)
    stream.configure(batch_size=12, rank=0, world=1, workers=2, seed=0)
    first, second = _epoch(stream, 0), _epoch(stream, 1)
    assert len(first) == 16 and sorted(sum(first, [])) == list(range(SHARDS * PER_SHARD))
    assert sorted(sum(second, [])) == list(range(SHARDS * PER_SHARD)) and first != second
    for skip in (3, 4):  # resumed after an odd and an even number of batches of the epoch
        assert _epoch(stream, 1, skip) == second[skip:]


def test_readers_that_augment_give_a_resumed_epoch_the_views_of_an_uninterrupted_one(pattern):
    from sslkit.augment import TwoViewAugment
    from sslkit.config import AugmentConfig

    stream = build_dataset("webdataset", root=pattern)
    stream.configure(batch_size=12, rank=0, world=1, workers=2, seed=0)
    stream.augment = TwoViewAugment(AugmentConfig(image_size=8), 3, (0.5,) * 3, (0.2,) * 3)
    loader = shards.StreamLoader(stream, num_workers=2, device=torch.device("cpu"))
    whole = [torch.stack(views.views) for views, _ in loader.epoch(1)]
    assert len(whole) == 16 and whole[0].shape == (2, 12, 3, 8, 8)
    resumed = [torch.stack(views.views) for views, _ in loader.epoch(1, skip=3)]
    assert all(torch.equal(a, b) for a, b in zip(resumed, whole[3:], strict=True))


READER = """
import json, sys
from sslkit.loop.launch import relaunch_cpu_processes
if (code := relaunch_cpu_processes()) is not None:  # accelerate's --cpu launcher alone starts one process
    sys.exit(code)
from accelerate import Accelerator
from sslkit.datasets import shards
from sslkit.datasets import build_dataset
sys.path.insert(0, {tests!r})
from test_shards import indices_of
state = Accelerator()  # as the trainer does, before the loader is built
loader = shards.stream_loader(build_dataset("webdataset", root={pattern!r}), 12, 2, seed=0)
epochs = [[indices_of(images) for images, _ in loader.epoch(epoch)] for epoch in range(2)]
json.dump({{"batches": len(loader), "epochs": epochs}}, open(f"{out}/rank{{state.process_index}}.json", "w"))
"""


@pytest.mark.slow
def test_two_processes_with_two_workers_each_see_every_sample_once_an_epoch(tmp_path, pattern):
    from dist_utils import accelerate_cpu_launcher

    script = tmp_path / "reader.py"
    script.write_text(READER.format(tests=str(ROOT / "tests"), pattern=pattern, out=str(tmp_path)))
    command = [*accelerate_cpu_launcher(), str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["batches"] == ranks[1]["batches"] == 8  # every process takes the same number of steps
    for epoch in range(2):
        seen = [sum(rank["epochs"][epoch], []) for rank in ranks]
        assert len(seen[0]) == len(seen[1]) == 96
        assert sorted(seen[0] + seen[1]) == list(range(SHARDS * PER_SHARD)), epoch
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]  # a new order every epoch
    assert np.unique([len(b) for rank in ranks for e in rank["epochs"] for b in e]).tolist() == [12]


@pytest.mark.slow
def test_pretrain_on_shards_from_the_command_line(tmp_path, pattern):
    """Through ``sslkit-pretrain``'s ``main()`` in this process, its loader workers real processes."""
    from test_pretrain_e2e import assert_one_line_error
    from test_pretrain_e2e import pretrain_here as pretrain

    shards_run = ["data.name=webdataset", "data.num_workers=2", "train.batch_size=24", "train.epochs=2"]
    result = pretrain(tmp_path, "run.name=shards", *shards_run, f"data.root={pattern}")
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "shards" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == list(range(1, 17))  # 192 samples / 24, two epochs
    assert (tmp_path / "shards" / "backbone.safetensors").is_file()
    missing = pretrain(tmp_path, "run.name=missing", *shards_run, f"data.root={tmp_path}/none-{{0..3}}.tar")
    assert_one_line_error(missing, "no shard matches")
    assert not (tmp_path / "missing").exists()


def test_a_corrupt_image_in_a_shard_is_replaced_and_named(tmp_path):
    import webdataset as wds

    with wds.ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=100, verbose=0) as sink:
        for i in range(4):
            buffer = io.BytesIO()
            Image.new("RGB", (5 + i, 4), (i, 0, 7)).save(buffer, "PNG")
            data = buffer.getvalue() if i != 2 else b"\x89PNG truncated"
            sink.write({"__key__": f"{i:06d}", "PNG" if i == 1 else "png": data, "txt": "a caption"})
        sink.write({"__key__": "no-image", "txt": "a sample without an image is not counted"})
    stream = build_dataset("webdataset", root=str(tmp_path / "s-000000.tar"))
    assert len(stream) == 4
    stream.configure(batch_size=4, rank=0, world=1, workers=0, seed=0)
    (images, labels), *rest = list(stream)
    assert not rest and len(images) == 4 and labels.tolist() == [-1] * 4
    assert len(images.corrupt) == 1 and images.corrupt[0].endswith(":000002")
