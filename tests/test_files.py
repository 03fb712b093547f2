"""Files written whole or not at all: a finished write replaces the file, a failed one leaves the old file whole and
no temporary behind, a killed one leaves the old file whole too, and folders replace folders."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sslkit.files import put_in_place, temporary_path, written_whole


def test_a_finished_write_replaces_the_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "record.json"
    target.write_text('{"old": true}')
    with written_whole(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_text('{"new": true}')
        assert json.loads(target.read_text()) == {"old": True}  # not yet: only when the block ends
    assert json.loads(target.read_text()) == {"new": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_failure_in_the_middle_leaves_the_old_file_whole_and_no_temporary(tmp_path):
    target = tmp_path / "record.csv"
    target.write_text("a,b\n1,2\n")
    with pytest.raises(RuntimeError, match="half way"):
        with written_whole(target) as tmp, open(tmp, "w") as f:
            f.write("a,b\n3,")
            f.flush()
            raise RuntimeError("half way")
    assert target.read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.csv"]


def test_a_failed_first_write_leaves_no_file_at_all(tmp_path):
    with pytest.raises(ValueError):
        with written_whole(tmp_path / "new.npz") as tmp:
            tmp.write_bytes(b"partial")
            raise ValueError
    assert list(tmp_path.iterdir()) == []


def test_a_killed_write_leaves_the_old_file_and_the_next_write_clears_its_temporary(tmp_path):
    target = tmp_path / "meta.json"
    target.write_text('{"rows": 1}')
    script = (
        "import os, sys\n"
        "from sslkit.files import written_whole\n"
        "with written_whole(sys.argv[1]) as tmp, open(tmp, 'w') as f:\n"
        "    f.write('{\"rows\": 2')\n"
        "    f.flush()\n"
        "    os._exit(9)\n"  # as SIGKILL would: no exception, no clean-up
    )
    assert subprocess.run([sys.executable, "-c", script, str(target)], timeout=120).returncode == 9
    assert target.read_text() == '{"rows": 1}' and temporary_path(target).exists()
    with written_whole(target) as tmp:
        assert not tmp.exists()  # the killed write's half file is gone before this one starts
        tmp.write_text('{"rows": 3}')
    assert target.read_text() == '{"rows": 3}' and sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]


def test_a_folder_replaces_a_folder_and_a_file(tmp_path):
    for old in ("folder", "file"):
        target = tmp_path / f"model-{old}"
        if old == "folder":
            (target / "stale").mkdir(parents=True)
            (target / "stale" / "weights.bin").write_bytes(b"old")
        else:
            target.write_bytes(b"old")
        with written_whole(target) as tmp:
            tmp.mkdir()
            (tmp / "config.json").write_text("{}")
        assert sorted(p.name for p in target.iterdir()) == ["config.json"], old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-file", "model-folder"]


def test_put_in_place_renames_a_finished_folder_over_the_same_name(tmp_path):
    final, written = tmp_path / "step-00000005", tmp_path / ".tmp-step-00000005"
    for folder, content in ((final, "first"), (written, "second")):
        folder.mkdir()
        (folder / "progress.json").write_text(content)
    put_in_place(written, final)
    assert (final / "progress.json").read_text() == "second" and not written.exists()
