"""sslkit-embed end to end, in real processes: two processes write the file one process writes, and a run
stopped by ``kill -9`` or by a disk that fills up continues to the same file when the command is run again (the
runs that are not stopped go through the command's main() in the test's process)."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dist_utils import run_as_ranks
from test_embed import TINY

from sslkit.cli.embed import main as embed_main
from sslkit.config import load_config
from sslkit.embeddings import embed, read_embeddings
from sslkit.loop import train

FASHION = ["--data", "fashion_mnist", "--split", "train", "--batch-size", "16"]  # 60,000 rows in 235 chunks


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    train(load_config("quickstart", [f"run.output_dir={out}", "run.name=digits", *TINY]))
    return out / "digits"


@pytest.fixture(scope="module")
def fashion(run):
    """The Fashion-MNIST training images embedded in this process, all at once."""
    return embed(run, data="fashion_mnist", split="train").numpy()


def env() -> dict:
    e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    e.pop("CUDA_VISIBLE_DEVICES", None)
    return e


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "sslkit.cli.embed", *args]


def embed_command(cwd: Path, *args: str, processes: int = 1) -> subprocess.CompletedProcess:
    """The command in ``processes`` real processes, or in one through its main() in this process (the runs that
    are killed, or meet a full disk, are processes of their own: :func:`start_and_wait_for_a_chunk`)."""
    if processes > 1:
        return run_as_ranks(command(*args), env=env(), cwd=cwd, world=processes)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = embed_main(list(args))
    return subprocess.CompletedProcess(args, status, stdout.getvalue(), stderr.getvalue())


def rows_done(folder: Path) -> int:
    try:
        return json.loads((folder / "meta.json").read_text())["rows_done"]
    except (OSError, ValueError):  # not written yet
        return 0


def start_and_wait_for_a_chunk(cwd: Path, out: Path, *args: str) -> subprocess.Popen:
    """The command started in the background, returned once its first chunk is recorded in meta.json."""
    process = subprocess.Popen(
        command(*args, "--out", str(out)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(),
        cwd=cwd,
    )  # fmt: skip
    deadline = time.time() + 180
    while rows_done(out) == 0:
        assert process.poll() is None, f"ended before its first chunk: {process.stderr.read()[-2000:]}"
        assert time.time() < deadline, "no chunk recorded in 180 s"
        time.sleep(0.01)
    return process


@pytest.mark.slow
def test_two_processes_write_the_file_one_process_writes(run, tmp_path):
    common = [str(run), "--split", "test", "--batch-size", "8"]  # 360 rows in 3 chunks: the second round has one
    one = embed_command(tmp_path, *common, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    two = embed_command(tmp_path, *common, "--out", str(tmp_path / "two"), processes=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("written to") == 1  # said once, by the main process
    first, second = read_embeddings(tmp_path / "one"), read_embeddings(tmp_path / "two")
    np.testing.assert_allclose(second.vectors, first.vectors, atol=1e-6)
    assert second.items == first.items and np.array_equal(second.labels, first.labels)
    assert second.meta["chunks_done"] == [0, 1, 2]


@pytest.mark.slow
def test_kill_9_then_the_same_command_finishes_the_same_file(run, fashion, tmp_path):
    out = tmp_path / "e"
    process = start_and_wait_for_a_chunk(tmp_path, out, str(run), *FASHION)
    process.send_signal(signal.SIGKILL)
    process.wait()
    meta = json.loads((out / "meta.json").read_text())
    assert not meta["complete"] and 0 < meta["rows_done"] < 60000, meta["rows_done"]
    resumed = embed_command(tmp_path, str(run), *FASHION, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{meta['rows_done']} rows were there already" in resumed.stdout
    np.testing.assert_allclose(read_embeddings(out).vectors, fashion, atol=1e-6)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 12 MiB tmpfs: room for the 7.7 MB of embeddings and 1 MB of items.csv, where this machine lets tests
    mount one."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        gc.collect()
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until the disk is full (ENOSPC)."""
    filler = folder / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


@pytest.mark.slow
def test_a_disk_that_fills_during_the_run_is_one_line_and_the_same_command_finishes(
    run, fashion, tmp_path, small_filesystem
):
    out = small_filesystem / "e"
    process = start_and_wait_for_a_chunk(tmp_path, out, str(run), *FASHION)
    filler = fill(small_filesystem)
    process.wait(timeout=180)
    lines = [line for line in process.stderr.read().splitlines() if line.strip()]
    assert process.returncode == 2 and len(lines) == 1, lines
    assert "No space left on device" in lines[0] and "free some space and run the same command again" in lines[0]
    meta = json.loads((out / "meta.json").read_text())
    assert not meta["complete"] and 0 < meta["rows_done"] < 60000
    filler.unlink()
    resumed = embed_command(tmp_path, str(run), *FASHION, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    np.testing.assert_allclose(read_embeddings(out).vectors, fashion, atol=1e-6)
