"""Checkpoints that survive a bad disk: each file's size and SHA-256 are recorded at save; a damaged
checkpoint (truncated, a flipped byte, a file missing) is named and resume takes the one before it;
a disk that fills up during a save stops the run in one line with the previous checkpoint intact.

Real runs (tiny, in this process), real files, and for the full disk a real small filesystem
(a 1 MiB tmpfs, where this machine lets the tests mount one).
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sslkit.config import load_config
from sslkit.errors import UserError
from sslkit.loop import run_directory, train
from sslkit.models.weights import PROGRESS_FILE, list_checkpoints

TINY = ["model.width=4", "model.projector_hidden=32", "model.projector_out=16", "augment.image_size=8"]
TINY += ["train.batch_size=64", "train.threads=1", "eval.linear_epochs=0", "eval.compare_random_init=false"]
TINY += ["eval.compare_raw_pixels=false", "train.knn_every_epochs=0", "optim.warmup_epochs=0", "train.epochs=1"]
FOUR_STEPS = ["train.max_steps=4", "train.checkpoint_every_steps=2"]


def run(tmp_path: Path, name: str, *overrides: str) -> Path:
    train(load_config("quickstart", [f"run.output_dir={tmp_path}", f"run.name={name}", *TINY, *overrides]))
    return tmp_path / name


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run of 4 steps with checkpoints at steps 2 and 4 (copied by each test that damages one)."""
    return run(tmp_path_factory.mktemp("integrity"), "four", *FOUR_STEPS)


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / run_dir.name))


def test_a_checkpoints_weights_file_has_the_mode_of_the_files_beside_it(finished):
    """Accelerate saves model.safetensors through safetensors' save_file, which leaves it 0600."""
    for checkpoint in list_checkpoints(finished):
        progress_mode = (checkpoint / PROGRESS_FILE).stat().st_mode & 0o777
        assert (checkpoint / "model.safetensors").stat().st_mode & 0o777 == progress_mode, checkpoint


def test_every_file_of_a_checkpoint_has_its_size_and_checksum(finished):
    newest = list_checkpoints(finished)[-1]
    recorded = json.loads((newest / run_directory.CHECKSUM_FILE).read_text())
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= recorded.keys()
    assert PROGRESS_FILE not in recorded
    assert recorded["model.safetensors"]["bytes"] == (newest / "model.safetensors").stat().st_size
    assert run_directory.damage(newest) is None


@pytest.mark.parametrize(
    "harm, words",
    [
        ("truncate", ["model.safetensors has", "of its"]),
        ("flip", ["model.safetensors does not match its checksum"]),
        ("remove", ["model.safetensors is missing"]),
    ],
)
def test_a_damaged_checkpoint_is_named_and_the_one_before_it_taken(finished, tmp_path, harm, words):
    run_dir = copy_of(finished, tmp_path)
    older, newest = list_checkpoints(run_dir)
    weights = newest / "model.safetensors"
    data = weights.read_bytes()
    if harm == "truncate":  # a copy cut short
        weights.write_bytes(data[: len(data) // 2])
    elif harm == "flip":  # same size, one bit wrong
        weights.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    else:
        weights.unlink()
    found, notes = run_directory.resolve_resume("auto", run_dir)
    assert found == older
    assert len(notes) == 1 and str(newest) in notes[0] and all(word in notes[0] for word in words), notes
    with pytest.raises(UserError, match="is damaged"):  # named outright, it is not swapped for another
        run_directory.resolve_resume(str(newest), run_dir)


def test_only_damaged_checkpoints_are_one_line_naming_each(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    for step in list_checkpoints(run_dir):
        (step / "optimizer.bin").write_bytes(b"")
    with pytest.raises(UserError) as raised:
        run_directory.resolve_resume("auto", run_dir)
    message = str(raised.value)
    assert "\n" not in message and "no intact checkpoint" in message and "another run.name" in message
    assert "step-00000002 is damaged" in message and "step-00000004 is damaged" in message


def test_a_checkpoint_without_checksums_is_taken_as_it_is(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    newest = list_checkpoints(run_dir)[-1]
    (newest / run_directory.CHECKSUM_FILE).unlink()
    assert run_directory.resolve_resume("auto", run_dir) == (newest, [])


@pytest.mark.slow
def test_resume_auto_past_a_truncated_checkpoint_finishes_with_the_same_weights(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    newest = list_checkpoints(run_dir)[-1]
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # what once stopped resume with a safetensors traceback
    (run_dir / "backbone.safetensors").unlink()
    (run_dir / "results.json").unlink()
    capsys.readouterr()
    run(tmp_path, run_dir.name, *FOUR_STEPS, "run.resume=auto")
    out = capsys.readouterr().out.replace("\n", "")
    assert f"{newest} is damaged" in out and "resumed from" in out and "step 2" in out
    again, before = load_file(run_dir / "backbone.safetensors"), load_file(finished / "backbone.safetensors")
    assert again.keys() == before.keys() and all(torch.equal(again[k], before[k]) for k in again)
    assert run_directory.damage(list_checkpoints(run_dir)[-1]) is None  # step 4 written anew


@pytest.fixture
def small_filesystem(tmp_path):
    """A 1 MiB tmpfs: room for one tiny checkpoint (about 0.64 MB) but not for a second beside it."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        gc.collect()  # the failed write's file handle lives in the frames of the exception the test caught
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


@pytest.mark.slow
def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, small_filesystem):
    run_dir = tmp_path / "full"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(small_filesystem)  # checkpoints on a volume of their own, as on a cluster
    with pytest.raises(UserError) as raised:
        run(tmp_path, "full", *FOUR_STEPS)
    message = str(raised.value)
    assert "\n" not in message and "could not save checkpoint step-00000004" in message, message
    assert "out of space" in message and "a checkpoint takes " in message and "step-00000002 is intact" in message
    assert "run.resume=auto" in message
    assert [p.name for p in small_filesystem.iterdir()] == ["step-00000002"]  # no half-written .tmp-* left
    assert run_directory.damage(small_filesystem / "step-00000002") is None
    assert not (run_dir / "backbone.safetensors").exists()
    del raised


def test_a_resume_keeps_its_global_batch_whatever_the_process_count(finished, tmp_path):
    from sslkit.config import to_dict

    run_dir = copy_of(finished, tmp_path)
    recorded = load_config(run_dir / "config.yaml")
    assert run_directory.check_run_directory(run_dir, "auto", to_dict(recorded)) == []
    for key, value in (("train.batch_size", 128), ("train.grad_accum_steps", 2)):
        changed = load_config(run_dir / "config.yaml", [f"{key}={value}"])
        with pytest.raises(UserError, match=f"{key}=.* but this command sets {key}={value}"):
            run_directory.check_run_directory(run_dir, "auto", to_dict(changed))
